"""Audit and crash safety: replay re-scores stored rewards; a SIGKILLed run resumes exactly."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from sqlalchemy import update
from transformers import AutoModelForCausalLM

from curriculum.cli import main as cli
from curriculum.replay import replay
from curriculum.run_summary import run_alarms
from curriculum.schema import RunRow
from curriculum.store import StatsStore
from trainer.app import run
from trainer.config import ConfigError, validate_config
from trainer.recipe.grpo import GRPORecipe
from quick_settings import quick

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # spawned verifier workers import replay_helpers from here

TINY = {"type": "tiny", "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}}


def tiny(tmp_path, domains, steps, **extra):
    return quick({
        "name": "audit", "seed": 11, "output_dir": str(tmp_path / "run"), "model": TINY, "domains": domains,
        "policy": {"type": "learnability"}, "difficulty": {"type": "threshold"},
        "trainer": {"steps": steps, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 8,
                    "rollout_batch_size": 16, "micro_batch_size": 16},
        "verifier": {"workers": 1}, "sft": {"steps": 3, "batch_size": 8}, "eval": {"tasks_per_level": 1}, **extra,
    })


def test_replay_finds_no_mismatch_for_deterministic_verifiers(tmp_path, capsys):
    summary = run(validate_config(tiny(tmp_path, ["arithmetic", "fractions"], steps=2)))
    url = f"sqlite:///{tmp_path / 'run' / 'palestra.db'}"
    with StatsStore(url) as store:
        report = replay(store, summary["run_id"], workers=1)
    assert report.checked == 2 * 4 * 4 and report.missing_tasks == 0
    assert report.mismatches == []
    capsys.readouterr()  # drop the training run's console output
    assert cli(["replay", "--db", url, "--run", summary["run_id"], "--step", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checked"] == 16
    assert cli(["replay", "--db", url, "--run", summary["run_id"], "--step", "9"]) == 2
    assert capsys.readouterr().err == f"error: run {summary['run_id']} has no results at step 9 (it has steps 1-2)\n"


def test_replay_counts_damaged_rows_and_unknown_domains_and_checks_the_rest(tmp_path, capsys):
    from sqlalchemy import update

    from curriculum.schema import ResultRow, TaskRow

    summary = run(validate_config(tiny(tmp_path, ["arithmetic", "fractions"], steps=1)))
    url = f"sqlite:///{tmp_path / 'run' / 'palestra.db'}"
    with StatsStore(url) as store, store.engine.begin() as conn:
        rows = store.results(summary["run_id"])
        ids = [r["id"] for r in rows if r["domain"] == "arithmetic"][:3]
        damaged_task = next(r["task_id"] for r in rows if r["domain"] == "fractions")
        conn.execute(update(ResultRow).where(ResultRow.id == ids[0]).values(completion=b"not zlib"))
        conn.execute(update(ResultRow).where(ResultRow.id.in_(ids[1:])).values(domain="renamed"))
        conn.execute(update(TaskRow).where(TaskRow.task_id == damaged_task).values(task=b"not zlib either"))
        with_damaged_task = sum(r["task_id"] == damaged_task for r in rows)
    capsys.readouterr()
    assert cli(["replay", "--db", url, "--run", summary["run_id"], "--json"]) == 1  # not everything was checked
    report = json.loads(capsys.readouterr().out)
    assert report["unreadable"] == 1 + with_damaged_task and report["unknown_domains"] == {"renamed": 2}
    assert report["checked"] == 16 - 3 - with_damaged_task and report["mismatches"] == []


@pytest.mark.sandbox
def test_replay_without_a_sandbox_counts_the_code_it_could_not_judge(tmp_path, capsys):
    from sqlalchemy import update

    from curriculum.schema import RunRow

    summary = run(validate_config(tiny(tmp_path, ["code_functions"], steps=1)))
    url = f"sqlite:///{tmp_path / 'run' / 'palestra.db'}"
    with StatsStore(url) as store, store.engine.begin() as conn:  # replayed on a machine whose sandbox cannot work
        config = {**store.run(summary["run_id"])["config"],
                  "domain_options": {"code_functions": {"sandbox": {"bwrap": "/nonexistent/bwrap"}}}}
        conn.execute(update(RunRow).where(RunRow.id == summary["run_id"]).values(config=config))
    capsys.readouterr()
    with StatsStore(url) as store:
        stored_errors = sum(r["status"] == "error" for r in store.results(summary["run_id"]))
    assert cli(["replay", "--db", url, "--run", summary["run_id"], "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["checked"], report["unscored"]) == (16, 16)
    assert len(report["mismatches"]) == 16 - stored_errors > 0  # a stored error that fails again still matches
    assert {m["replayed_status"] for m in report["mismatches"]} == {"error"}


def test_training_without_a_sandbox_raises_an_alarm_naming_the_code_domain_once(tmp_path):
    options = {"code_functions": {"sandbox": {"bwrap": "/nonexistent/bwrap"}}}
    summary = run(validate_config(tiny(tmp_path, ["code_functions", "arithmetic"], steps=2, domain_options=options)))
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    alarms = [a for r in records if r["phase"] == "alarm" for a in r["alarms"]]
    unjudged = [a for a in alarms if "could not judge" in a]
    assert len(unjudged) == 1 and unjudged[0].startswith("the verifier of code_functions could not judge"), alarms
    # the model, three SFT steps old, boxes no answer: the format alarm names arithmetic, and only it
    # (the code domain's completions were never judged, so none of them is a format error)
    assert [a.split(" over ")[0] for a in alarms if a not in unjudged] == [
        "8 of the 8 completions of arithmetic"], alarms
    train = [r for r in records if r["phase"] == "train"]
    assert all(r["domain/code_functions/unscored"] == r["domain/code_functions/prompts"] * 4 for r in train)
    assert all(r.get("domain/arithmetic/unscored", 0) == 0 for r in train)
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:  # kept for `palestra report`
        assert [text for _, text in run_alarms(store.metrics(summary["run_id"]))] == alarms


def test_replay_flags_a_nondeterministic_verifier(tmp_path, capsys):
    summary = run(validate_config(tiny(tmp_path, ["replay_helpers:COIN"], steps=2)))
    url = f"sqlite:///{tmp_path / 'run' / 'palestra.db'}"
    capsys.readouterr()
    assert cli(["replay", "--db", url, "--run", summary["run_id"]]) == 1
    out = capsys.readouterr().out
    checked, mismatched = (int(w) for w in out.split("re-verified ")[1].split(" mismatches")[0].split(" results, "))
    # 32 fair coin flips: all of them agreeing with the stored ones has probability 2**-32
    assert checked == 32 and 0 < mismatched < 32


def _train_cli(output_dir: Path, steps: int, resume: str = "never") -> subprocess.Popen:
    # hydra.run.dir (output_dir follows it) keeps Hydra's own files out of the source tree's outputs/
    args = [sys.executable, "-m", "trainer.app", f"hydra.run.dir={output_dir}", "seed=5", f"trainer.steps={steps}",
            "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.sampling.max_new_tokens=8",
            "trainer.sampling.rollout_batch_size=16", "trainer.optim.micro_batch_size=16", "verifier.workers=1",
            "sft.steps=3", "sft.batch_size=8", "eval.tasks_per_level=1", "checkpoint.every=1",
            "model.tiny.hidden_size=32", "model.tiny.layers=2", "model.tiny.heads=2", "model.tiny.kv_heads=1",
            "model.tiny.intermediate_size=64", f"resume={resume}", "domains=[arithmetic,fractions]",
            # one thread for every phase: the straight and the killed run go side by side on two cores
            "trainer.system.cpu_threads=1", "trainer.system.update_cpu_threads=1", "sft.cpu_threads=1"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TQDM_DISABLE": "1"}, cwd=HERE.parent)


def _plans(db: Path) -> tuple[list, dict]:
    with StatsStore(f"sqlite:///{db}") as store:
        [run_row] = store.runs()
        vectors = [(v["step"], v["weights"], v["levels"]) for v in store.plan_vectors(run_row["id"])]
        per_step: dict[int, int] = {}
        for r in store.results(run_row["id"]):
            per_step[r["step"]] = per_step.get(r["step"], 0) + 1
    return vectors, per_step


def test_sigkill_mid_run_then_resume_matches_uninterrupted(tmp_path):
    steps = 5
    reference = _train_cli(tmp_path / "straight", steps)  # the uninterrupted run, beside the victim
    victim = _train_cli(tmp_path / "killed", steps)
    checkpoints = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 300
    while not (checkpoints / "step-0000003").exists():  # let it get past step 3, then kill it cold
        assert victim.poll() is None and time.time() < deadline, "run ended before it could be killed"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert reference.wait(timeout=300) == 0, reference.stdout.read().decode()[-2000:]
    resumed = _train_cli(tmp_path / "killed", steps, resume="auto")
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read().decode()[-2000:]
    # the evaluation before GRPO travelled in the checkpoint, so the gain still gets its interval
    output = resumed.stdout.read().decode()
    final = json.loads(output.strip().splitlines()[-1])
    assert "settings changed" not in output  # the same command, but for resume=auto
    low, high = final["macro_gain_ci95"]
    assert low <= final["macro_gain"] <= high

    straight_plans, straight_rows = _plans(tmp_path / "straight" / "palestra.db")
    resumed_plans, resumed_rows = _plans(tmp_path / "killed" / "palestra.db")
    assert resumed_rows == straight_rows  # none missing or doubled, the refills of dynamic sampling too
    assert set(straight_rows) == set(range(1, steps + 1)) and min(straight_rows.values()) >= 4 * 4
    assert sum(straight_rows.values()) > steps * 4 * 4  # some groups were refilled, and resumed alike
    assert resumed_plans == straight_plans  # the same weights and levels at every step


def test_an_unreachable_store_stops_with_a_checkpoint_that_loses_nothing(tmp_path):
    from sqlalchemy import event

    from curriculum.store import StoreUnavailable
    from trainer.recipe.grpo import GRPORecipe

    db = tmp_path / "run" / "palestra.db"
    recipe = GRPORecipe(validate_config(tiny(tmp_path, ["arithmetic"], steps=4)))
    recipe.setup()
    recipe.store.retry_delays_s = (0.01,)
    recipe.store.engine.dispose()  # new connections wait 20 ms for a lock, not 30 s
    event.listen(recipe.store.engine, "connect", lambda conn, _: conn.execute("PRAGMA busy_timeout=20"))
    blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    train_step = recipe.train_step

    def step_then_lose_the_store(step):
        metrics = train_step(step)
        if step == 2:  # steps 1-2 are stored; from now on the database is locked for good
            recipe.curriculum.inner.flush()
            blocker.execute("BEGIN EXCLUSIVE")
        return metrics

    recipe.train_step = step_then_lose_the_store
    with pytest.raises(StoreUnavailable, match=r"unwritten step\(s\); fix the store, then resume with resume=\S+step-0000004"):
        recipe.train()
    recipe.cleanup("failed")
    blocker.rollback()
    blocker.close()

    summary = run(validate_config(tiny(tmp_path, ["arithmetic"], steps=4, resume="auto")))
    with StatsStore(f"sqlite:///{db}") as store:
        rows = store.results(summary["run_id"])
        assert store.run(summary["run_id"])["status"] == "finished"
    per_step = {s: sum(r["step"] == s for r in rows) for s in range(1, 5)}
    assert per_step == {1: 16, 2: 16, 3: 16, 4: 16}


@pytest.mark.parametrize("other_eval", [{"tasks_per_level": 2}, {"tasks_per_level": 1, "temperature": 0.7, "samples": 2}],
                         ids=["other tasks", "sampled instead of greedy"])
def test_a_resume_with_another_heldout_evaluation_finishes_without_pairing_them(tmp_path, other_eval):
    # The run stops after step 2 of 4 with a checkpoint, then resumes with twice the held-out
    # tasks, or the same tasks sampled: the saved "before" evaluation no longer compares, so there
    # is no gain and no interval (instead of a crash, or a gain between two kinds of measurement).
    first = run(validate_config(tiny(tmp_path, ["arithmetic"], steps=2, checkpoint={"every": 1})))
    assert "macro_gain_ci95" in first
    resumed = run(validate_config(tiny(tmp_path, ["arithmetic"], steps=4, resume="auto", eval=other_eval)))
    assert resumed["run_id"] == first["run_id"]
    assert "macro_gain_ci95" not in resumed
    assert resumed["before"] == {} and resumed["macro_gain"] is None  # nothing comparable before GRPO
    assert 0.0 <= resumed["after"]["eval/macro"] <= 1.0
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        assert store.run(resumed["run_id"])["status"] == "finished"


def test_resume_by_checkpoint_path_from_a_new_folder_continues_the_run_in_its_own(tmp_path, capsys):
    # Hydra stamps every launch with a new output folder: a resume names the checkpoint and must go
    # on with that run's store, SFT anchor (the KL reference) and metrics, not start over beside them
    with_kl = {**tiny(tmp_path, [], steps=2)["trainer"], "beta": 0.1}
    first = run(validate_config(tiny(tmp_path, ["arithmetic"], steps=2, checkpoint={"every": 1}, trainer=with_kl)))
    checkpoint = tmp_path / "run" / "checkpoints" / "step-0000002"
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store, store.engine.begin() as conn:
        # as a run stored before passwords were hidden holds its store URL
        started = {**store.run(first["run_id"])["config"], "store": {"url": "postgresql://me:secret@db/runs"}}
        conn.execute(update(RunRow).where(RunRow.id == first["run_id"]).values(config=started))
    later = dict(tiny(tmp_path, ["arithmetic"], steps=3, resume=str(checkpoint),
                      trainer={**with_kl, "steps": 3, "lr": 2e-4}), output_dir=str(tmp_path / "later"))
    changes = ["checkpoint.every: 1 -> 0", "store.url: 'postgresql://me:***@db/runs' -> None",
               "trainer.optim.lr: 0.0001 -> 0.0002", "trainer.steps: 2 -> 3"]
    recipe = GRPORecipe(validate_config(later))
    try:
        recipe.setup()
        anchor = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "sft-model").state_dict()
        assert all(torch.equal(v.cpu(), anchor[k]) for k, v in recipe.ref_model.state_dict().items())
        # the forgetting alarm still measures against the best evaluation before the resume
        assert recipe.health.best_macro == max(first["before"]["eval/macro"], first["after"]["eval/macro"])
        # what this launch changed is named, with no password; its new folder and the checkpoint it
        # names are not changes
        assert recipe.resumed_changes == changes
        # and the new rate is the one it trains at: the third of five warm-up updates takes 3/5 of it
        assert recipe.optimizer.param_groups[0]["lr"] == pytest.approx(2e-4 * 3 / 5)
    finally:
        recipe.cleanup("interrupted")
    capsys.readouterr()
    resumed = run(validate_config(later))
    assert resumed["run_id"] == first["run_id"]
    assert (f"resuming run {first['run_id']} at step 2 with settings changed since it started: "
            f"{'; '.join(changes)}\n") in capsys.readouterr().out
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        assert store.run(resumed["run_id"])["status"] == "finished"
        per_step = {s: sum(r["step"] == s for r in store.results(resumed["run_id"])) for s in (1, 2, 3)}
    assert per_step == {1: 16, 2: 16, 3: 16}
    logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in logged if r["phase"] == "train"] == [1, 2, 3]
    assert [r["lr"] for r in logged if r["phase"] == "train"] == pytest.approx([1e-4 / 5, 1e-4 * 2 / 5, 2e-4 * 3 / 5])
    assert not (tmp_path / "later" / "palestra.db").exists()


def test_resume_with_a_store_that_lacks_the_run_fails_in_one_line(tmp_path):
    run(validate_config(tiny(tmp_path, ["arithmetic"], steps=1, checkpoint={"every": 1})))
    checkpoint = tmp_path / "run" / "checkpoints" / "step-0000001"
    elsewhere = tiny(tmp_path, ["arithmetic"], steps=2, resume=str(checkpoint),
                     store={"url": f"sqlite:///{tmp_path / 'other.db'}"})
    with pytest.raises(ConfigError, match=r"^resume: .*step-0000001 is of run \S+, which is not in the store "
                                          r"sqlite:///\S+other.db; set store.url to the run's database$"):
        run(validate_config(elsewhere))
    with pytest.raises(ConfigError, match=r"^resume: \S+nowhere is not a complete checkpoint folder$"):
        run(validate_config(tiny(tmp_path, ["arithmetic"], steps=2, resume=str(tmp_path / "nowhere"))))


def test_another_tiny_shape_fails_in_one_line_on_resume_and_in_a_used_output_dir(tmp_path):
    first = run(validate_config(tiny(tmp_path, ["arithmetic"], steps=1, checkpoint={"every": 1})))
    wider = {**TINY, "tiny": {**TINY["tiny"], "hidden_size": 64}}
    with pytest.raises(ConfigError, match=r"^resume: the model in \S+step-0000001 has hidden_size 32 \(asked 64\); "
                                          r"a run keeps its model's shape \(start a new run to change it\)$"):
        run(validate_config(tiny(tmp_path, ["arithmetic"], steps=2, resume="auto", model=wider)))
    with pytest.raises(ConfigError, match=r"^model\.tiny: the tiny model at \S+tiny-model has hidden_size 32 "
                                          r"\(asked 64\); use another output_dir for another shape$"):
        run(validate_config(tiny(tmp_path, ["arithmetic"], steps=1, model=wider)))
    # the refused launches changed nothing: the original shape resumes and finishes
    resumed = run(validate_config(tiny(tmp_path, ["arithmetic"], steps=2, resume="auto")))
    assert resumed["run_id"] == first["run_id"]
