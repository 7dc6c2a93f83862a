"""A real GRPO run of a few steps: tiny model, SQLite store, a third-party plugin domain."""
import json
import sys
import textwrap

import pytest
import torch

from curriculum.store import StatsStore
from domains.registry import available, load
from trainer.config import validate_config
from quick_settings import quick
from trainer.recipe.grpo import GRPORecipe
from trainer.update.losses import group_advantages

PLUGIN = '''
"""A throwaway third-party domain: the reward is the share of distinct digits in the completion,
so even an untrained model gets graded, varied rewards (and GRPO a non-zero gradient)."""
import random
from domains import Domain, Status, Task, VerifyResult, user_prompt


class DigitVariety(Domain):
    name = "digit_variety"
    levels = (1, 2)

    def sample(self, level, n, rng):
        return [Task(self.name, level, user_prompt(f"digits{rng.randint(0, 10**6)}"), {}) for _ in range(n)]

    def verify(self, task, completion):
        share = len(set(completion) & set("0123456789")) / 10
        return VerifyResult(share, share == 1.0, Status.OK if share == 1.0 else Status.WRONG)


DOMAIN = DigitVariety()
'''


@pytest.fixture(scope="module")
def plugin_package(tmp_path_factory):
    """An installed-looking distribution outside the source tree, registering one entry point."""
    root = tmp_path_factory.mktemp("site")
    (root / "palestra_demo_plugin.py").write_text(textwrap.dedent(PLUGIN))
    dist = root / "palestra_demo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: palestra-demo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[palestra.domains]\ndigit_variety = palestra_demo_plugin:DOMAIN\n")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


ON_CPU = {"device": "cpu"}  # the thread-count tests are about the CPU, also where a GPU is visible


def tiny_config(tmp_path, **overrides):
    raw = {
        "name": "e2e", "seed": 3, "output_dir": str(tmp_path / "run"),
        "model": {"type": "tiny", "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1,
                                            "intermediate_size": 64}},
        "domains": ["digit_variety", "arithmetic"],
        "policy": {"type": "learnability"}, "difficulty": {"type": "threshold"},
        "trainer": {"steps": 3, "prompts_per_step": 4, "group_size": 4, "lr": 1e-2, "max_new_tokens": 8,
                    "rollout_batch_size": 8, "micro_batch_size": 8, "table_every": 1},
        "verifier": {"workers": 1}, "sft": {"steps": 2, "batch_size": 8}, "eval": {"tasks_per_level": 2},
    }
    for key, value in overrides.items():
        raw.setdefault(key, {}).update(value) if isinstance(value, dict) else raw.__setitem__(key, value)
    return validate_config(quick(raw))


def test_plugin_is_discovered_through_entry_points(plugin_package):
    assert "digit_variety" in available()
    assert load("digit_variety").levels == (1, 2)


