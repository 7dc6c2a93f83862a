"""`palestra merge`: runs stored apart (each run folder with its own palestra.db) copied into one
store, every row of every per-run table, then compared as one sweep; and the merges it refuses.

The two sources are a simulated run written today (schema version 2, with results rows) and the
version-1 fixture (plans and statistics as rows, no step_arrays table), in a run folder.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select

from curriculum.cli import main
from curriculum.config import parse_difficulty, parse_policy
from curriculum.schema import RunRow
from curriculum.sim.config import ScenarioConfig, SimAppConfig
from curriculum.sim.runner import run_sim
from curriculum.store import StatsStore
from curriculum.store_merge import run_tables, store_url

FIXTURE = Path(__file__).parent / "fixtures" / "store_v1.db"  # learnability, seed 0, 6 steps
# the fixture's scenario, so a uniform run of it pairs with the fixture in `palestra compare`
SIM = dict(name="small", domains=4, levels=5, steps=6, prompts_per_step=6, group_size=4, cluster_size=10,
           transfer_neg=0.0, negative_pairs=0, forgetting_share=0.0, unlearnable_share=0.0, noisy_share=0.0,
           prerequisite_share=0.0, size_min=0, size_max=0)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[str, str]:
    """A SQLite file holding a simulated uniform run, and a run folder holding the v1 fixture."""
    root = tmp_path_factory.mktemp("sources")
    new = root / "uniform.db"
    cfg = SimAppConfig(sim=ScenarioConfig(**SIM), policy=parse_policy({"type": "uniform"}),
                       difficulty=parse_difficulty({"type": "threshold"}), store_results=True, sweep_id="a")
    with StatsStore(f"sqlite:///{new}") as store:
        run_sim(cfg, store)
    (root / "v1-run").mkdir()
    shutil.copy(FIXTURE, root / "v1-run" / "palestra.db")
    return str(new), str(root / "v1-run")


def run_ids(source: str) -> list[str]:
    with StatsStore(store_url(source), create=False) as store:
        return [r["id"] for r in store.runs()]


def row_counts(url: str, run_id: str) -> dict[str, int]:
    """Rows of the run in every per-run table (0 where the store has no such table)."""
    with StatsStore(url, create=False) as store, store.reader.connect() as conn:
        names = set(inspect(conn).get_table_names())
        counts = {}
        for t in run_tables():
            key = t.c.id if t.name == RunRow.__tablename__ else t.c.run_id
            query = select(func.count()).select_from(t).where(key == run_id)
            counts[t.name] = conn.execute(query).scalar() if t.name in names else 0
    return counts


def readings(url: str, run_id: str) -> dict:
    """What the analysis reads of a run, without its run id and the results' own ids."""
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("id", "run_id")} for r in rows]  # noqa: E731
    with StatsStore(url, create=False) as store:
        run = store.run(run_id)
        return {"run": {k: v for k, v in run.items() if k != "sweep_id"}, "step_stats": strip(store.step_stats(run_id)),
                "plans": strip(store.plans(run_id)), "metrics": store.metrics(run_id),
                "results": strip(store.results(run_id)), "tasks": store.tasks(run_id)}


def test_merged_runs_keep_every_row_and_compare_as_one_sweep(sources, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("curriculum.store_merge.BATCH_ROWS", 50)  # a run's results in several batches
    into = tmp_path / "merged.db"
    assert main(["merge", "--into", str(into), "--sweep", "both", *sources]) == 0
    copied = [*run_ids(sources[0]), *run_ids(sources[1])]
    assert capsys.readouterr().out.splitlines() == [*copied, f"copied 2 runs into sqlite:///{into} under sweep both"]
    url = f"sqlite:///{into}"
    for source, run_id in zip(sources, copied):
        counts = row_counts(store_url(source), run_id)
        assert counts["results"] > 0 and counts["metrics"] > 0
        assert row_counts(url, run_id) == counts
        assert readings(url, run_id) == readings(store_url(source), run_id)
    v1_counts = row_counts(store_url(sources[1]), copied[1])
    assert v1_counts["step_stats"] > 0 and v1_counts["plans"] > 0  # the version-1 rows came along
    with StatsStore(url, create=False) as store:
        assert sorted(r["id"] for r in store.sweep_runs("both")) == sorted(copied)  # by start time
    with StatsStore(store_url(sources[0]), create=False) as store:
        assert store.run(copied[0])["sweep_id"] == "a"  # the source is left as it was
    assert main(["compare", "--db", url, "--sweep", "both", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"uniform", "learnability"}
    assert out["policies"]["learnability"]["auc"]["pairs"] == 1


def test_only_the_named_runs_are_copied_and_keep_their_sweep(sources, tmp_path):
    [wanted] = run_ids(sources[1])
    into = tmp_path / "one.db"
    assert main(["merge", "--into", f"sqlite:///{into}", "--run", wanted, *sources]) == 0
    with StatsStore(f"sqlite:///{into}", create=False) as store:
        assert [(r["id"], r["sweep_id"]) for r in store.runs()] == [(wanted, "v1-fixture")]


def test_a_run_already_there_fails_the_merge_before_anything_is_written(sources, tmp_path, capsys):
    into = tmp_path / "merged.db"
    assert main(["merge", "--into", str(into), sources[0]]) == 0
    [present] = run_ids(sources[0])
    assert main(["merge", "--into", str(into), *sources]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: run {present} is already in sqlite:///{into}; nothing was copied")
    assert err.count("\n") == 1
    assert run_ids(str(into)) == [present]  # the other source's run was not copied either


def test_a_missing_source_or_run_fails_and_leaves_no_store_behind(sources, tmp_path, capsys):
    into = tmp_path / "new.db"
    missing = tmp_path / "nowhere" / "palestra.db"
    assert main(["merge", "--into", str(into), sources[0], str(missing)]) == 2
    assert capsys.readouterr().err == f"error: no database at {missing}\n"
    assert main(["merge", "--into", str(into), "--run", "no-such-run", *sources]) == 2
    assert capsys.readouterr().err == "error: run no-such-run is in none of the sources; nothing was copied\n"
    assert main(["merge", "--into", str(into), sources[0], sources[0]]) == 2
    assert "is in more than one source; nothing was copied" in capsys.readouterr().err
    assert not into.exists()
