"""Canaries in a training run and the spot-check audit: a weakened verifier raises the canary alarm,
``audit.stop_on_canary`` stops the run with a checkpoint that resumes, the counts reach ``palestra
stats`` and the alarms the report; ``palestra audit`` writes a page holding its sampled rows; and
the canary check leaves training exactly as it was."""
import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from curriculum.cli import main as cli
from curriculum.store import StatsStore
from quick_settings import quick
from trainer.app import run
from trainer.config import validate_config
from trainer.recipe.audit import CanaryPaid

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


def test_a_paying_canary_at_a_fresh_start_stops_before_any_training(tmp_path):
    with pytest.raises(CanaryPaid, match=r"^a canary earned reward before training \(audit.stop_on_canary\): fix the "
                                         r"verifier, then start again$"):
        run(config(tmp_path, WEAK, steps=4, audit={"stop_on_canary": True}))
    with StatsStore(_store(tmp_path / "run")) as store:
        assert [(r["status"], r["last_step"]) for r in store.runs()] == [("stopped", -1)]
    assert not (tmp_path / "run" / "checkpoints").exists()


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
    # listed with the run's other health alarms (and marked on the held-out timeline's image)
    alarms = page.split("Health alarms</h2>")[1].split("</ul>")[0]
    assert "step 2: canary &#x27;answer_in_thinking&#x27; of weak_arithmetic" in alarms


class _Samples(HTMLParser):
    def __init__(self):
        super().__init__()
        self.samples: list[dict] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and attrs.get("class") == "sample":
            self.samples.append(attrs)


def test_palestra_audit_writes_a_page_holding_the_sampled_rows(stopped_then_resumed, tmp_path, capsys):
    folder, _, summary = stopped_then_resumed
    page = tmp_path / "audit.html"
    args = ["audit", "--db", _store(folder), "--run", summary["run_id"], "--size", "6", "--seed", "3",
            "--out", str(page), "--workers", "1"]
    capsys.readouterr()
    assert cli(args) == 0
    assert capsys.readouterr().out.startswith(f"{page}: 6 rewarded completions, ")
    parser = _Samples()
    parser.feed(page.read_text(encoding="utf-8"))
    with StatsStore(_store(folder)) as store:
        stored = {r["id"]: r for r in store.results(summary["run_id"])}
    assert len(parser.samples) == 6
    for sample in parser.samples:
        row = stored[int(sample["data-result-id"])]
        assert row["reward"] > 0 and float(sample["data-reward"]) == row["reward"]
        assert (sample["data-domain"], int(sample["data-step"])) == (row["domain"], row["step"])
    # both halves of the run are sampled, and the same seed draws the same rows
    assert {int(s["data-step"]) <= 2 for s in parser.samples} == {True, False}
    assert cli(args[:-4] + ["--out", str(tmp_path / "again.html"), "--workers", "1"]) == 0
    again = _Samples()
    again.feed((tmp_path / "again.html").read_text(encoding="utf-8"))
    assert [s["data-result-id"] for s in again.samples] == [s["data-result-id"] for s in parser.samples]
    assert "http" not in page.read_text(encoding="utf-8")  # nothing fetched: one self-contained file


def test_the_canary_check_leaves_training_as_it_was(tmp_path):
    outcomes = []
    for checks in ({"at_start": False}, {"at_start": True, "every": 1}):
        folder = tmp_path / str(len(outcomes))
        summary = run(config(folder, ["arithmetic", "weak_verifier:DIGIT_SHARE"], steps=2, audit=checks))
        with StatsStore(_store(folder / "run")) as store:
            rows = store.results(summary["run_id"])
        outcomes.append(([(r["task_id"], r["completion"], r["reward"]) for r in rows], summary["after"]))
    assert outcomes[0] == outcomes[1]


def _stored_run(tmp_path):
    """A store holding a run of arithmetic written step by step: rewards low at steps 1-2 and high
    at 3-4 while held-out success falls from step 2 to 4; one rewarded answer far shorter than the
    references, and one completion rewarded on three different tasks."""
    import random

    import numpy as np

    from curriculum.types import Outcome, Plan
    from domains.registry import load

    arithmetic = load("arithmetic")
    tasks = arithmetic.sample(3, 12, random.Random(0))
    store = StatsStore(f"sqlite:///{tmp_path / 'flags.db'}")
    run_id = store.start_run("flags", {"domains": ["arithmetic"]}, seed=0)
    for step in range(1, 5):
        outcomes = []
        for i, task in enumerate(tasks[3 * (step - 1):3 * step]):
            reward = float(step >= 3 or i == 0)
            completion = arithmetic.reference(task) if reward else "no idea"
            if (step, i) == (1, 0):
                completion = str(task.payload["answer"])  # rewarded, yet a third of a reference's length
            if step == 4:
                completion = "the same text"  # rewarded on the three tasks of step 4
            outcomes.append(Outcome("arithmetic", 3, task.id, i, reward, reward == 1.0, "ok" if reward else "wrong",
                                    prompt_hash=task.id, completion_hash=f"{step}-{i}" if step < 4 else "same",
                                    completion=completion))
        plan = Plan(step, ["arithmetic"], np.array([1.0]), np.array([3]), {("arithmetic", 3): 3})
        store.write_step(run_id, step, plan, outcomes, {"loss": 0.0},
                         tasks={t.id: t.to_json() for t in tasks[3 * (step - 1):3 * step]})
    for step, heldout in ((0, 0.5), (2, 0.6), (4, 0.3)):
        store.merge_metrics(run_id, step, {"heldout/macro": heldout, "heldout/arithmetic": heldout})
    return store, run_id


def test_the_audit_flags_short_repeated_and_diverging_rewards(tmp_path):
    from curriculum.audit import build_audit

    store, run_id = _stored_run(tmp_path)
    with store:
        audit = build_audit(store, run_id, size=100, seed=0, workers=1)
    assert [(d["domain"], d["from_step"], d["to_step"]) for d in audit.divergences] == [("arithmetic", 2, 4)]
    assert audit.repeated == {"same": (3, "the same text")}
    assert audit.strata == {("arithmetic", 3, "early"): 2, ("arithmetic", 3, "late"): 6}
    flags = {(s.row["step"], s.row["group_index"]): " | ".join(s.flags) for s in audit.samples}
    assert flags[(1, 0)].startswith("short: ") and "re-verified reward 0.000 differs" in flags[(1, 0)]
    assert all(flags[(4, i)].startswith("repeated: rewarded on 3 different tasks | diverging") for i in range(3))
    assert all(flags[(3, i)].startswith("diverging: reward rose while held-out success fell (steps 2-4)")
               for i in range(3))
    assert flags[(2, 0)] == ""  # a reference's own answer, re-verified as rewarded: nothing to look at