def test_grpo_run_end_to_end(tmp_path, plugin_package):
    config = tiny_config(tmp_path)
    recipe = GRPORecipe(config)
    try:
        recipe.setup()
        # parameters after the SFT warm start are compared with those after GRPO
        from trainer.recipe.sft import warm_start
        warm_start(recipe.model, recipe.tokenizer, recipe.domains, config.sft, draw=recipe.curriculum.draw,
                   seed=config.seed, log=lambda *a: None)
        before = {k: v.detach().clone() for k, v in recipe.model.named_parameters()}
        metrics = [recipe.train_step(step) for step in range(1, config.trainer.steps + 1)]
        changed = [k for k, v in recipe.model.named_parameters() if not torch.equal(v, before[k])]
    finally:
        recipe.cleanup()

    assert changed, "GRPO steps left every parameter unchanged"
    assert all("loss" in m for m in metrics)
    assert any(m["grad_norm"] > 0 for m in metrics)  # a step of only unsolved arithmetic has none
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [run] = store.runs()
        assert run["status"] == "finished"
        # exactly steps x prompts x group size result rows, none missing or doubled
        assert store.count_results(run["id"]) == 3 * 4 * 4
        per_step = {s: len(store.results(run["id"], step=s)) for s in (1, 2, 3)}
        assert per_step == {1: 16, 2: 16, 3: 16}
        assert {r["domain"] for r in store.results(run["id"])} <= {"digit_variety", "arithmetic"}
    logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    train = [r for r in logged if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all("domain/digit_variety/weight" in r for r in train)


def test_main_entry_runs_and_reports_heldout(tmp_path, plugin_package):
    from trainer.app import run

    summary = run(tiny_config(tmp_path, trainer={"steps": 2, "beta": 0.04}))
    assert set(summary["before"]) >= {"eval/digit_variety", "eval/arithmetic", "eval/macro"}
    assert 0.0 <= summary["after"]["eval/macro"] <= 1.0
    low, high = summary["macro_gain_ci95"]  # paired bootstrap over the same held-out tasks
    assert low <= summary["macro_gain"] + 1e-9 and summary["macro_gain"] - 1e-9 <= high
    assert (tmp_path / "run" / "checkpoints").exists()
    assert (tmp_path / "run" / "sft-model" / "config.json").exists()  # the KL anchor (beta > 0)
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    # the warm-started model is a model folder of its own (model=hf model.name_or_path=<run>/sft-model)
    from trainer.models.loading import load_tokenizer

    own = load_tokenizer(str(tmp_path / "run" / "sft-model"), tiny=False)
    original = load_tokenizer(str(tmp_path / "run" / "tiny-model"), tiny=True)
    assert own("12+7=")["input_ids"] == original("12+7=")["input_ids"] != []


def test_grpo_steps_with_a_tool_domain(tmp_path):
    config = tiny_config(tmp_path, domains=["tool_calculator", "arithmetic"], policy={"type": "uniform"},
                         trainer={"steps": 2, "max_episode_tokens": 120}, sft={"steps": 1})
    recipe = GRPORecipe(config)
    try:
        recipe.setup()
        metrics = [recipe.train_step(step) for step in (1, 2)]
    finally:
        recipe.cleanup()
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [run] = store.runs()
        rows = store.results(run["id"])
    assert len(rows) == 2 * 4 * 4
    tool_rows = [r for r in rows if r["domain"] == "tool_calculator"]
    assert tool_rows and all(r["completion"].startswith("[") for r in tool_rows)  # JSON transcripts
    assert any("domain/tool_calculator/turns" in m for m in metrics)


@pytest.mark.parametrize("refill_from", ["plan", "dropped"])
def test_dynamic_sampling_stores_every_group_with_the_advantages_it_trained_on(tmp_path, plugin_package, refill_from):
    # the untrained model fails every arithmetic task, so those groups have no variance: they are
    # dropped, refilled (and fail again); the digit groups, graded, are kept
    config = tiny_config(tmp_path, trainer={"steps": 2, "dynamic_sampling": True, "max_refill_rounds": 1,
                                            "refill_from": refill_from})
    recipe = GRPORecipe(config)
    try:
        recipe.setup()
        for step in (1, 2):
            recipe.train_step(step)
    finally:
        recipe.cleanup()
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [run] = store.runs()
        rows = store.results(run["id"])
    groups: dict[tuple[int, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["step"], row["group_index"]), []).append(row)
    trained = 0
    for (step, _), members in groups.items():
        rewards = torch.tensor([[m["reward"] for m in members]])
        stored = [m["advantage"] for m in members]
        if float(rewards.max() - rewards.min()) < 1e-9:
            assert stored == [0.0] * len(members)  # a discarded zero-variance group trains on nothing
        elif any(stored):
            assert stored == pytest.approx(group_advantages(rewards)[0].tolist(), abs=1e-5)
            trained += 1
    assert trained > 0
    assert len(rows) > 2 * 4 * 4  # refills are recorded too
    if refill_from == "dropped":  # a refill redraws the (domain, level) of a group left out
        for step in (1, 2):
            first = {k: m for k, m in groups.items() if k[0] == step and k[1] < 4}
            left_out = {(m[0]["domain"], m[0]["level"]) for m in first.values()
                        if len({r["reward"] for r in m}) == 1}
            refills = {(m[0]["domain"], m[0]["level"]) for k, m in groups.items() if k[0] == step and k[1] >= 4}
            assert refills and refills <= left_out


def test_a_domain_without_held_out_tasks_trains_and_is_left_out_of_the_stored_evaluation(tmp_path):
    from trainer.app import run
    from trainer.runtime import resume_hint

    rows = tmp_path / "sums.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20)))
    config = tiny_config(tmp_path, domains=["arithmetic", "math_dataset"], trainer={"steps": 1},
                         domain_options={"math_dataset": {"path": str(rows), "heldout_fraction": 0.0}})
    summary = run(config)
    assert "eval/math_dataset" not in summary["before"] and "eval/arithmetic" in summary["before"]
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [stored_run] = store.runs()
        stored = [m for m in store.metrics(stored_run["id"]) if "heldout/macro" in m]
    assert [m["step"] for m in stored] == [0, 1] and all(len(m["heldout/domains"]) == 1 for m in stored)
    assert resume_hint(None) == "resume from the last checkpoint saved (none was saved now)"


def test_a_verifier_pool_that_cannot_start_stops_the_run_before_any_step(tmp_path, monkeypatch):
    from pathlib import Path

    from domains.verify.pool import VerifierPoolBroken
    from trainer.app import run

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # spawned workers try pool_helpers from here
    config = tiny_config(tmp_path, domains=["pool_helpers:UNSTARTABLE"], sft={"steps": 0})
    with pytest.raises(VerifierPoolBroken, match="workers keep dying at start-up"):
        run(config)  # the evaluation before GRPO is the first verification
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [stored] = store.runs()
        assert stored["status"] == "failed" and store.count_results(stored["id"]) == 0


@pytest.mark.parametrize("phase_threads", [None, 3])
def test_the_warm_start_and_the_update_run_on_their_own_thread_count_and_sampling_gets_its_own_back(
        tmp_path, monkeypatch, phase_threads):
    import os

    import trainer.recipe.grpo

    seen = {}
    from trainer.sampling.collect import RolloutCollector
    from trainer.update.step import PolicyUpdate

    real_warm_start = trainer.recipe.grpo.warm_start
    real_update, real_collect = PolicyUpdate.__call__, RolloutCollector.collect

    def recording_warm_start(*args, **kwargs):
        seen["sft"] = torch.get_num_threads()
        return real_warm_start(*args, **kwargs)

    def recording_update(self, *args, **kwargs):
        seen["update"] = torch.get_num_threads()
        return real_update(self, *args, **kwargs)

    def recording_collect(self, *args, **kwargs):
        seen.setdefault("sample", set()).add(torch.get_num_threads())
        return real_collect(self, *args, **kwargs)

    monkeypatch.setattr(trainer.recipe.grpo, "warm_start", recording_warm_start)
    monkeypatch.setattr(PolicyUpdate, "__call__", recording_update)
    monkeypatch.setattr(RolloutCollector, "collect", recording_collect)
    config = tiny_config(tmp_path, domains=["arithmetic"], model=ON_CPU,
                         trainer={"steps": 2, "cpu_threads": 1, "update_cpu_threads": phase_threads},
                         sft={"steps": 1, "cpu_threads": phase_threads})
    recipe = GRPORecipe(config)
    try:
        recipe.setup()
        recipe.train()
        seen["after"] = torch.get_num_threads()
    finally:
        recipe.cleanup()
    cores = len(os.sched_getaffinity(0))
    threads = cores if phase_threads is None else min(phase_threads, cores)  # never more than the cores
    assert seen == {"sft": threads, "update": threads, "sample": {1}, "after": 1}


def test_the_sampling_threads_come_back_when_an_update_fails(tmp_path, monkeypatch):
    def failing_update(self, *args, **kwargs):
        raise RuntimeError("update failed")

    from trainer.update.step import PolicyUpdate

    monkeypatch.setattr(PolicyUpdate, "__call__", failing_update)
    recipe = GRPORecipe(tiny_config(tmp_path, domains=["arithmetic"], model=ON_CPU,
                                    trainer={"steps": 1, "cpu_threads": 1}, sft={"steps": 0}))
    try:
        recipe.setup()
        with pytest.raises(RuntimeError, match="update failed"):
            recipe.train_step(1)
        assert torch.get_num_threads() == 1
    finally:
        recipe.cleanup()


def test_sampling_threads_never_exceed_this_ranks_share_of_the_cores(tmp_path, monkeypatch):
    import os

    # as torchrun would say it: one rank per core on this machine, so each rank's share is one core
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(len(os.sched_getaffinity(0))))
    recipe = GRPORecipe(tiny_config(tmp_path, domains=["arithmetic"], model=ON_CPU, trainer={"steps": 1, "cpu_threads": 4}))
    try:
        recipe.setup()
        assert torch.get_num_threads() == 1
    finally:
        recipe.cleanup()
        torch.set_num_threads(1)


