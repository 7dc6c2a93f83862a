"""TRL runs with a Palestra curriculum: ``resume_from_checkpoint`` and held-out evaluation
(``trainer.integrations.trl_checkpoint``, ``trl_callback``, ``trl_evaluation``).

Real TRL GRPOTrainer runs on the shrunk tiny model, a few steps each, a SQLite store per run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from curriculum.store import StatsStore
from trainer.integrations.trl import TRLCurriculum

sys.path.insert(0, str(Path(__file__).parent))  # spawned verifier workers import trl_helpers from here

trl = pytest.importorskip("trl")

DOMAINS = ["arithmetic", "trl_helpers:BY_LENGTH"]
OPTIONS = {"arithmetic": {"require_boxed": False}}
PROMPTS, GROUP = 4, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trainer.models.tiny_model import build_tiny_model

    torch.manual_seed(0)
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", hidden_size=32, layers=1, heads=2,
                            kv_heads=1, intermediate_size=64)


def _args(out: Path, **changes):
    settings = dict(
        output_dir=str(out), per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
        max_completion_length=8, beta=0.0, learning_rate=1e-3, max_steps=4, logging_steps=1, seed=0,
        shuffle_dataset=False, use_cpu=True, bf16=False, report_to="none", save_strategy="steps", save_steps=2,
        ignore_data_skip=True, dataloader_num_workers=0, disable_tqdm=True)
    return trl.GRPOConfig(**{**settings, **changes})


def _train(tiny: Path, args, *, stop_after: int | None = None, resume=None, **build):
    """One TRL run (or the resumed rest of one) with the curriculum, stopped after ``stop_after``
    steps if given; returns the curriculum (closed) and the trainer."""
    from transformers import AutoModelForCausalLM, TrainerCallback

    from trainer.models.loading import load_tokenizer

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if stop_after is not None and state.global_step >= stop_after:
                control.should_training_stop = True

    with TRLCurriculum.build(DOMAINS, args, policy={"type": "prioritized"},
                             difficulty={"type": "threshold", "window": 2},
                             domain_options=OPTIONS, verifier_workers=1, resume_from_checkpoint=resume,
                             **build) as curriculum:
        trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny), args=args,
                                  reward_funcs=curriculum.palestra_reward, train_dataset=curriculum.dataset(),
                                  processing_class=load_tokenizer(str(tiny), tiny=True), callbacks=[Stop()])
        curriculum.attach(trainer)
        trainer.train(resume_from_checkpoint=resume)
    return curriculum, trainer


def _stored(out: Path, run_id: str) -> dict[str, list]:
    """What the store holds of a run, per step, without what differs between any two runs (the run
    id, row ids, verification latency)."""
    def kept(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k not in {"run_id", "id", "latency_s"}} for row in rows]

    with StatsStore(f"sqlite:///{out / 'palestra.db'}") as store:
        return {"results": kept(store.results(run_id)), "plans": kept(store.plans(run_id)),
                "vectors": kept(store.plan_vectors(run_id)), "tasks": store.tasks(run_id),
                "metrics": kept(store.metrics(run_id)), "status": store.run(run_id)["status"]}


def test_a_resumed_trl_run_stores_what_an_uninterrupted_one_does(tiny, tmp_path):
    """The interrupted run saves checkpoint-2, goes on to step 3 and stops (its step 3 is stored,
    as a crashed run's would be); a fresh trainer and curriculum resume from checkpoint-2. The
    store then holds every step once, and each step's plan, vector, tasks, completions and
    held-out evaluation are the uninterrupted run's: the prioritized policy and the threshold
    controller learn from every reward, so the plans after the resume match only if the
    scheduler's state, the plans TRL had read ahead (drawn before step 2 was scored) and the
    sampler's RNG all came back. The completions match because the callback restores the RNG
    states once more after TRL has started its data loader (see ``CurriculumCallback.on_step_begin``);
    without that, half of the later steps' completions differed."""
    whole_out, cut_out = tmp_path / "whole", tmp_path / "cut"
    evaluation = {"every": 2, "tasks_per_level": 1, "at_start": False}
    whole, _ = _train(tiny, _args(whole_out), evaluation=evaluation)
    first, _ = _train(tiny, _args(cut_out), stop_after=3, evaluation=evaluation)
    assert first.recorded_steps == [1, 2, 3]
    assert (cut_out / "checkpoint-2" / "palestra_curriculum.pt").is_file()
    resumed, trainer = _train(tiny, _args(cut_out), resume=str(cut_out / "checkpoint-2"), evaluation=evaluation)

    assert resumed.run_id == first.run_id and resumed.resumed_at == 2
    assert resumed.recorded_steps == [3, 4] and trainer.state.global_step == 4
    expected, got = _stored(whole_out, whole.run_id), _stored(cut_out, first.run_id)
    steps = [row["step"] for row in got["results"]]
    assert steps == sorted(steps)
    assert {s: steps.count(s) for s in set(steps)} == {s: PROMPTS * GROUP for s in range(1, 5)}
    assert got["vectors"] == expected["vectors"] and [v["step"] for v in got["vectors"]] == [1, 2, 3, 4]
    assert got["plans"] == expected["plans"]
    assert got["tasks"] == expected["tasks"]
    # the plans did adapt (else any resume would pass): by_length is solved, so it leaves the batch
    given = {(p["step"], p["domain"]): p["n_prompts"] for p in got["plans"]}
    assert given.get((1, "by_length")) and not given.get((4, "by_length"))
    assert got["results"] == expected["results"]  # completions, rewards, advantages, row by row
    assert got["metrics"] == expected["metrics"]  # the held-out evaluations at steps 2 and 4 among them
    assert [row["step"] for row in got["metrics"] if "heldout/macro" in row] == [2, 4]
    assert got["status"] == "finished"


def test_resume_continues_the_newest_checkpoint_with_true(tiny, tmp_path):
    """``resume_from_checkpoint=True`` picks the newest checkpoint-N, for the curriculum as for TRL."""
    out = tmp_path / "run"
    first, _ = _train(tiny, _args(out, max_steps=3, save_steps=1), stop_after=2)
    resumed, trainer = _train(tiny, _args(out, max_steps=3, save_steps=1), resume=True)
    assert resumed.resumed_at == 2 and resumed.recorded_steps == [3] and trainer.state.global_step == 3
    assert [v["step"] for v in _stored(out, first.run_id)["vectors"]] == [1, 2, 3]


def test_held_out_evaluation_every_two_steps_reaches_the_store_and_trl_logs(tiny, tmp_path):
    out = tmp_path / "eval"
    curriculum, trainer = _train(tiny, _args(out, save_strategy="no"),
                                 evaluation={"every": 2, "tasks_per_level": 1})
    heldout = curriculum.evaluation.heldout_ids
    logged = [h for h in trainer.state.log_history if "eval/macro" in h]
    # before the first step, at step 2 and at step 4, which is also the end: no second entry there
    assert [h["step"] for h in logged] == [0, 2, 4]
    with StatsStore(f"sqlite:///{out / 'palestra.db'}") as store:
        evaluated = {row["step"]: row for row in store.metrics(curriculum.run_id) if "heldout/macro" in row}
        assert sorted(evaluated) == [0, 2, 4]
        for entry in logged:
            row = evaluated[entry["step"]]
            assert row["heldout/macro"] == entry["eval/macro"]
            assert row["heldout/arithmetic"] == entry["eval/arithmetic"]
            assert 0.0 <= entry["eval/macro"] <= 1.0
        assert "reward/mean" in evaluated[2] and "reward/mean" in evaluated[4]  # joined to the steps' own rows
        assert not heldout & set(store.tasks(curriculum.run_id))  # held-out tasks never trained on
    # each step's own log entry keeps its training metrics (TRL's and the curriculum's): the
    # evaluation's entries took none of them
    trained = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in trained] == [1, 2, 3, 4]
    assert all("reward" in h and "palestra/arithmetic/reward" in h for h in trained)
    assert not any("reward" in h or "loss" in h for h in logged)
    summary = curriculum.evaluation.summary()
    assert summary["before"] and summary["after"] and summary["macro_gain"] is not None


