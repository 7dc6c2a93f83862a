"""StatsStore: the run database (SQLAlchemy 2; SQLite by default, any SQLAlchemy URL otherwise).

Everything the scheduler learns from lives here: one row per verified completion, per-step
aggregates per (domain, level), the plan of every step, the trainer's scalar metrics, and the runs
themselves. The SQL is portable (no SQLite-only features) so the same code runs on PostgreSQL
(``postgresql+psycopg://...``) for sweeps that write from many machines.

The tables are in ``curriculum.schema``. This module opens the database and writes to it; the
queries are in ``curriculum.store_read`` (mixed into ``StatsStore``), the per-prompt totals in
``curriculum.store_prompts``, the step statistics in ``curriculum.cells`` and the URL helpers in
``curriculum.store_urls`` (their public names are importable from here too).

Writes are batched: ``write_step`` is one transaction per step, and it replaces whatever that
(run, step) held before (delete, then insert), so a resumed run that replays a step never counts
it twice.
"""
from __future__ import annotations

import json
import math
import time
import uuid
import zlib
from datetime import datetime, timezone
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, insert, inspect, select, update
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

from curriculum.cells import aggregate_outcomes
from curriculum.migrations import upgrade
from curriculum.schema import (
    SCHEMA_VERSION,
    STEP_TABLES,
    Base,
    MetaRow,
    MetricRow,
    PromptStatRow,
    PromptStepRow,
    ResultRow,
    RunDomainsRow,
    RunRow,
    StepArrayRow,
    TaskRow,
    make_engine,
)
from curriculum.store_prompts import (
    empty_prompt_total,
    fold_deltas,
    fold_prompt_delta,
    prompt_totals_from_steps,
    replace_prompt_totals,
    stale_prompts,
    stored_prompt_totals,
)
from curriculum.store_arrays import encode_step
from curriculum.store_read import StoreReads
from curriculum.store_urls import URL_HINT, default_store_url, shown_url, without_password
from domains.api import one_line

# The public names, the ones re-exported from the modules above included.
__all__ = ["RESULT_COLUMNS", "SchemaVersionError", "StatsStore", "StoreUnavailable", "aggregate_outcomes",
           "default_store_url", "empty_prompt_total", "fold_prompt_delta", "shown_url", "without_password"]

if TYPE_CHECKING:
    from curriculum.types import Outcome, Plan

# Positional placeholder per DB-API paramstyle, for the multi-row inserts of write_step.
_PLACEHOLDER = {"qmark": "?", "format": "%s", "pyformat": "%s"}
_MAX_PARAMS = 999  # host parameters per statement: the smallest limit of any SQLite build


class StoreUnavailable(RuntimeError):
    """The database stayed unreachable (or locked) through every retry."""


