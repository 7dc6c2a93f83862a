"""Many writers on one store lose nothing; transient failures are retried; outages end clearly."""
from __future__ import annotations

import multiprocessing as mp
import sqlite3
import threading
import time

import numpy as np
import pytest
from sqlalchemy import event, text

from curriculum.prompts import step_deltas
from curriculum.schema import make_engine
from curriculum.store import StatsStore, StoreUnavailable
from curriculum.types import Outcome, Plan
from databases import DATABASES, PG_URL, empty_database, needs_pg

WRITERS, STEPS, PER_STEP = 4, 20, 500  # 4 writers x 10,000 results


@pytest.fixture(params=DATABASES)
def url(request, tmp_path) -> str:
    return empty_database(request.param, tmp_path, "shared.db")


def _plan(step: int) -> Plan:
    return Plan(step=step, domains=["a", "b"], weights=np.array([0.5, 0.5]), levels=np.array([1, 1]),
                counts={("a", 1): 1, ("b", 1): 1})


def _outcomes(writer: int, step: int) -> list[Outcome]:
    return [Outcome(domain="ab"[i % 2], level=1, task_id=f"w{writer}s{step}i{i}", group=i // 8, reward=float(i % 3 == 0),
                    correct=i % 3 == 0, status="ok", completion=f"answer {i}") for i in range(PER_STEP)]


def _writer(url: str, writer: int, run_ids) -> None:
    store = StatsStore(url)
    run_id = store.start_run(f"writer{writer}", {}, seed=writer, sweep_id="concurrency")
    run_ids.append(run_id)
    for step in range(1, STEPS + 1):
        store.write_step(run_id, step, _plan(step), _outcomes(writer, step))
    store.finish_run(run_id)
    store.close()


def test_four_writer_processes_lose_nothing(url):
    StatsStore(url).close()  # create the schema once, as the first run of a sweep would
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        run_ids = manager.list()
        procs = [ctx.Process(target=_writer, args=(url, w, run_ids)) for w in range(WRITERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        assert [p.exitcode for p in procs] == [0] * WRITERS
        ids = list(run_ids)
    with StatsStore(url) as store:
        counts = [store.count_results(r) for r in ids]
        assert counts == [STEPS * PER_STEP] * WRITERS
        assert {r["status"] for r in store.runs()} == {"finished"}


def _short_busy_timeout(store: StatsStore, ms: int) -> None:
    store.engine.dispose()
    event.listen(store.engine, "connect", lambda dbapi_conn, _: dbapi_conn.execute(f"PRAGMA busy_timeout={ms}"))


def test_a_locked_sqlite_file_is_waited_for(tmp_path):
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    store = StatsStore(url)
    run_id = store.start_run("r", {}, seed=0)
    _short_busy_timeout(store, 50)  # so that our retries, not the driver's own wait, do the work
    blocker = sqlite3.connect(tmp_path / "locked.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holding the write lock
    threading.Timer(0.6, blocker.rollback).start()
    store.write_step(run_id, 1, _plan(1), _outcomes(0, 1)[:10])
    assert store.count_results(run_id) == 10
    blocker.close()


@pytest.mark.parametrize("write", ["start_run", "finish_run", "discard_after", "write_prompt_step",
                                   "merge_metrics"])
def test_every_write_waits_out_a_lock(tmp_path, write):
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    store = StatsStore(url)
    run_id = store.start_run("r", {}, seed=0)
    store.write_step(run_id, 1, _plan(1), _outcomes(0, 1)[:10])
    _short_busy_timeout(store, 50)
    blocker = sqlite3.connect(tmp_path / "locked.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN EXCLUSIVE")
    threading.Timer(0.6, blocker.rollback).start()
    deltas = step_deltas(_outcomes(0, 1)[:10])
    actions = {
        "start_run": lambda: store.start_run("second", {}, seed=1),
        "finish_run": lambda: store.finish_run(run_id, "finished"),
        "discard_after": lambda: store.discard_after(run_id, 0),
        "write_prompt_step": lambda: store.write_prompt_step(run_id, 1, deltas),
        "merge_metrics": lambda: store.merge_metrics(run_id, 1, {"heldout/macro": 0.5}),
    }
    actions[write]()
    blocker.close()
    after = {
        "start_run": lambda: len(store.runs()) == 2,
        "finish_run": lambda: store.run(run_id)["status"] == "finished",
        "discard_after": lambda: store.count_results(run_id) == 0,
        "write_prompt_step": lambda: len(store.prompt_stats(run_id)) == len(deltas) > 0,
        "merge_metrics": lambda: store.metrics(run_id)[-1]["heldout/macro"] == 0.5,
    }
    assert after[write]()


def test_a_store_that_stays_locked_fails_with_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'stuck.db'}"
    store = StatsStore(url)
    run_id = store.start_run("r", {}, seed=0)
    store.retry_delays_s = (0.01, 0.02)
    _short_busy_timeout(store, 10)
    blocker = sqlite3.connect(tmp_path / "stuck.db", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="writing step 1 .* failed 3 times: database is locked"):
        store.write_step(run_id, 1, _plan(1), _outcomes(0, 1)[:10])
    assert time.monotonic() - started < 20
    blocker.rollback()
    blocker.close()


@needs_pg
def test_a_dropped_postgres_connection_is_retried(tmp_path):
    store = StatsStore(empty_database("postgresql", tmp_path))
    run_id = store.start_run("r", {}, seed=0)
    store.write_step(run_id, 1, _plan(1), _outcomes(0, 1)[:10])  # the pool now holds a connection
    admin = make_engine(PG_URL)
    with admin.begin() as conn:  # the server drops every other session, as a restart or failover would
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    admin.dispose()
    store.write_step(run_id, 2, _plan(2), _outcomes(0, 2)[:10])
    assert store.count_results(run_id) == 20


def test_a_reader_inside_a_query_does_not_block_a_writer(tmp_path):
    # dashboards and `palestra stats/compare/replay` read a sweep's database while runs write to it
    store = StatsStore(f"sqlite:///{tmp_path / 'live.db'}")
    run_id = store.start_run("r", {}, seed=0)
    writer = sqlite3.connect(tmp_path / "live.db", timeout=0.2, isolation_level=None)
    with store.reader.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 1  # a read transaction is open
        writer.execute("BEGIN IMMEDIATE")  # would wait 0.2 s and fail if the reader held the write lock
        writer.execute("UPDATE runs SET name = 'renamed'")
        writer.execute("COMMIT")
    assert store.run(run_id)["name"] == "renamed"
    writer.close()
