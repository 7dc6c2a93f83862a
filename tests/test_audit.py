"""Canaries in a training run: a weakened verifier raises the canary alarm, ``audit.stop_on_canary``
stops the run with a checkpoint that resumes, the counts reach ``palestra stats`` and the alarms the
report; and the canary check leaves training exactly as it was."""
import json
import sys
from pathlib import Path

import pytest

from curriculum.cli import main as cli
from curriculum.store import StatsStore
from quick_settings import quick
from trainer.app import run
from trainer.audit import CanaryPaid
from trainer.config import validate_config

sys.path.insert(0, str(Path(__file__).parent))  # spawned verifier workers import weak_verifier from here

TINY = {"type": "tiny", "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}}
WEAK = ["weak_verifier:WEAK_ARITHMETIC", "weak_verifier:DIGIT_SHARE"]


def config(tmp_path, domains, steps, audit, **extra):
    return validate_config(quick({
        "name": "canaries", "seed": 5, "output_dir": str(tmp_path / "run"), "model": TINY, "domains": domains,
        "policy": {"type": "uniform"}, "difficulty": {"type": "threshold"},
        "trainer": {"steps": steps, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 8,
                    "rollout_batch_size": 16, "micro_batch_size": 16},
        "verifier": {"workers": 1}, "eval": {"tasks_per_level": 2}, "audit": audit, **extra,
    }))


@pytest.fixture(scope="module")
def stopped_then_resumed(tmp_path_factory):
    """A run whose canaries are checked every 2 steps stops at step 2 (stop_on_canary), then resumes
    to step 4 with the stop off; returns (folder, message of the stop, the resumed run's summary)."""
    tmp_path = tmp_path_factory.mktemp("canaries")
    checks = {"at_start": False, "every": 2, "stop_on_canary": True}
    with pytest.raises(CanaryPaid) as stopped:
        run(config(tmp_path, WEAK, steps=4, audit=checks))
    with StatsStore(_store(tmp_path / "run")) as store:
        assert [(r["status"], r["last_step"]) for r in store.runs()] == [("stopped", 2)]
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step-0000002"]
    summary = run(config(tmp_path, WEAK, steps=4, audit={**checks, "stop_on_canary": False}, resume="auto"))
    return tmp_path / "run", str(stopped.value), summary


def _store(folder: Path) -> str:
    return f"sqlite:///{folder / 'palestra.db'}"


def test_a_paying_canary_stops_the_run_with_a_checkpoint_that_resumes(stopped_then_resumed):
    folder, message, summary = stopped_then_resumed
    assert message.startswith("a canary earned reward at step 2 (audit.stop_on_canary): fix the verifier, then "
                              "resume with resume=") and "step-0000002" in message
    with StatsStore(_store(folder)) as store:
        [stored] = store.runs()
        assert stored["id"] == summary["run_id"] and stored["status"] == "finished" and stored["last_step"] == 4
        alarms = {row["step"]: row.get("canary/alarms") for row in store.metrics(stored["id"])}
    # the check at step 2 (before the stop) and the resumed run's at step 4 both named the canaries
    assert all(any("of weak_arithmetic earned reward 1.00" in a for a in alarms[step]) for step in (2, 4))
    logged = [json.loads(line) for line in open(folder / "metrics.jsonl")]
    assert any(r["phase"] == "alarm" and any("canary 'unboxed_answer' of weak_arithmetic" in a for a in r["alarms"])
               for r in logged)


def test_palestra_stats_counts_the_canaries_of_each_domain(stopped_then_resumed, capsys):
    folder, _, summary = stopped_then_resumed
    capsys.readouterr()
    assert cli(["stats", "--db", _store(folder), "--run", summary["run_id"], "--json"]) == 0
    rows = {r["domain"]: r for r in json.loads(capsys.readouterr().out)["domains"]}
    # two checks, each of 7 canaries on one task of each of the 2 levels; digit_share names none
    assert rows["weak_arithmetic"]["canaries"] == 2 * 7 * 2 and rows["weak_arithmetic"]["canaries_paid"] >= 2 * 3
    assert rows["digit_share"]["canaries"] == rows["digit_share"]["canaries_paid"] == 0


def test_the_report_shows_the_canary_alarms(stopped_then_resumed, tmp_path):
    folder, _, summary = stopped_then_resumed
    assert cli(["report", "--db", _store(folder), "--run", summary["run_id"], "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    assert "<h2>Canary alarms</h2>" in page and "step 2: canary &#x27;answer_in_thinking&#x27; of weak_arithmetic" in page


def test_the_canary_check_leaves_training_as_it_was(tmp_path):
    outcomes = []
    for checks in ({"at_start": False}, {"at_start": True, "every": 1}):
        folder = tmp_path / str(len(outcomes))
        summary = run(config(folder, ["arithmetic", "weak_verifier:DIGIT_SHARE"], steps=2, audit=checks))
        with StatsStore(_store(folder / "run")) as store:
            rows = store.results(summary["run_id"])
        outcomes.append(([(r["task_id"], r["completion"], r["reward"]) for r in rows], summary["after"]))
    assert outcomes[0] == outcomes[1]
