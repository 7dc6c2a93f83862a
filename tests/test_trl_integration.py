"""TRL's GRPOTrainer driven by Palestra's curriculum (``trainer.integrations.trl``).

The first tests call the reward function by hand (no TRL needed): slices of a plan step, a
verifier that crashes, settings that cannot work. The last one is TRL's smoke test with our parts:
real TRL, the real (shrunk) tiny model, a real SQLite file, four steps.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from curriculum.cli import main as palestra_cli
from curriculum.config import FixedDifficultyConfig, UniformConfig
from trainer.integrations.trl import BatchShape, TRLCurriculum, completion_text, trl_batch_shape
from curriculum.store import StatsStore
from domains.api import Task
from domains.verify.pool import verify_guarded
from domains.registry import DomainError
from trainer.update.losses import group_advantages

sys.path.insert(0, str(Path(__file__).parent))  # spawned verifier workers import trl_helpers from here
from trl_helpers import BY_LENGTH, CRASHING  # noqa: E402


def _chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.fixture()
def curriculum(tmp_path):
    """3 prompts x 2 completions per plan step, over a scored and a crashing domain."""
    store = StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}")
    cur = TRLCurriculum({"by_length": BY_LENGTH, "crashing": CRASHING}, BatchShape(3, 2, 4), UniformConfig(),
                        FixedDifficultyConfig(), store, verifier_workers=1, owns_store=True)
    yield cur
    cur.close()


def _as_trl_batch(rows: list[dict], group_size: int) -> dict:
    """What TRL hands a reward function: each row repeated group_size times, columns as lists."""
    repeated = [row for row in rows for _ in range(group_size)]
    columns = {key: [row[key] for row in repeated] for key in repeated[0] if key != "prompt"}
    return {"prompts": [row["prompt"] for row in repeated], **columns}


def _call(cur: TRLCurriculum, batch: dict, lo: int, hi: int) -> list[float]:
    sliced = {key: values[lo:hi] for key, values in batch.items()}
    texts = [f"answer {'x' * k}" for k in range(lo, hi)]  # a different length, so a different reward, per row
    return cur.palestra_reward(completions=[_chat(t) for t in texts], **sliced)


def test_a_step_is_recorded_once_all_its_completions_are_scored_whatever_the_slices(curriculum):
    rows = curriculum.rows()
    step1, step2 = [next(rows) for _ in range(3)], [next(rows) for _ in range(3)]
    assert {r["palestra_step"] for r in step1} == {1} and {r["palestra_step"] for r in step2} == {2}
    assert [r["palestra_group"] for r in step1] == [0, 1, 2]
    batch = _as_trl_batch(step1 + step2, 2)  # 12 completions: 6 of step 1, then 6 of step 2

    rewards = _call(curriculum, batch, 0, 4)  # two thirds of step 1
    assert curriculum.recorded_steps == []
    rewards += _call(curriculum, batch, 4, 9)  # the rest of step 1 and half of step 2
    assert curriculum.recorded_steps == [1]
    rewards += _call(curriculum, batch, 9, 12)
    assert curriculum.recorded_steps == [1, 2]

    # each reward is what the domain's verifier gives; the crashing verifier gives 0
    for k, (domain, reward) in enumerate(zip(batch["domain"], rewards)):
        expected = (len(f"answer {'x' * k}") % 5) / 4 if domain == "by_length" else 0.0
        assert reward == expected
    store, run = curriculum.store, curriculum.run_id
    for step in (1, 2):
        results = store.results(run, step)
        assert len(results) == 6  # 3 prompts x 2 completions, each counted once
        # advantages as Palestra's trainer computes them: per group, from the stored rewards
        by_group: dict[int, list[dict]] = {}
        for r in results:
            by_group.setdefault(r["group_index"], []).append(r)
        for members in by_group.values():
            expected = group_advantages(torch.tensor([[m["reward"] for m in members]]))[0]
            torch.testing.assert_close(torch.tensor([m["advantage"] for m in members]), expected)
    crashed = [r for r in store.results(run) if r["domain"] == "crashing"]
    assert crashed and all(r["status"] == "error" and r["reward"] == 0.0 for r in crashed)
    assert store.metrics(run)[0]["domain/crashing/errors"] == sum(r["step"] == 1 for r in crashed)


def test_steps_never_scored_are_dropped_and_a_foreign_completion_is_refused(curriculum):
    rows = curriculum.rows()
    step1 = [next(rows) for _ in range(3)]
    next(rows)  # TRL's look-ahead drew step 2; training ends before it is scored
    _call(curriculum, _as_trl_batch(step1, 2), 0, 6)
    curriculum.finish()
    assert curriculum.recorded_steps == [1]
    assert [v["step"] for v in curriculum.store.plan_vectors(curriculum.run_id)] == [1]
    with pytest.raises(ValueError, match="plan step 7, which this curriculum did not hand out"):
        curriculum.palestra_reward(prompts=[""], completions=["x"], palestra_step=[7], palestra_group=[0])
    with pytest.raises(ValueError, match="palestra_step and palestra_group columns"):
        curriculum.palestra_reward(prompts=[""], completions=["x"])


def test_a_verifier_pool_that_cannot_start_fails_the_reward_call_and_records_nothing(tmp_path):
    from domains.verify.pool import VerifierPoolBroken
    from pool_helpers import UNSTARTABLE

    store = StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}")
    cur = TRLCurriculum({"unstartable": UNSTARTABLE}, BatchShape(1, 2, 2), UniformConfig(), FixedDifficultyConfig(),
                        store, verifier_workers=1, owns_store=True)
    try:
        rows = cur.rows()
        with pytest.raises(VerifierPoolBroken, match="workers keep dying at start-up"):
            _call(cur, _as_trl_batch([next(rows)], 2), 0, 2)  # not two error rewards TRL would train on
        assert cur.recorded_steps == [] and store.count_results(cur.run_id) == 0
    finally:
        cur.close()


def test_a_tool_episode_needs_the_rollout_function(tmp_path):
    args = _args(output_dir=str(tmp_path), num_generations=2, generation_batch_size=2)
    with TRLCurriculum.build(["tool_calculator"], args, verifier_workers=1) as cur:
        row = next(cur.rows())  # TRL's own generation would give the episode one turn, no tool answer
        with pytest.raises(ValueError, match="^domain 'tool_calculator' is multi-turn: pass "
                                             "rollout_func=curriculum.rollout_func\\(\\) to GRPOTrainer$"):
            cur.palestra_reward(**_as_trl_batch([row], 2), completions=["x", "y"])
        assert cur.recorded_steps == []


def test_completion_text_reads_plain_and_chat_completions():
    assert completion_text("\\boxed{4}") == "\\boxed{4}"
    assert completion_text(_chat("\\boxed{4}")) == "\\boxed{4}"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"}]}]) == "a"
    with pytest.raises(TypeError, match="string or a list of chat messages"):
        completion_text(4)


def _args(**changes) -> SimpleNamespace:
    base = dict(shuffle_dataset=False, remove_unused_columns=False, world_size=1, max_steps=3, num_generations=4,
                generation_batch_size=24, steps_per_generation=1, num_iterations=1, gradient_accumulation_steps=1,
                output_dir="unused", seed=0, save_strategy="no")
    return SimpleNamespace(**{**base, **changes})


@pytest.mark.parametrize("changes, message", [
    ({"shuffle_dataset": True}, "shuffle_dataset=False"),
    ({"remove_unused_columns": True}, "remove_unused_columns=False"),
    ({"max_steps": -1}, "max_steps=N"),
])
def test_settings_the_curriculum_cannot_work_under_fail_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as info:
        trl_batch_shape(_args(**changes))
    assert "\n" not in str(info.value)


def test_batch_shape_counts_the_plans_trl_reads_ahead():
    assert trl_batch_shape(_args()) == BatchShape(6, 4, 3)
    # 8 accumulation steps of 1-step generation batches: 8 plans are read before the first is scored
    assert trl_batch_shape(_args(gradient_accumulation_steps=8)).max_open_steps == 10


def test_build_names_a_bad_policy_or_domain_before_starting_anything(tmp_path):
    args = _args(output_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"^policy: Input tag .uniformm."):
        TRLCurriculum.build(["arithmetic"], args, policy={"type": "uniformm"})
    with pytest.raises(DomainError, match="did you mean 'arithmetic'"):
        TRLCurriculum.build(["arithmetc"], args)
    with pytest.raises(ValueError, match="advantage_std must be one of group, batch, none"):
        TRLCurriculum.build(["arithmetic"], args, advantage_std="grup")
    with pytest.raises(ValueError, match=r"^verifier.workers: Input should be greater than or equal to 1"):
        TRLCurriculum.build(["arithmetic"], args, verifier={"workers": 0})
    with pytest.raises(ValueError, match=r"^verifier.backend: Input should be 'local' or 'ray'"):
        TRLCurriculum.build(["arithmetic"], args, verifier={"backend": "celery"})
    with pytest.raises(ValueError, match="give verifier_workers or verifier"):
        TRLCurriculum.build(["arithmetic"], args, verifier={"workers": 2}, verifier_workers=2)
    assert not (tmp_path / "palestra.db").exists()


def test_verifier_workers_and_a_verifier_section_are_not_both_taken(tmp_path):
    from domains.verify.backend import VerifierConfig

    store = StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}")
    with pytest.raises(ValueError, match="give verifier_workers or verifier"):
        TRLCurriculum({"by_length": BY_LENGTH}, BatchShape(3, 2, 4), UniformConfig(), FixedDifficultyConfig(), store,
                      verifier_workers=1, verifier=VerifierConfig(workers=1), owns_store=True)
    store.close()


def test_trl_grpo_trainer_trains_on_the_curriculum(tmp_path, capsys):
    """4 TRL steps of 6 prompts x 4 completions over arithmetic, a domain every completion solves
    (by_length) and a crashing verifier. Prioritized mixing must drop by_length once it is seen to
    be solved, and threshold difficulty must raise its level."""
    import trl
    from transformers import AutoModelForCausalLM

    from trainer.models.loading import load_tokenizer
    from trainer.models.tiny_model import build_tiny_model

    torch.manual_seed(0)
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)
    prompts, group, steps = 6, 4, 4
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=prompts * group, num_generations=group,
        max_completion_length=8, beta=0.0, learning_rate=1e-3, max_steps=steps, logging_steps=1, seed=0,
        shuffle_dataset=False, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True)
    url = f"sqlite:///{tmp_path / 'palestra.db'}"
    curriculum = TRLCurriculum.build(["arithmetic", "trl_helpers:BY_LENGTH", "trl_helpers:CRASHING"], args,
                                     policy={"type": "prioritized"}, difficulty={"type": "threshold", "window": 4},
                                     store_url=url, verifier_workers=1,
                                     domain_options={"arithmetic": {"require_boxed": False}})
    calls: list[tuple[dict, list[float]]] = []

    def palestra_reward(prompts, completions, **columns):  # what TRL hands over, and what it gets back
        rewards = curriculum.palestra_reward(prompts, completions, **columns)
        calls.append(({"texts": [completion_text(c) for c in completions], **columns}, rewards))
        return rewards

    with curriculum:
        trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=args,
                                  reward_funcs=palestra_reward, train_dataset=curriculum.dataset(),
                                  processing_class=load_tokenizer(str(model_dir), tiny=True),
                                  callbacks=[curriculum.callback()])
        trainer.train()
    run = curriculum.run_id

    # training went through all steps although a third of the completions crashed their verifier
    assert trainer.state.global_step == steps
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == steps and all(math.isfinite(h["loss"]) for h in logged)
    assert "palestra/arithmetic/reward" in logged[0] and "palestra/crashing/weight" in logged[0]
    # the crashing verifier judged nothing, and the logs count those apart from the verdicts
    assert all(h["palestra/unscored"] > 0 for h in logged)

    with StatsStore(url) as store:
        # one recorded plan step per generation batch, every completion counted once
        assert curriculum.recorded_steps == list(range(1, steps + 1))
        for step in range(1, steps + 1):
            assert len(store.results(run, step)) == prompts * group
        summary = {row["domain"]: row for row in store.domain_summary(run)}
        assert set(summary) == {"arithmetic", "by_length", "crashing"}
        assert all(row["attempts"] > 0 for row in summary.values())

        # the plan changes the mix and the level: by_length is solved, so it leaves the batch (one
        # step late: TRL reads a batch ahead) and its level goes up
        given = {(p["step"], p["domain"]): p["n_prompts"] for p in store.plans(run)}
        assert given[(1, "by_length")] == given[(2, "by_length")] == 2
        assert (steps, "by_length") not in given
        last = store.plan_vectors(run)[-1]
        assert last["levels"][last["domains"].index("by_length")] == 2
        assert summary["by_length"]["level"] == 2 and summary["by_length"]["success_rate"] == 1.0

        # TRL got exactly what our verifiers give for those completions, and the store holds the same
        domains = curriculum.domains
        tasks = {i: Task.from_json(t) for i, t in store.tasks(run).items()}
        for columns, rewards in calls:
            for text, task_id, reward in zip(columns["texts"], columns["task_id"], rewards):
                task = tasks[task_id]
                assert reward == verify_guarded(domains[task.domain], task, text).reward
            for step in set(columns["palestra_step"]):
                stored = sorted(r["reward"] for r in store.results(run, step))
                assert stored == sorted(r for r, s in zip(rewards, columns["palestra_step"]) if s == step)
        crashed = [r for r in store.results(run) if r["domain"] == "crashing"]
        assert crashed and {(r["status"], r["reward"]) for r in crashed} == {("error", 0.0)}
        assert store.run(run)["status"] == "finished"

    assert palestra_cli(["stats", "--db", url, "--run", run[:8]]) == 0
    table = capsys.readouterr().out
    assert "by_length" in table and "arithmetic" in table and "crashing" in table
    # the run's config names the domains as given (import paths) with their options: it replays
    assert palestra_cli(["replay", "--db", url, "--run", run[:8], "--workers", "1"]) == 0
    assert f"re-verified {steps * prompts * group} results, 0 mismatches" in capsys.readouterr().out


@pytest.mark.parametrize("batching, plans", [
    ({"gradient_accumulation_steps": 2, "steps_per_generation": 1}, 6),  # two plans per optimizer step
    ({"num_iterations": 2}, 2),  # each plan trained on twice, scored once
])
def test_each_generation_batch_is_one_recorded_step_however_trl_batches(tmp_path, batching, plans):
    import trl
    from transformers import AutoModelForCausalLM

    from trainer.models.loading import load_tokenizer
    from trainer.models.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=12, num_generations=4, max_completion_length=4,
        beta=0.0, max_steps=3, shuffle_dataset=False, use_cpu=True, bf16=False, report_to="none",
        save_strategy="no", disable_tqdm=True, **batching)
    with TRLCurriculum.build(["trl_helpers:BY_LENGTH"], args, policy={"type": "uniform"},
                             verifier_workers=1) as curriculum:
        trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=args,
                                  reward_funcs=curriculum.palestra_reward, train_dataset=curriculum.dataset(),
                                  processing_class=load_tokenizer(str(model_dir), tiny=True),
                                  callbacks=[curriculum.callback()])
        trainer.train()
        assert curriculum.recorded_steps == list(range(1, plans + 1))
        assert [len(curriculum.store.results(curriculum.run_id, s)) for s in curriculum.recorded_steps] == [12] * plans


def test_the_callback_refuses_a_trainer_that_batches_differently(curriculum):
    with pytest.raises(ValueError, match="built for 3 prompts x 2 completions .* the trainer uses 6 x 4"):
        curriculum.callback().on_train_begin(_args(), None, None)


def test_the_callback_refuses_a_trainer_resumed_apart_from_its_curriculum(curriculum):
    args = _args(num_generations=2, generation_batch_size=6, ignore_data_skip=True)
    state = lambda step: SimpleNamespace(global_step=step, save_steps=0)  # noqa: E731
    curriculum.callback().on_train_begin(args, state(0), None)  # a fresh run starts
    with pytest.raises(ValueError, match="^the trainer resumes at step 5 but the curriculum starts afresh: build it "
                                         "with TRLCurriculum.build\\(..., resume_from_checkpoint=...\\) too$"):
        curriculum.callback().on_train_begin(args, state(5), None)
    curriculum.resumed_at = 4  # restored from checkpoint-4, while the trainer resumes elsewhere
    with pytest.raises(ValueError, match="^the curriculum was restored from step 4's checkpoint, the trainer starts "
                                         "at step 5: pass the same resume_from_checkpoint to trainer.train\\(\\)$"):
        curriculum.callback().on_train_begin(args, state(5), None)
    with pytest.raises(ValueError, match="^resuming with a Palestra curriculum needs GRPOConfig\\(ignore_data_skip"):
        curriculum.callback().on_train_begin(_args(num_generations=2, generation_batch_size=6), state(4), None)


def test_checkpoints_inside_a_generation_batch_are_refused(curriculum):
    # each plan is trained on twice (num_iterations=2): a checkpoint after one step would fall inside it
    args = _args(num_generations=2, generation_batch_size=6, num_iterations=2, save_strategy="steps", save_steps=1)
    with pytest.raises(ValueError, match="^save_steps=1 ends checkpoints inside a generation batch"):
        curriculum.callback().on_train_begin(args, SimpleNamespace(global_step=0, save_steps=1), None)
    args.save_steps = 2  # every second step: between plans
    curriculum.callback().on_train_begin(args, SimpleNamespace(global_step=0, save_steps=2), None)
