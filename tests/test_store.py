"""StatsStore: idempotent per-step writes, one transaction per step, schema-version refusal.

Runs on SQLite in tmp_path; when PALESTRA_TEST_PG_URL is set, every store test runs against that
PostgreSQL database as well (its tables are dropped and recreated for each test).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from sqlalchemy import event, text, update

from curriculum.config import StoreConfig
from curriculum.schema import SCHEMA_VERSION, MetaRow
from curriculum.store import SchemaVersionError, StatsStore
from curriculum.types import Outcome, Plan
from databases import DATABASES, empty_database

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.fixture(params=DATABASES)
def store_url(request, tmp_path) -> str:
    return empty_database(request.param, tmp_path)


@pytest.fixture
def store(store_url):
    s = StatsStore(store_url)
    yield s
    s.close()


def _plan(step: int, domains=("math", "code")) -> Plan:
    return Plan(step=step, domains=list(domains), weights=np.array([0.75, 0.25]), levels=np.array([1, 2]),
                counts={("math", 1): 3, ("code", 2): 1})


def _outcomes(step: int) -> list[Outcome]:
    # 2 groups of 2 completions in math (one mixed, one all-correct) and 1 group of 2 in code (all wrong)
    spec = [("math", 1, 0, 1.0, 0.7), ("math", 1, 0, 0.0, -0.7), ("math", 1, 1, 1.0, 0.0),
            ("math", 1, 1, 1.0, 0.0), ("code", 2, 2, 0.0, 0.0), ("code", 2, 2, 0.0, 0.0)]
    return [Outcome(domain=d, level=lv, task_id=f"{d}-{g}", group=g, reward=r, correct=r > 0.5,
                    status="ok" if r > 0.5 else "wrong", advantage=a, prompt_hash=f"p{g}",
                    completion_hash=f"c{step}{i}", latency_s=0.01 * i,
                    completion=f"step {step} answer {i} " * 20, verifier_version="v1")
            for i, (d, lv, g, r, a) in enumerate(spec)]


def test_run_lifecycle(store):
    run_id = store.start_run("demo", {"policy": {"type": "uniform"}}, seed=7, sweep_id="sw1")
    [row] = store.runs()
    assert row["id"] == run_id and row["name"] == "demo" and row["sweep_id"] == "sw1"
    assert row["status"] == "running" and row["seed"] == 7 and row["last_step"] == -1
    store.write_step(run_id, 0, _plan(0), _outcomes(0), {"loss": 0.5})
    store.finish_run(run_id, "finished")
    full = store.run(run_id)
    assert full["status"] == "finished" and full["finished_at"] is not None
    assert full["config"] == {"policy": {"type": "uniform"}} and full["last_step"] == 0


def test_write_step_round_trips_results_and_aggregates(store):
    run_id = store.start_run("demo", {}, seed=0)
    metrics = {"loss": np.float32(1.25), "bad": float("nan"), "per_domain": {"math": np.float64(0.5)}}
    store.write_step(run_id, 3, _plan(3), _outcomes(3), metrics)
    results = store.results(run_id, step=3)
    assert len(results) == 6 and store.count_results(run_id) == 6
    first = results[0]
    assert first["completion"] == "step 3 answer 0 " * 20  # decompressed on the way out
    assert first["domain"] == "math" and first["group_index"] == 0 and first["correct"] is True
    assert first["verifier_version"] == "v1" and first["advantage"] == pytest.approx(0.7)
    stats = {(r["domain"], r["level"]): r for r in store.step_stats(run_id)}
    math_stats = stats[("math", 1)]
    # 4 attempts, 3 correct; |A| = 0.7 + 0.7 + 0 + 0 -> mean 0.35; group 1 is all-correct
    assert (math_stats["attempts"], math_stats["successes"], math_stats["groups"]) == (4, 3, 2)
    assert math_stats["mean_abs_adv"] == pytest.approx(0.35) and math_stats["zero_var_groups"] == 1
    assert stats[("code", 2)]["zero_var_groups"] == 1 and stats[("code", 2)]["successes"] == 0
    plans = {r["domain"]: r for r in store.plans(run_id)}
    assert plans["math"]["n_prompts"] == 3 and plans["code"]["level"] == 2
    assert plans["math"]["weight"] == pytest.approx(0.75)
    [vec] = store.plan_vectors(run_id)
    assert vec["domains"] == ["math", "code"] and vec["weights"] == [0.75, 0.25] and vec["levels"] == [1, 2]
    [stored] = store.metrics(run_id)
    assert stored["loss"] == 1.25 and stored["bad"] is None  # NaN is stored as null (portable JSON)
    assert stored["per_domain"] == {"math": 0.5}


def test_rewriting_a_step_replaces_it(store):
    run_id = store.start_run("demo", {}, seed=0)
    for step in range(3):
        store.write_step(run_id, step, _plan(step), _outcomes(step), {"loss": 1.0})
    before = (store.count_results(run_id), len(store.step_stats(run_id)), len(store.plans(run_id)),
              len(store.metrics(run_id)), len(store.plan_vectors(run_id)))
    store.write_step(run_id, 1, _plan(1), _outcomes(1), {"loss": 2.0})  # a resumed run replays step 1
    after = (store.count_results(run_id), len(store.step_stats(run_id)), len(store.plans(run_id)),
             len(store.metrics(run_id)), len(store.plan_vectors(run_id)))
    assert after == before == (18, 6, 6, 3, 3)
    assert [m["loss"] for m in store.metrics(run_id)] == [1.0, 2.0, 1.0]
    summary = {r["domain"]: r for r in store.domain_summary(run_id)}
    assert summary["math"]["attempts"] == 12 and summary["math"]["successes"] == 9
    assert summary["math"]["success_rate"] == pytest.approx(0.75) and summary["math"]["weight"] == 0.75
    assert summary["code"]["level"] == 2
    assert store.runs()[0]["last_step"] == 2  # re-writing an older step does not move last_step back


def test_one_transaction_per_step(store):
    run_id = store.start_run("demo", {}, seed=0)
    commits = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    store.write_step(run_id, 0, _plan(0), _outcomes(0), {"loss": 1.0})
    assert len(commits) == 1


def test_a_failed_step_write_leaves_the_old_rows(store):
    run_id = store.start_run("demo", {}, seed=0)
    store.write_step(run_id, 0, _plan(0), _outcomes(0))

    def fail_on_plans(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO STEP_ARRAYS"):
            raise RuntimeError("disk full")

    event.listen(store.engine, "before_cursor_execute", fail_on_plans)
    with pytest.raises(RuntimeError, match="disk full"):
        store.write_step(run_id, 0, _plan(0), _outcomes(0)[:2])  # results deleted + inserted, then boom
    event.remove(store.engine, "before_cursor_execute", fail_on_plans)
    assert store.count_results(run_id) == 6  # the delete and the new rows were rolled back together
    assert len(store.plans(run_id)) == 2


def test_newer_schema_is_refused(store_url):
    store = StatsStore(store_url)
    assert store.schema_version == SCHEMA_VERSION
    with store.engine.begin() as conn:
        conn.execute(update(MetaRow).where(MetaRow.key == "schema_version").values(value="99"))
    store.close()
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        StatsStore(store_url)


def test_reopening_keeps_data(store_url):
    store = StatsStore(store_url)
    run_id = store.start_run("demo", {}, seed=0)
    store.write_step(run_id, 0, _plan(0), _outcomes(0))
    store.close()
    again = StatsStore(store_url)
    assert again.count_results(run_id) == 6 and again.schema_version == SCHEMA_VERSION
    again.close()


def test_sqlite_uses_wal_and_a_busy_timeout(tmp_path):
    store = StatsStore(f"sqlite:///{tmp_path / 'p.db'}")
    with store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar().lower() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 1000
    store.close()


def test_two_runs_are_kept_apart(store):
    a = store.start_run("a", {}, seed=1)
    b = store.start_run("b", {}, seed=2)
    store.write_step(a, 0, _plan(0), _outcomes(0))
    store.write_step(b, 0, _plan(0), _outcomes(0)[:2])
    assert store.count_results(a) == 6 and store.count_results(b) == 2
    assert {r["name"] for r in store.runs()} == {"a", "b"}


def test_store_yaml_validates():
    for path in sorted((CONF / "store").glob("*.yaml")):
        StoreConfig.model_validate(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    assert StoreConfig.model_validate({"url": None}).url is None
    with pytest.raises(Exception):
        StoreConfig.model_validate({"uri": "sqlite://"})


def test_metrics_values_are_stored_as_plain_json():
    import torch

    from curriculum.store import _plain

    plain = _plain({"loss": torch.tensor(0.5), "n": np.int64(3), "one": torch.tensor([7]), "bad": float("nan"),
                    "nested": {"x": np.float32(1.5)}, "vector": torch.tensor([1.0, 2.0])})
    assert plain == {"loss": 0.5, "n": 3, "one": 7, "bad": None, "nested": {"x": 1.5}, "vector": "tensor([1., 2.])"}


def test_a_store_that_cannot_be_opened_is_one_line_naming_it_without_its_password(tmp_path):
    from curriculum.store import StoreUnavailable

    with pytest.raises(StoreUnavailable, match=r"^cannot open the stats store postgresql\+psycopg://u:\*\*\*@127\.0\.0\.1:1/x: "
                                               r"connection failed") as info:
        StatsStore("postgresql+psycopg://u:secret@127.0.0.1:1/x")  # nothing listens on port 1
    assert "secret" not in str(info.value) and "\n" not in str(info.value)


def test_a_run_is_stored_without_the_password_in_its_store_url(tmp_path):
    with StatsStore(f"sqlite:///{tmp_path / 'x.db'}") as store:
        config = {"seed": 1, "store": {"url": "postgresql+psycopg://me:secret@db:5432/runs"}}
        run_id = store.start_run("demo", config, seed=1)
        assert store.run(run_id)["config"] == {"seed": 1, "store": {"url": "postgresql+psycopg://me:***@db:5432/runs"}}
        mistyped = store.start_run("demo", {"store": {"url": "postgres ql://me:secret@db"}}, seed=1)
        assert store.run(mistyped)["config"]["store"]["url"] == "postgres ql://***@db"
        # an unescaped @ in the password: SQLAlchemy would take "ss@db" for the host
        at_sign = store.start_run("demo", {"store": {"url": "postgresql://me:p@ss@db/runs"}}, seed=1)
        assert store.run(at_sign)["config"]["store"]["url"] == "postgresql://***@db/runs"
        assert config["store"]["url"].endswith("secret@db:5432/runs")  # the caller's config is left as it was


def test_the_default_store_url_is_an_absolute_sqlite_file_in_the_folder(tmp_path, monkeypatch):
    from curriculum.store import default_store_url

    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    expected = f"sqlite:///{(tmp_path / 'real').resolve() / 'palestra.db'}"
    assert default_store_url("link") == default_store_url(tmp_path / "real") == expected
    assert not (tmp_path / "out").exists() and default_store_url("out").endswith("/out/palestra.db")  # creates nothing
    with StatsStore(default_store_url("real")) as store:
        assert store.run(store.start_run("demo", {}, seed=0))["name"] == "demo"
    assert (tmp_path / "real" / "palestra.db").is_file()