def test_report_plots_the_held_out_numbers_of_a_trl_run(tiny, tmp_path, capsys):
    """``palestra report`` draws its held-out curve and heat map from what the evaluation stored."""
    from curriculum.cli import main as palestra_cli

    out = tmp_path / "eval"
    curriculum, _ = _train(tiny, _args(out, max_steps=2, save_strategy="no"),
                           evaluation={"every": 1, "tasks_per_level": 1})
    page = tmp_path / "report"
    capsys.readouterr()
    assert palestra_cli(["report", "--db", f"sqlite:///{out / 'palestra.db'}", "--run", curriculum.run_id[:8],
                         "--out", str(page)]) == 0
    assert (page / "macro.png").is_file() and (page / "heldout.png").is_file()


# -- bad input: one line each, before anything starts ------------------------------------------------
def _one_line(info) -> str:
    message = str(info.value)
    assert "\n" not in message
    return message


def test_resume_needs_ignore_data_skip(tmp_path):
    with pytest.raises(ValueError, match=r"^resuming with a Palestra curriculum needs "
                                         r"GRPOConfig\(ignore_data_skip=True\)") as info:
        TRLCurriculum.build(["arithmetic"], _args(tmp_path, ignore_data_skip=False), resume_from_checkpoint=True)
    _one_line(info)
    assert not (tmp_path / "palestra.db").exists()


