"""Data-parallel training: N ranks make exactly the update one process makes.

Two levels. In-process, a recording stand-in for the process group lets one process play every
rank of a step, so the loss normalisation is checked for each aggregation mode in seconds: the
ranks' gradients and statistics must add up to the one-process ones. End to end, ``torchrun
--nproc_per_node 2`` (gloo) trains two steps and is compared with one process on the same plan:
generation batches here are one task each (rollout_batch_size = group_size) and their sampling
seeds depend on where the batch sits in the step, never on the rank, so both runs sample the very
same completions — the store rows must be equal and the weights equal up to float rounding.
"""
import copy
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from curriculum.store import StatsStore
from trainer.app import CONF_DIR, run, to_config
from trainer.config import ConfigError, validate_config
from trainer.distributed import World
import trainer.recipe.grpo
from trainer.recipe.grpo import GRPORecipe
from trainer.sampling.batch import generation_chunks
from trainer.sampling.episodes import by_rollout
from trainer.update.losses import group_advantages
from trainer.update.step import PolicyUpdate
from quick_settings import quick

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # spawned verifier workers import distributed_helpers from here

# on the CPU also where a GPU is visible: the gradient sums are compared at fp32 tolerances
TINY = {"type": "tiny", "device": "cpu",
        "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}}


# -- shares -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, size", [(5, 2), (4, 2), (3, 8), (16, 3)])
def test_shares_are_contiguous_balanced_and_cover_everything(n, size):
    shares = [World(rank=r, size=size).share(n) for r in range(size)]
    assert shares[0][0] == 0 and shares[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))  # contiguous, in rank order
    assert max(hi - lo for lo, hi in shares) - min(hi - lo for lo, hi in shares) <= 1


def test_a_rank_without_a_gpu_of_its_own_says_so_in_one_line():
    world = World(rank=3, size=4, local_rank=torch.cuda.device_count())  # one rank more than there are GPUs
    with pytest.raises(ConfigError, match=r"rank 3 needs GPU \d+ but \d+ GPU\(s\) are visible.*model.device=cpu"):
        world.place(torch.device("cuda"))
    assert world.place(torch.device("cpu")) == torch.device("cpu")


def test_generation_chunks_know_where_they_sit_in_the_step():
    from domains.api import Task
    from domains.registry import load_all

    domains = load_all(["arithmetic", "fractions", "code_lists", "tool_lookup"])
    tasks = [Task(d, 1, p, {}) for d, p in [("tool_lookup", "p0"), ("arithmetic", "p1"), ("code_lists", "p2"),
                                             ("arithmetic", "p3"), ("fractions", "p4"), ("arithmetic", "p5")]]
    tasks = [t for kind in by_rollout(tasks, domains) for t in kind]  # as the trainer orders them
    chunks = generation_chunks(tasks, size=2, domains=domains)
    # the math domains sample together, then code (its own budget), then the tool episodes
    assert [(first, [t.prompt for t in chunk]) for first, chunk in chunks] == [
        (0, ["p1", "p3"]), (2, ["p4", "p5"]), (4, ["p2"]), (5, ["p0"])]


# -- loss normalisation, one process playing every rank ---------------------------------------------
@dataclass(frozen=True)
class RecordingWorld(World):
    """Rank ``rank`` of ``size``, without a process group: the gradient sum records this rank's
    gradients instead, and statistics stay this rank's own."""

    grads: list = field(default_factory=list)

    def sum_gradients(self, model):
        self.grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})

    def sum_floats(self, values, keys):
        return {k: values.get(k, 0.0) for k in keys}


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    """A recipe and one step's verified batch: 5 prompts x 4 completions of mixed lengths."""
    raw = {
        "name": "dp", "seed": 7, "output_dir": str(tmp_path_factory.mktemp("dp") / "run"), "model": TINY,
        "domains": ["distributed_helpers:DIGITS", "arithmetic"],
        "policy": {"type": "uniform"}, "difficulty": {"type": "threshold"},
        "trainer": {"steps": 1, "prompts_per_step": 5, "group_size": 4,
                    "sampling": {"max_new_tokens": 8, "rollout_batch_size": 8},
                    "optim": {"lr": 1e-2, "micro_batch_size": 3}, "loss": {"beta": 0.04}},
        "verifier": {"workers": 1}, "sft": {"steps": 0}, "eval": {"tasks_per_level": 1},
    }
    recipe = GRPORecipe(validate_config(quick(raw)))
    recipe.setup()
    try:
        rollouts = recipe.collector.collect_step(recipe.curriculum.plan(1), recipe.curriculum, defaultdict(float))
        yield recipe, rollouts.batch
    finally:
        recipe.cleanup()


