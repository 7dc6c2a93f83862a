"""The store's tables and engine (SQLAlchemy 2), apart from the code that reads and writes them.

Tables: runs; results (one row per completion, the completion zlib-compressed); run_domains (a
run's domain names, once) and step_arrays (per step, the plan and the per-(domain, level)
statistics as compressed binary arrays, see ``curriculum.store_arrays``); metrics (per step,
JSON); tasks (what a run trained on, for replay); meta (schema_version); prompt_steps and
prompt_stats (per prompt, for the within-domain PromptSelector). Only portable column types: the
same schema serves SQLite and PostgreSQL.

Version 1 stores kept the plan and statistics as rows instead — step_stats (per step and (domain,
level)), plans (per step and domain that got prompts), plan_vectors (per step, JSON lists). Those
tables stay, so steps written before an upgrade read as they were; nothing new is written to them.
How a store moves from one version to the next is in ``curriculum.migrations``.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    create_engine,
    event,
)
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA_VERSION = 2  # a new version needs a step in curriculum.migrations
SQLITE_BUSY_TIMEOUT_MS = 30_000  # parallel sweep runs may share one SQLite file
SQLITE_PAGE_SIZE = 16_384

# BIGINT autoincrement is spelled differently per backend; SQLite only autoincrements INTEGER.
_RowId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


def _run_key() -> Any:
    """The ``run_id`` column that opens the primary key of every per-run table."""
    return mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    sweep_id: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    config: Mapped[dict] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_step: Mapped[int] = mapped_column(Integer, default=-1)


class ResultRow(Base):
    __tablename__ = "results"
    id: Mapped[int] = mapped_column(_RowId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    domain: Mapped[str] = mapped_column(String(200))
    level: Mapped[int] = mapped_column(Integer)
    task_id: Mapped[str] = mapped_column(String(200))
    group_index: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float] = mapped_column(Float)
    correct: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(32))
    advantage: Mapped[float] = mapped_column(Float)
    prompt_hash: Mapped[str] = mapped_column(String(128))
    completion_hash: Mapped[str] = mapped_column(String(128))
    latency_s: Mapped[float] = mapped_column(Float)
    completion: Mapped[bytes] = mapped_column(LargeBinary)  # zlib-compressed UTF-8
    verifier_version: Mapped[str] = mapped_column(String(64))
    __table_args__ = (Index("ix_results_run_step", "run_id", "step"),)


class StepStatRow(Base):
    __tablename__ = "step_stats"
    run_id: Mapped[str] = _run_key()
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    domain: Mapped[str] = mapped_column(String(200), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempts: Mapped[int] = mapped_column(Integer)
    successes: Mapped[int] = mapped_column(Integer)
    reward_sum: Mapped[float] = mapped_column(Float)
    abs_adv_sum: Mapped[float] = mapped_column(Float)  # kept so signals rebuild bit-exactly
    mean_abs_adv: Mapped[float] = mapped_column(Float)
    zero_var_groups: Mapped[int] = mapped_column(Integer)
    groups: Mapped[int] = mapped_column(Integer)


class PlanRow(Base):
    __tablename__ = "plans"
    run_id: Mapped[str] = _run_key()
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    domain: Mapped[str] = mapped_column(String(200), primary_key=True)
    weight: Mapped[float] = mapped_column(Float)
    level: Mapped[int] = mapped_column(Integer)
    n_prompts: Mapped[int] = mapped_column(Integer)


class PlanVectorRow(Base):
    """The whole plan of a step as three JSON lists (domain order, weights, levels).

    ``plans`` keeps one row per domain that got prompts; with a thousand domains a row per domain
    per step would be most of the step's write, so the full vectors live here as one row.
    """

    __tablename__ = "plan_vectors"
    run_id: Mapped[str] = _run_key()
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    domains: Mapped[list] = mapped_column(JSON)
    weights: Mapped[list] = mapped_column(JSON)
    levels: Mapped[list] = mapped_column(JSON)


class RunDomainsRow(Base):
    """A run's domain names in plan order, written with its first step: the index of ``step_arrays``."""

    __tablename__ = "run_domains"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    domains: Mapped[list] = mapped_column(JSON)