@pytest.mark.parametrize("resume, message", [
    ("missing", r"^resume_from_checkpoint: .*missing is not a folder$"),
    ("empty", r"^resume_from_checkpoint: .*empty has no palestra_curriculum.pt: it was not saved by a run with "
              r"the Palestra curriculum's callback$"),
    (True, r"^resume_from_checkpoint=True: no checkpoint-N folder in "),
])
def test_a_missing_checkpoint_is_named_in_one_line(tmp_path, resume, message):
    (tmp_path / "empty").mkdir()
    given = str(tmp_path / resume) if isinstance(resume, str) else resume
    with pytest.raises(ValueError, match=message) as info:
        TRLCurriculum.build(["arithmetic"], _args(tmp_path / "out"), resume_from_checkpoint=given)
    _one_line(info)
    assert not (tmp_path / "out" / "palestra.db").exists()


@pytest.mark.parametrize("evaluation, message", [
    ({"every": -1}, r"^evaluation.every: Input should be greater than or equal to 0"),
    ({"evry": 2}, r"^evaluation.evry: Extra inputs are not permitted"),
    ({"samples": 4}, r"^evaluation: .*more than one sample per task needs temperature > 0"),
    ("every 2", r"^evaluation must be a dict of settings, not str$"),
])
def test_a_bad_evaluation_config_is_one_line(tmp_path, evaluation, message):
    with pytest.raises(ValueError, match=message) as info:
        TRLCurriculum.build(["arithmetic"], _args(tmp_path), evaluation=evaluation)
    _one_line(info)
    assert not (tmp_path / "palestra.db").exists()


def test_a_checkpoint_of_another_store_or_inside_a_generation_batch_is_refused(tmp_path):
    from trainer.integrations import trl_checkpoint

    folder = tmp_path / "out" / "checkpoint-1"
    trl_checkpoint.save(folder, {"run_id": "not-a-run", "global_step": 1})
    # each plan is trained on twice: step 1 ends inside the first plan's generation batch
    with pytest.raises(ValueError, match=r"^resume_from_checkpoint: .*checkpoint-1 was saved inside a generation "
                                         r"batch") as info:
        TRLCurriculum.build(["arithmetic"], _args(tmp_path / "out", num_iterations=2), resume_from_checkpoint=True)
    _one_line(info)
    with pytest.raises(ValueError, match=r"^resume_from_checkpoint: the checkpoint is of run not-a-run, which is "
                                         r"not in the store .*: pass the run's store_url$") as info:
        TRLCurriculum.build(["arithmetic"], _args(tmp_path / "out"), resume_from_checkpoint=folder)
    _one_line(info)