def test_a_pool_broken_during_the_warm_start_ends_the_run_at_the_next_sft_log(tmp_path):
    from domains.verify.pool import VerifierPoolBroken

    recipe = GRPORecipe(tiny_config(tmp_path, domains=["arithmetic"], sft={"steps": 200}))
    try:
        recipe.setup()
        recipe.pool.broken = "verifier workers keep dying at start-up"  # as the dispatcher marks it
        with pytest.raises(VerifierPoolBroken, match="keep dying"):
            recipe.train()
    finally:
        recipe.cleanup()
    logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert not [r for r in logged if r["phase"] == "sft"]  # stopped at step 25 of 200, before its log line


def test_a_pool_broken_at_the_final_evaluation_keeps_the_trained_steps_in_a_checkpoint(tmp_path):
    from domains.verify.pool import VerifierPoolBroken

    recipe = GRPORecipe(tiny_config(tmp_path, domains=["arithmetic"], trainer={"steps": 2},
                                    checkpoint={"every": 0}))
    try:
        recipe.setup()
        train_step = recipe.train_step

        def step_then_break(step):
            metrics = train_step(step)
            if step == 2:
                recipe.pool.broken = "verifier workers keep dying at start-up"
            return metrics

        recipe.train_step = step_then_break
        with pytest.raises(VerifierPoolBroken, match=r"resume with resume=.*step-0000002"):
            recipe.train()
    finally:
        recipe.cleanup()
    assert (tmp_path / "run" / "checkpoints" / "step-0000002" / "trainer_state.pt").exists()