class StepArrayRow(Base):
    """One step's plan and statistics as compressed arrays (layout in ``curriculum.store_arrays``)."""

    __tablename__ = "step_arrays"
    run_id: Mapped[str] = _run_key()
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    weights: Mapped[bytes] = mapped_column(LargeBinary)
    levels: Mapped[bytes] = mapped_column(LargeBinary)
    prompts: Mapped[bytes] = mapped_column(LargeBinary)
    cells: Mapped[bytes] = mapped_column(LargeBinary)


class MetricRow(Base):
    __tablename__ = "metrics"
    run_id: Mapped[str] = _run_key()
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    values: Mapped[dict] = mapped_column(JSON)


class TaskRow(Base):
    """The tasks a run trained on, by id, so any stored result can be re-verified (replay)."""

    __tablename__ = "tasks"
    run_id: Mapped[str] = _run_key()
    task_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    task: Mapped[bytes] = mapped_column(LargeBinary)  # zlib-compressed Task JSON


class PromptStepRow(Base):
    """What one step taught about one prompt: the delta that ``prompt_stats`` sums.

    ``tail_correct`` / ``tail_wrong``: how many of the step's last groups of this prompt (in group
    order) were all-correct / all-wrong; with ``groups`` they carry the streaks across steps.
    """

    __tablename__ = "prompt_steps"
    run_id: Mapped[str] = _run_key()
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    domain: Mapped[str] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer)
    successes: Mapped[int] = mapped_column(Integer)
    groups: Mapped[int] = mapped_column(Integer)
    tail_correct: Mapped[int] = mapped_column(Integer)
    tail_wrong: Mapped[int] = mapped_column(Integer)


class PromptStatRow(Base):
    """Per prompt totals over a run: what the PromptSelector reads back."""

    __tablename__ = "prompt_stats"
    run_id: Mapped[str] = _run_key()
    domain: Mapped[str] = mapped_column(String(200), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    attempts: Mapped[int] = mapped_column(Integer)
    successes: Mapped[int] = mapped_column(Integer)
    groups: Mapped[int] = mapped_column(Integer)
    all_correct_streak: Mapped[int] = mapped_column(Integer)  # groups, most recent first
    all_wrong_streak: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int] = mapped_column(Integer)


class MetaRow(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))


# Every table with a row per (run, step): rewriting or discarding a step clears them all.
STEP_TABLES = (ResultRow, StepArrayRow, StepStatRow, PlanRow, PlanVectorRow, MetricRow)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any, wal: bool = True) -> None:
    # Let SQLAlchemy's "begin" event open transactions itself (pysqlite's implicit BEGIN would
    # otherwise start them late and split reads from writes).
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")  # first: switching to WAL may wait
    if wal:  # the mode is stored in the file: a reader leaves a file as it found it
        # A new file only (an existing one keeps its size): a step's row of arrays is about 1.3 KB,
        # and a 4 KB page holds two of them; 16 KB pages waste a tenth instead of a third.
        cur.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
        cur.execute("PRAGMA journal_mode=WAL")  # readers (dashboards) never block the writer
    cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe with WAL
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    # IMMEDIATE takes the write lock up front. A plain (deferred) BEGIN that reads and then writes
    # fails at once with "database is locked" under WAL when another connection wrote in between:
    # SQLite cannot upgrade a stale read snapshot, and the busy timeout does not apply to that.
    # Reads (marked ``read_only``) take no lock, so a dashboard never blocks a training run.
    read_only = conn.get_execution_options().get("read_only", False)
    conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def is_in_memory_sqlite(url: str | URL) -> bool:
    """Whether ``url`` is an in-memory SQLite database, which each connection (and thread) sees
    apart: a store there cannot be written from a background thread."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return False  # not a URL at all: opening the store says so
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def make_engine(url: str, *, writer: bool = True) -> Engine:
    """An engine for ``url``; ``writer=False`` leaves a SQLite file's journal mode alone."""
    engine = create_engine(url, future=True)
    if engine.dialect.name == "sqlite":
        def pragmas(dbapi_conn: Any, record: Any) -> None:
            _sqlite_pragmas(dbapi_conn, record, wal=writer)

        event.listen(engine, "connect", pragmas)
        event.listen(engine, "begin", _sqlite_begin)
    return engine