def _as_rank(recipe, world):
    recipe.world = recipe.update.world = world


def _update_as(recipe, world, batch, advantages, weights):
    _as_rank(recipe, world)
    recipe.model.load_state_dict(weights)  # every rank starts from the same weights
    stats = recipe.update(batch.rollout, advantages, recipe._blend(1, batch.tasks))
    return (world.grads[0] if world.grads else {}), stats


@pytest.mark.parametrize("aggregation, sft_coef", [("token_mean", 0.0), ("seq_mean", 0.0), ("constant", 0.0),
                                                   ("token_mean", 0.5)])
@pytest.mark.parametrize("size", [2, 8])  # 8 ranks for 5 prompts: some ranks train on nothing
def test_rank_gradients_add_up_to_the_one_process_gradient(one_step, aggregation, sft_coef, size):
    recipe, batch = one_step
    recipe.cfg.trainer.loss.aggregation, recipe.cfg.trainer.loss.sft_coef = aggregation, sft_coef
    advantages = group_advantages(batch.rewards, "batch").flatten()
    assert advantages.abs().sum() > 0  # graded rewards: there is a gradient to compare
    weights = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    try:
        whole, whole_stats = _update_as(recipe, RecordingWorld(0, 1), batch, advantages, weights)
        parts = [_update_as(recipe, RecordingWorld(r, size), batch, advantages, weights) for r in range(size)]
    finally:
        _as_rank(recipe, World())
        recipe.model.load_state_dict(weights)
    summed = {k: sum(g[k] for g, _ in parts if k in g) for k in whole}
    assert set().union(*(g for g, _ in parts)) == set(whole)
    torch.testing.assert_close(summed, whole, rtol=1e-5, atol=1e-7)
    for key in ("loss", "policy_loss", "kl", "entropy", "clip_low_frac", "clip_high_frac") + (("sft_loss",) if sft_coef else ()):
        assert sum(s[key] for _, s in parts) == pytest.approx(whole_stats[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "constant"])
def test_rows_with_zero_advantage_skip_the_update_without_changing_its_gradient(one_step, aggregation):
    """With beta = 0 a zero-advantage row adds nothing to the gradient, so leaving it out of the
    update (skip_zero_advantage) must give the same gradient, in one process and summed over ranks."""
    recipe, batch = one_step
    t = recipe.cfg.trainer
    t.loss.aggregation, t.loss.sft_coef, t.loss.beta = aggregation, 0.0, 0.0
    advantages = group_advantages(batch.rewards, "batch")
    advantages[::2] = 0.0  # every other group agrees on its rewards
    advantages = advantages.flatten()
    weights = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    try:
        t.loss.skip_zero_advantage = False
        every_row, _ = _update_as(recipe, RecordingWorld(0, 1), batch, advantages, weights)
        t.loss.skip_zero_advantage = True
        skipped, stats = _update_as(recipe, RecordingWorld(0, 1), batch, advantages, weights)
        parts = [_update_as(recipe, RecordingWorld(r, 2), batch, advantages, weights) for r in range(2)]
    finally:
        t.loss.skip_zero_advantage, t.loss.beta = False, 0.04
        _as_rank(recipe, World())
        recipe.model.load_state_dict(weights)
    assert any(g.abs().sum() > 0 for g in every_row.values())
    torch.testing.assert_close(skipped, every_row, rtol=1e-5, atol=1e-7)
    summed = {k: sum(g[k] for g, _ in parts if k in g) for k in skipped}
    torch.testing.assert_close(summed, skipped, rtol=1e-5, atol=1e-7)
    for key in ("loss", "policy_loss", "kl", "entropy"):
        assert sum(s[key] for _, s in parts) == pytest.approx(stats[key], rel=1e-5, abs=1e-7), key
    # 3 of the 5 groups zeroed; the other two have graded rewards, so (almost surely) no zero row
    assert stats["trained_row_share"] == pytest.approx(float((advantages != 0).float().mean()))
    assert 0 < stats["trained_row_share"] <= 0.4
    assert stats["entropy"] > 0