class SchemaVersionError(RuntimeError):
    """The database was written by a newer Palestra than this one."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _compress(text: str) -> bytes:
    # Level 1 and a 4 KiB window: the write sits on the step's hot path, and zlib's default 256 KiB
    # state costs more to allocate than compressing a completion does. zlib.decompress reads the
    # window size from the header, so readers need no options.
    packer = zlib.compressobj(1, zlib.DEFLATED, 12, 1)
    return packer.compress(text.encode("utf-8")) + packer.flush()


class StatsStore(StoreReads):
    """The run database. ``url`` is any SQLAlchemy URL (``sqlite:///path.db`` by default use)."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        """``create=False`` opens an existing store only: a database without Palestra's tables is
        refused, and nothing is written to it (the CLI's read-only commands)."""
        self.url = url
        try:
            self.engine = make_engine(url, writer=create)
        except (ArgumentError, ImportError, ValueError) as exc:  # unparseable URL or port, unknown backend, no driver
            hint = URL_HINT if "://" not in url and "@" not in url else ""
            raise StoreUnavailable(f"cannot open the stats store {shown_url(url)}: {one_line(exc)}{hint}") from None
        self.reader = self.engine.execution_options(read_only=True)  # same pool; SQLite reads take no write lock
        # ~15 s of back-off in all: rides out a busy file or a server restart, not an outage
        self.retry_delays_s: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0)
        self._insert_cache: dict[tuple, str] = {}
        self._domains_known: dict[str, list[str]] = {}  # run -> its stored domain list (run_domains)
        if create:
            self._create_schema()
        else:
            self._require_schema()

    def _sqlite_file(self) -> Path | None:
        database = self.engine.url.database if self.engine.dialect.name == "sqlite" else None
        return Path(database) if database not in (None, "", ":memory:") else None

    @property
    def safe_url(self) -> str:
        """The URL for messages: a server password shows as ***."""
        return self.engine.url.render_as_string(hide_password=True)

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        reason = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
        return StoreUnavailable(f"cannot open the stats store {self.safe_url}: {one_line(reason)}")

    def _not_a_store(self, why: str) -> StoreUnavailable:
        return StoreUnavailable(f"{self.safe_url} holds no Palestra stats store ({why}); it was left as it was")

    def _create_schema(self, attempts: int = 4) -> None:
        # Runs of a sweep may open a fresh database at the same moment: one of them loses the race
        # to create a table or the version row, and simply looks again.
        for attempt in range(attempts):
            try:
                Base.metadata.create_all(self.engine)
                self._check_schema_version(create=True)
                return
            except DBAPIError as exc:  # also no server, bad credentials, an unwritable file, not a database
                if attempt == attempts - 1:
                    raise self._unavailable(exc) from exc
                time.sleep(0.1 * (attempt + 1))

    def _require_schema(self) -> None:
        path = self._sqlite_file()
        if path is not None and not path.is_file():  # connecting would create it, empty
            raise StoreUnavailable(f"no database at {path}")
        try:
            with self.reader.connect() as conn:  # a read: no write lock to wait for
                found = inspect(conn).has_table(MetaRow.__tablename__)
            if found:
                self._check_schema_version(create=False)
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc
        if not found:
            raise self._not_a_store(f"it has no {MetaRow.__tablename__} table")

    # -- schema -------------------------------------------------------------------------------
    def _check_schema_version(self, create: bool) -> None:
        with (self.engine.begin() if create else self.reader.connect()) as conn:
            found = conn.execute(select(MetaRow.value).where(MetaRow.key == "schema_version")).scalar()
            if found is None and create:
                conn.execute(insert(MetaRow).values(key="schema_version", value=str(SCHEMA_VERSION)))
                found = SCHEMA_VERSION
            elif found is not None and create and int(found) < SCHEMA_VERSION:
                upgrade(conn, int(found))
                found = SCHEMA_VERSION
        if found is None:
            raise self._not_a_store("no schema version")
        if int(found) > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"database {self.safe_url!r} has schema version {found}, newer than this Palestra "
                f"understands ({SCHEMA_VERSION}); upgrade Palestra or use another database"
            )
        self.layout_version = int(found)  # what the readers may find (a read-only open upgrades nothing)

    @property
    def schema_version(self) -> int:
        with self.reader.connect() as conn:
            return int(conn.execute(select(MetaRow.value).where(MetaRow.key == "schema_version")).scalar())

    # -- runs ---------------------------------------------------------------------------------
    def start_run(self, name: str, config: dict, seed: int, sweep_id: str | None = None) -> str:
        run_id = str(uuid.uuid4())
        row = dict(id=run_id, name=name, sweep_id=sweep_id, config=without_password(config), seed=int(seed),
                   status="running", started_at=_now(), finished_at=None, last_step=-1)

        def insert_run() -> None:
            with self.engine.begin() as conn:
                conn.execute(insert(RunRow), [row])

        self._retrying("starting a run", insert_run)
        return run_id

    def finish_run(self, run_id: str, status: str = "finished") -> None:
        def mark() -> None:
            with self.engine.begin() as conn:
                conn.execute(update(RunRow).where(RunRow.id == run_id).values(status=status, finished_at=_now()))

        self._retrying(f"marking run {run_id} {status}", mark)

    # -- the per-step write -------------------------------------------------------------------
    def write_step(self, run_id: str, step: int, plan: "Plan", outcomes: "list[Outcome]",
                   metrics: dict | None = None, step_stats: list[dict] | None = None,
                   tasks: dict[str, dict] | None = None) -> None:
        """Replace everything stored for (run_id, step) in ONE transaction.

        ``step_stats`` (per (domain, level) aggregates) is computed from ``outcomes`` when not
        given; the scheduler passes the ones it already computed so both views agree exactly.
        ``tasks`` (task JSON by id) are stored for replay, unless the run already has them.
        Transient failures (a busy SQLite file, a dropped server connection) are retried with
        back-off; a store that stays unreachable raises StoreUnavailable.
        """
        stats = step_stats if step_stats is not None else aggregate_outcomes(outcomes)
        result_rows = _ResultColumns([_result_row(run_id, step, o) for o in outcomes])
        arrays = {"run_id": run_id, "step": step, **encode_step(plan, stats)}
        self._retrying(f"writing step {step}",
                       lambda: self._write_step_once(run_id, step, plan.domains, metrics, result_rows, arrays, tasks))
        self._domains_known[run_id] = list(plan.domains)  # committed: later steps need not look

    def _retrying(self, what: str, action: Any) -> Any:
        for delay in (*self.retry_delays_s, None):
            try:
                return action()
            except (OperationalError, InterfaceError) as exc:  # locked, busy, connection lost
                if delay is None:
                    raise StoreUnavailable(
                        f"{what} to {self.safe_url} failed "
                        f"{len(self.retry_delays_s) + 1} times: {one_line(exc.orig or exc)}"
                    ) from exc
                if getattr(exc, "connection_invalidated", False):
                    self.engine.dispose()  # drop the pool's dead connections before trying again
                time.sleep(delay)

    def _write_step_once(self, run_id, step, domains, metrics, result_rows, arrays, tasks) -> None:
        with self.engine.begin() as conn:
            if tasks:
                self._insert_new_tasks(conn, run_id, tasks)
            self._note_domains(conn, run_id, domains)
            for table in STEP_TABLES:  # delete first: re-writing a step replaces it
                conn.execute(delete(table).where(table.run_id == run_id, table.step == step))
            self._bulk_insert(conn, ResultRow, result_rows)
            conn.execute(insert(StepArrayRow), [arrays])
            if metrics is not None:
                conn.execute(insert(MetricRow), [{"run_id": run_id, "step": step, "values": _plain(metrics)}])
            conn.execute(update(RunRow).where(RunRow.id == run_id, RunRow.last_step < step)
                         .values(last_step=step))

    def _note_domains(self, conn: Any, run_id: str, domains: list[str]) -> None:
        """Store the run's domain list with its first step; every later step must plan the same."""
        if self._domains_known.get(run_id) == domains:
            return
        stored = conn.execute(select(RunDomainsRow.domains).where(RunDomainsRow.run_id == run_id)).scalar()
        if stored is None:
            conn.execute(insert(RunDomainsRow), [{"run_id": run_id, "domains": list(domains)}])
        elif list(stored) != list(domains):
            raise ValueError(f"run {run_id} was stored with other domains than this step's plan")

    def _bulk_insert(self, conn: Any, table: type[Base], rows: list) -> None:
        """Insert many rows with multi-row ``INSERT ... VALUES (...), (...)`` statements.

        Why not ``conn.execute(insert(table), rows)``: SQLAlchemy's executemany spends ~10 us per
        row building parameters, and SQLite's own executemany re-runs the statement per row; one
        statement per few dozen rows is about three times faster, which at 512 completions a step
        is most of the write. The values are already plain Python (str, int, float, bool, bytes)
        that the drivers take as they are. Drivers with an unusual paramstyle take the plain path.
        """
        if not rows:
            return
        if isinstance(rows, _ResultColumns):  # already tuples, in RESULT_COLUMNS order
            columns, tuples = RESULT_COLUMNS, list(rows)
        else:
            columns = tuple(rows[0])
            tuples = [tuple(r[c] for c in columns) for r in rows]
        mark = _PLACEHOLDER.get(self.engine.dialect.paramstyle)
        if mark is None:
            conn.execute(insert(table), [dict(zip(columns, t)) for t in tuples])
            return
        per = max(1, _MAX_PARAMS // len(columns))
        for k in range(0, len(tuples), per):
            chunk = tuples[k:k + per]
            sql = self._values_sql(table, columns, len(chunk), mark)
            conn.exec_driver_sql(sql, tuple(chain.from_iterable(chunk)))

    def _values_sql(self, table: type[Base], columns: tuple[str, ...], n_rows: int, mark: str) -> str:
        key = (table.__tablename__, columns, n_rows)
        if key not in self._insert_cache:
            quote = self.engine.dialect.identifier_preparer.quote
            group = "(" + ", ".join([mark] * len(columns)) + ")"
            self._insert_cache[key] = (f"INSERT INTO {quote(table.__tablename__)} "
                                       f"({', '.join(quote(c) for c in columns)}) VALUES "
                                       + ", ".join([group] * n_rows))
        return self._insert_cache[key]

    def _insert_new_tasks(self, conn: Any, run_id: str, tasks: dict[str, dict]) -> None:
        """Store task JSON by id; ids already stored for the run are left as they are."""
        ids = list(tasks)
        known = set(conn.execute(select(TaskRow.task_id).where(
            TaskRow.run_id == run_id, TaskRow.task_id.in_(ids))).scalars())
        rows = [{"run_id": run_id, "task_id": i, "task": _compress(json.dumps(tasks[i]))} for i in ids
                if i not in known]
        if rows:
            conn.execute(insert(TaskRow), rows)

    def discard_after(self, run_id: str, step: int) -> int:
        """Delete every step after ``step`` (a resume from a checkpoint taken at ``step`` redoes
        them); returns how many result rows went. One transaction."""
        def discard() -> int:
            with self.engine.begin() as conn:
                gone = conn.execute(select(func.count()).select_from(ResultRow).where(
                    ResultRow.run_id == run_id, ResultRow.step > step)).scalar() or 0
                for table in STEP_TABLES:
                    conn.execute(delete(table).where(table.run_id == run_id, table.step > step))
                conn.execute(update(RunRow).where(RunRow.id == run_id).values(last_step=step, status="running"))
            return int(gone)

        return self._retrying(f"discarding steps after {step}", discard)

    def merge_metrics(self, run_id: str, step: int, values: dict) -> None:
        """Add ``values`` to the metrics stored for (run_id, step), creating the row if needed
        (held-out evaluations land on the step they followed, or on step 0 before training)."""
        def merge() -> None:
            with self.engine.begin() as conn:
                where = (MetricRow.run_id == run_id, MetricRow.step == step)
                stored = conn.execute(select(MetricRow.values).where(*where)).scalar()
                if stored is None:
                    conn.execute(insert(MetricRow), [{"run_id": run_id, "step": step, "values": _plain(values)}])
                else:
                    conn.execute(update(MetricRow).where(*where).values(values={**stored, **_plain(values)}))

        self._retrying(f"writing the metrics of step {step}", merge)

    # -- per-prompt statistics (PromptSelector) -------------------------------------------------
    def write_prompt_step(self, run_id: str, step: int, deltas: list[dict]) -> None:
        """Record one step's per-prompt deltas and fold them into ``prompt_stats``: ONE transaction.

        ``deltas``: dicts with the ``PromptStepRow`` columns but run_id and step (see
        ``curriculum.prompts.step_deltas``). Steps are recorded in order, so recording ``step``
        replaces what the run stored for it and drops anything stored *after* it (the tail of a
        run that crashed after its last checkpoint): a resumed run never counts a step twice.
        The common case (nothing to replace) adds the deltas to the stored totals; otherwise the
        totals of every prompt involved are recomputed from ``prompt_steps``.
        """
        rows = [{"run_id": run_id, "step": int(step), **d} for d in deltas]
        self._retrying(f"writing the prompt statistics of step {step}",
                       lambda: self._write_prompt_step_once(run_id, step, rows))

    def _write_prompt_step_once(self, run_id: str, step: int, rows: list[dict]) -> None:
        with self.engine.begin() as conn:
            stale = stale_prompts(conn, run_id, step)
            if stale:
                conn.execute(delete(PromptStepRow).where(PromptStepRow.run_id == run_id,
                                                         PromptStepRow.step >= step))
            self._bulk_insert(conn, PromptStepRow, rows)
            touched = {(r["domain"], r["task_id"]) for r in rows}
            if stale:
                totals = prompt_totals_from_steps(conn, run_id, touched | stale)
            else:
                totals = fold_deltas(stored_prompt_totals(conn, run_id, touched), rows)
            replace_prompt_totals(conn, run_id, touched | stale, totals)
            self._bulk_insert(conn, PromptStatRow, [{"run_id": run_id, **t} for t in totals.values()])

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "StatsStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- row builders ---------------------------------------------------------------------------------
RESULT_COLUMNS = ("run_id", "step", "domain", "level", "task_id", "group_index", "reward", "correct",
                  "status", "advantage", "prompt_hash", "completion_hash", "latency_s", "completion",
                  "verifier_version")


class _ResultColumns(list):
    """Result rows as tuples in RESULT_COLUMNS order (tuples skip a dict per row on the hot path)."""


def _result_row(run_id: str, step: int, o: "Outcome") -> tuple:
    return (run_id, step, o.domain, int(o.level), o.task_id, int(o.group), float(o.reward),
            bool(o.correct), str(getattr(o.status, "value", o.status)), float(o.advantage),
            o.prompt_hash, o.completion_hash, float(o.latency_s), _compress(o.completion),
            o.verifier_version)


def _one_element(value: Any) -> bool:
    return (value.numel() if hasattr(value, "numel") else getattr(value, "size", 1)) == 1  # torch, numpy


def _plain(value: Any) -> Any:
    """JSON-safe copy of a metrics value: nested dicts and lists kept, numpy scalars and 0-d
    tensors (anything with ``.item()``) unwrapped, NaN/inf as null, anything else as its str."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and _one_element(value):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # PostgreSQL's JSON has no NaN or infinity
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