def test_an_oversampled_round_trains_the_planned_share_first():
    import random
    from types import SimpleNamespace

    from domains.api import Task
    from trainer.sampling.batch import StepBatch, planned_first

    def group(domain, rewards):
        return Task(domain=domain, level=1, prompt="q", payload={}), rewards

    # twice the plan {a: 2, b: 1, c: 1}: three varied a groups, two varied b, no varied c
    groups = [group("a", [0, 1]), group("a", [1, 1]), group("a", [0, 1]), group("a", [1, 0]),
              group("b", [0, 1]), group("b", [1, 0]), group("c", [0, 0]), group("c", [1, 1])]
    batch = StepBatch(tasks=[t for t, _ in groups], group_size=2, rollout=None, texts=[],
                      verdicts=[SimpleNamespace(result=SimpleNamespace(reward=r)) for _, rs in groups for r in rs])
    counts = {("a", 1): 2, ("b", 1): 1, ("c", 1): 1}
    kept = planned_first(batch, counts, 4, random.Random(0))
    assert len(kept) == 4 and {0, 2, 4} <= set(kept)  # a's two and b's one as planned, then one of the rest
    assert set(kept) - {0, 2, 4} <= {3, 5}
    # when the varied groups fit the step, all of them train, as without oversampling
    assert planned_first(batch, counts, 8, random.Random(0)) == [0, 2, 3, 4, 5]


def test_an_oversampled_first_round_trains_at_most_the_planned_number_of_groups(tmp_path, plugin_package):
    config = tiny_config(tmp_path, domains=["digit_variety", "arithmetic", "tool_calculator"],
                         policy={"type": "uniform"}, sft={"steps": 1},
                         trainer={"steps": 1, "max_episode_tokens": 60, "dynamic_sampling": True, "oversample": 2,
                                  "max_refill_rounds": 0, "rollout_batch_size": 32})
    recipe = GRPORecipe(config)
    try:
        recipe.setup()
        recipe.train_step(1)
    finally:
        recipe.cleanup()
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [run] = store.runs()
        rows = store.results(run["id"], step=1)
    assert len(rows) == 2 * 4 * 4  # twice the plan's 4 prompts x 4 completions, in one round
    assert {r["domain"] for r in rows} == {"digit_variety", "arithmetic", "tool_calculator"}
    trained = {r["group_index"] for r in rows if r["advantage"] != 0.0}
    assert 0 < len(trained) <= 4  # the step trains on at most its planned number of groups


def test_the_closing_evaluation_runs_without_the_optimizer_moments_and_the_final_checkpoint_keeps_them(
        tmp_path, plugin_package):
    import copy

    from trainer.recipe import checkpoint
    from trainer.recipe.evaluate import summarise

    recipe = GRPORecipe(tiny_config(tmp_path, trainer={"steps": 2}, checkpoint={"every": 0}))
    moments_during_evaluations, last_step = [], {}
    try:
        recipe.setup()
        train_step, evaluate = recipe.train_step, recipe.heldout.run

        def step_and_keep(step):
            metrics = train_step(step)
            last_step.update(copy.deepcopy(recipe.optimizer.state_dict()))
            return metrics

        def evaluate_and_count(*args, **kwargs):
            moments_during_evaluations.append(len(recipe.optimizer.state))
            return evaluate(*args, **kwargs)

        recipe.train_step, recipe.heldout.run = step_and_keep, evaluate_and_count
        recipe.train()
        in_memory = recipe.optimizer.state_dict()
        again = evaluate(recipe.model, recipe.tokenizer, recipe.pool, recipe._sampler())  # the moments back
    finally:
        recipe.cleanup()
    assert moments_during_evaluations == [0, 0]  # before GRPO none exist yet; after it they are on disk
    assert summarise(recipe.heldout.hits["after"]) == again  # released or not, the same held-out answers
    saved = checkpoint.optimizer_state(tmp_path / "run" / "checkpoints" / "step-0000002")
    assert len(last_step["state"]) == len(recipe.optimizer.param_groups[0]["params"]) > 0
    for found in (in_memory, saved):  # back in memory after the evaluation, and in the final checkpoint
        assert found["state"].keys() == last_step["state"].keys()
        for key, moments in last_step["state"].items():
            for name, value in moments.items():
                assert torch.equal(found["state"][key][name], value), (key, name)