def test_a_step_whose_groups_all_agree_trains_on_nothing_when_skipping(one_step):
    recipe, batch = one_step
    recipe.cfg.trainer.loss.skip_zero_advantage, recipe.cfg.trainer.loss.sft_coef = True, 0.0
    weights = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    try:
        grads, stats = _update_as(recipe, RecordingWorld(0, 1), batch, torch.zeros(len(batch.rewards.flatten())), weights)
        after = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    finally:
        recipe.cfg.trainer.loss.skip_zero_advantage = False
        recipe.model.load_state_dict(weights)
    assert grads == {} and stats["loss"] == 0.0 and stats["trained_row_share"] == 0.0
    assert "kl" not in stats and "entropy" not in stats  # nothing measured, so nothing reported
    assert all(torch.equal(after[k], weights[k]) for k in weights)


def test_the_rehearsal_blend_is_a_function_of_seed_and_step_alone(one_step):
    """sft_source=warm_start: the blend's tasks come from a generator seeded by the step, so a
    resumed run blends what the first would have, and drawing them leaves the training stream
    (and so the training tasks) alone. Held-out tasks never enter it."""
    recipe, batch = one_step
    recipe.cfg.trainer.loss.sft_coef, recipe.cfg.trainer.loss.sft_source = 0.5, "warm_start"
    source = recipe.curriculum.inner.tasks
    heldout, seed = source.heldout_ids, recipe.cfg.seed
    try:
        stream = source.rng.getstate()
        blends = {step: [task.id for task in recipe.blend_tasks(step, batch.tasks)] for step in range(1, 9)}
        assert source.rng.getstate() == stream
        slots = {(task.domain, task.level) for step in range(1, 9) for task in recipe.blend_tasks(step, batch.tasks)}
        recipe.cfg.seed = seed + 1
        other_seed = [task.id for task in recipe.blend_tasks(3, batch.tasks)]
        recipe.cfg.seed = seed
        source.heldout_ids = heldout | set(blends[3])  # hold out exactly what step 3 would blend
        redrawn = [task.id for task in recipe.blend_tasks(3, batch.tasks)]
        recipe.cfg.trainer.loss.sft_source = "step"
        own = recipe.blend_tasks(3, batch.tasks)
    finally:
        recipe.cfg.trainer.loss.sft_source, source.heldout_ids, recipe.cfg.seed = "step", heldout, seed
        recipe.cfg.trainer.loss.sft_coef = 0.0
    assert all(len(ids) == len(batch.tasks) for ids in blends.values())
    assert blends[3] != blends[4] and blends[3] != other_seed  # a fresh draw each step and seed
    assert len({domain for domain, _ in slots}) == 2 and len(slots) >= 4  # every domain, several levels
    assert len(redrawn) == len(blends[3]) and not set(redrawn) & set(blends[3])
    assert own == batch.tasks  # sft_source=step: the step's own tasks
    assert recipe.blend_tasks(3, batch.tasks) == []  # sft_coef=0: no blend, no tasks


class _Stop(Exception):
    pass


def test_a_step_trains_the_blend_on_the_rehearsal_tasks(one_step, monkeypatch):
    recipe, _ = one_step
    t = recipe.cfg.trainer
    seen = []

    real_collect, real_blend = recipe.collector.collect_step, trainer.recipe.grpo.blend_for_rank

    def recording_collect(*args):
        rollouts = real_collect(*args)
        seen.append({"batch": rollouts.batch})
        return rollouts

    def recording_blend(tokenizer, domains, tasks, lo, hi):
        seen[-1]["blended"] = tasks
        return real_blend(tokenizer, domains, tasks, lo, hi)

    def recording_update(self, rollout, advantages, blend):
        seen[-1]["blend"] = blend
        raise _Stop  # the step's tasks are known; no need to train

    monkeypatch.setattr(recipe.collector, "collect_step", recording_collect)
    monkeypatch.setattr(trainer.recipe.grpo, "blend_for_rank", recording_blend)
    monkeypatch.setattr(PolicyUpdate, "__call__", recording_update)
    t.loss.sft_coef, t.loss.sft_source = 0.5, "warm_start"
    try:
        with pytest.raises(_Stop):
            recipe.train_step(1)
        batch, blended = seen[0]["batch"], seen[0]["blended"]
        expected = [task.id for task in recipe.blend_tasks(1, batch.tasks)]
        t.loss.sft_coef = 0.0
        with pytest.raises(_Stop):
            recipe.train_step(1)
    finally:
        t.loss.sft_coef, t.loss.sft_source = 0.0, "step"
    assert [task.id for task in blended] == expected != [task.id for task in batch.tasks]
    assert seen[0]["blend"].pairs and seen[0]["blend"].share == 1.0  # one rank: the whole blend
    assert "blended" not in seen[1] and seen[1]["blend"] is None  # no blend, no tasks for it


# -- torchrun end to end --------------------------------------------------------------------------------
OVERRIDES = [
    "seed=5", "trainer.steps=2", "trainer.prompts_per_step=5", "trainer.group_size=4", "trainer.sampling.max_new_tokens=8",
    "trainer.sampling.rollout_batch_size=4", "trainer.optim.micro_batch_size=6", "trainer.optim.lr=1e-2", "trainer.loss.beta=0.04",
    "trainer.loss.advantage_std=batch", "trainer.loss.aggregation=token_mean", "trainer.system.cpu_threads=1",
    "trainer.system.update_cpu_threads=1", "sft.cpu_threads=1", "verifier.workers=1", "sft.steps=2",
    "sft.batch_size=8", "eval.tasks_per_level=1", "checkpoint.every=1", "domains=[distributed_helpers:DIGITS,arithmetic]",
    "model.tiny.hidden_size=32", "model.tiny.layers=2", "model.tiny.heads=2", "model.tiny.kv_heads=1",
    "model.tiny.intermediate_size=64", "model.device=cpu",  # gloo on the CPU, also where a GPU is visible
    # the rehearsal blend: rank 0 draws it for every rank; tasks drawn on rank 1 from its own copy
    # of the training stream (which only rank 0 advances) would part the weights from one process
    "trainer.loss.sft_coef=0.5", "trainer.loss.sft_source=warm_start",
]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", **extra,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


def _torchrun(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", module, *args]


def _rows(output_dir: Path) -> list[tuple]:
    with StatsStore(f"sqlite:///{output_dir / 'palestra.db'}") as store:
        [run_row] = store.runs()  # rank 0 alone opened the store: one run, not one per rank
        return [(r["step"], r["domain"], r["level"], r["task_id"], r["group_index"], r["reward"],
                 r["completion_hash"], r["advantage"]) for r in store.results(run_row["id"])]


def _weights(output_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "checkpoints" / f"step-{step:07d}" / "model.safetensors")


def test_two_ranks_train_exactly_like_one_process(tmp_path):
    # output_dir is left to Hydra's run folder, which only rank 0 composes and then shares
    launch = _torchrun("trainer.app", f"hydra.run.dir={tmp_path / 'two'}", *OVERRIDES)
    started = time.perf_counter()
    two = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=HERE.parent,
                           env=_env(PALESTRA_DIST_TIMEOUT_S="300"))

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):  # meanwhile, the one-process run
        one_cfg = compose(config_name="config", overrides=[*OVERRIDES, f"output_dir={tmp_path / 'one'}"])
    run(to_config(one_cfg))

    out, _ = two.communicate(timeout=400)
    assert two.returncode == 0, out.decode()[-3000:]
    print(f"torchrun 2 ranks: {time.perf_counter() - started:.1f} s")

    one_rows, two_rows = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    per_step = Counter(row[0] for row in one_rows)
    # each step's 5 planned groups of 4, and (dynamic sampling, as in the main job) the refills
    # drawn for the groups whose rewards all agreed: rank 0 draws those too
    assert set(per_step) == {1, 2} and min(per_step.values()) >= 5 * 4 and len(one_rows) > 2 * 5 * 4
    assert two_rows == one_rows  # same tasks, completions, rewards, groups and advantages
    start = load_file(tmp_path / "one" / "sft-model" / "model.safetensors")
    for step in (1, 2):
        one, two_w = _weights(tmp_path / "one", step), _weights(tmp_path / "two", step)
        # The gradients agree to float rounding (other micro-batches, summed in another order).
        # Adam divides each gradient by its own scale, so on the tiniest gradient elements (key-
        # projection biases here) that rounding shows in the update: measured up to 7e-7, against
        # weights that moved by 6e-3; nearly all elements agree to 1e-8.
        torch.testing.assert_close(two_w, one, rtol=0, atol=1e-5)
    moved = max(float((one[k] - start[k]).abs().max()) for k in one)
    apart = max(float((two_w[k] - one[k]).abs().max()) for k in one)
    print(f"after 2 steps: weights moved up to {moved:.2e}; two ranks vs one process differ by up to {apart:.2e}")
    assert moved > 1e-4  # the comparison is not between two untouched models
    train_lines = [line for line in open(tmp_path / "two" / "metrics.jsonl") if '"phase": "train"' in line]
    assert len(train_lines) == 2  # one writer of metrics


@pytest.mark.slow  # two launches, ~40 s each on a 2-core machine
@pytest.mark.parametrize("failing_rank", [0, 1])
def test_a_failing_rank_ends_the_launch_instead_of_hanging_it(tmp_path, failing_rank):
    started = time.perf_counter()
    done = subprocess.run(_torchrun("distributed_helpers", f"hydra.run.dir={tmp_path}", *OVERRIDES),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=HERE.parent, timeout=400,
                          env=_env(FAIL_RANK=str(failing_rank), PALESTRA_DIST_TIMEOUT_S="150"))
    log = done.stdout.decode()
    assert done.returncode != 0 and f"injected failure on rank {failing_rank}" in log, log[-3000:]
    # the other rank saw its peer go (or torchrun stopped it); it did not sit out the 150 s timeout
    assert time.perf_counter() - started < 140, log[-3000:]


@pytest.mark.parametrize("mu", [1, 2])  # two passes: the old policy's log-probs are taken packed too
def test_the_shared_prefix_update_equals_the_plain_one(one_step, mu):
    # each group's prompt encoded once (trainer/update/shared_prefix.py), groups split across micro-batches
    # of 3 rows, a KL reference: the same gradient and statistics as a row per completion
    recipe, batch = one_step
    t = recipe.cfg.trainer
    advantages = group_advantages(batch.rewards, "batch").flatten()
    weights = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    moments, schedule = copy.deepcopy(recipe.optimizer.state_dict()), recipe.lr_schedule.state_dict()

    def update():  # from the same weights, moments and learning rate each time
        recipe.optimizer.load_state_dict(copy.deepcopy(moments))
        recipe.lr_schedule.load_state_dict(schedule)
        return _update_as(recipe, RecordingWorld(0, 1), batch, advantages, weights)

    try:
        t.optim.mu = mu
        plain, plain_stats = update()
        t.optim.shared_prefix = True
        shared, shared_stats = update()
    finally:
        t.optim.shared_prefix, t.optim.mu = False, 1
        _as_rank(recipe, World())
        recipe.model.load_state_dict(weights)
    assert max(float(g.abs().max()) for g in plain.values()) > 1e-4  # a real gradient is compared
    torch.testing.assert_close(shared, plain, rtol=1e-4, atol=1e-6)
    for key in ("loss", "policy_loss", "kl", "entropy", "clip_low_frac", "clip_high_frac"):
        assert shared_stats[key] == pytest.approx(plain_stats[key], rel=1e-4, abs=1e-6), key


def test_every_log_prob_of_the_update_is_taken_at_the_sampling_temperature(one_step, monkeypatch):
    # the policy's, the old policy's and the reference's log-probs all score softmax(logits / T)
    import trainer.update.step
    from trainer.update.logprobs import sequence_logprobs

    recipe, batch = one_step
    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs.get("temperature", 1.0))
        return sequence_logprobs(*args, **kwargs)

    monkeypatch.setattr(trainer.update.step, "sequence_logprobs", recording)
    t = recipe.cfg.trainer
    weights = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    t.sampling.temperature, t.optim.mu = 0.7, 2  # mu > 1: the old policy's log-probs are taken too
    try:
        recipe.update(batch.rollout, group_advantages(batch.rewards, "batch").flatten(), None)
    finally:
        t.sampling.temperature, t.optim.mu = 1.0, 1
        recipe.model.load_state_dict(weights)
    assert recipe.ref_model is not None and len(seen) >= 3 and set(seen) == {0.7}
