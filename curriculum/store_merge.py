"""``palestra merge``: copy whole runs from other stores into one.

Runs started apart (each run folder with its own ``palestra.db``) make no sweep that
``palestra compare`` can read; copied into one store under one sweep id, they do. Every per-run
table is copied as ``curriculum.schema`` declares it (``runs`` first, then the tables keyed by
``run_id``, in ``Base.metadata.sorted_tables`` order), so a table added later is copied without a
change here. The sources are opened read-only (nothing is written to them, and an older source is
read as it is: a version-1 store simply has no ``step_arrays`` to copy); the destination is
created, or upgraded to the current schema, the way every writer opens a store.
"""
from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterable

from sqlalchemy import Column, Table, insert, inspect, select

from curriculum.schema import Base, RunRow
from curriculum.store import StatsStore
from curriculum.store_urls import default_store_url

BATCH_ROWS = 5_000  # rows read and inserted at a time: a run can hold ~100k results


def store_url(text: str) -> str:
    """The SQLAlchemy URL of a store given on the command line: a URL as it is, a run folder as
    its ``palestra.db``, any other path as that SQLite file (made absolute, so the URL means the
    same file whatever the working directory)."""
    if "://" in text:
        return text
    path = Path(text)
    return default_store_url(path) if path.is_dir() else f"sqlite:///{path.resolve()}"


def run_tables() -> list[Table]:
    """The tables holding a run's rows, parents first: ``runs``, then every table with a ``run_id``
    (``meta`` describes the store, not a run)."""
    return [t for t in Base.metadata.sorted_tables if t.name == RunRow.__tablename__ or "run_id" in t.c]


def copied_columns(table: Table) -> list[Column]:
    """The columns to copy: all but a surrogate id (declared ``autoincrement=True``, such as
    ``results.id``), which the destination assigns itself, its own ids being taken already."""
    return [c for c in table.columns if not (c.primary_key and c.autoincrement is True and c.name != "run_id")]


def merge_runs(sources: Iterable[str], into: str, sweep_id: str | None = None,
               run_ids: Iterable[str] | None = None) -> list[str]:
    """Copy runs from the stores ``sources`` into the store ``into``; returns the ids copied, in order.

    Every run of every source, or only those in ``run_ids``; each run keeps its id, and its sweep
    id unless ``sweep_id`` is given. Stores are URLs or paths (``store_url``). Everything is checked
    before anything is written, and a failed check copies nothing at all: a source that does not
    exist, a ``run_ids`` entry in no source, a run in two sources, a run already in ``into``. A run
    already there fails the merge rather than being skipped: merging a folder twice is the usual
    way to get there, and a skip would leave the sweep quietly built from whatever copy came
    first; name the runs still to copy with ``run_ids`` instead. Each run is copied in one
    transaction, so a merge stopped halfway leaves whole runs only.
    """
    with ExitStack() as stack:
        opened = [stack.enter_context(StatsStore(store_url(s), create=False)) for s in sources]
        chosen = _chosen_runs(opened, run_ids)
        dest = stack.enter_context(StatsStore(store_url(into)))
        _refuse_present(dest, [run_id for _, run_id in chosen])
        for source, run_id in chosen:
            _copy_run(source, dest, run_id, sweep_id)
    return [run_id for _, run_id in chosen]


def _chosen_runs(stores: list[StatsStore], run_ids: Iterable[str] | None) -> list[tuple[StatsStore, str]]:
    """(source, run id) of each run to copy, in source order."""
    found = [(store, run["id"]) for store in stores for run in store.runs()]
    if run_ids:
        wanted = set(run_ids)
        missing = sorted(wanted - {run_id for _, run_id in found})
        if missing:
            raise ValueError(f"{_runs(missing)} in none of the sources; nothing was copied")
        found = [(store, run_id) for store, run_id in found if run_id in wanted]
    twice = sorted(run_id for run_id, n in Counter(r for _, r in found).items() if n > 1)
    if twice:
        raise ValueError(f"{_runs(twice)} in more than one source; nothing was copied")
    return found


def _runs(ids: list[str]) -> str:
    """``run X is`` / ``runs X, Y are``, for the messages."""
    return f"run {ids[0]} is" if len(ids) == 1 else f"runs {', '.join(ids)} are"


def _refuse_present(dest: StatsStore, run_ids: list[str]) -> None:
    with dest.reader.connect() as conn:  # all ids, not an IN list: no limit on the sweep's size
        present = set(conn.execute(select(RunRow.id)).scalars())
    clash = [run_id for run_id in run_ids if run_id in present]
    if clash:
        raise ValueError(f"{_runs(clash)} already in {dest.safe_url}; nothing was copied "
                         "(name the runs still to copy with --run)")


def _copy_run(source: StatsStore, dest: StatsStore, run_id: str, sweep_id: str | None) -> None:
    """One run, every table, in one transaction of ``dest`` (and one read snapshot of ``source``)."""
    with source.reader.connect() as src, dest.engine.begin() as out:
        present = set(inspect(src).get_table_names())
        for table in run_tables():
            if table.name in present:
                _copy_table(src, out, table, run_id, sweep_id)


def _copy_table(src: Any, out: Any, table: Table, run_id: str, sweep_id: str | None) -> None:
    """The run's rows of ``table`` in primary-key order, so copied results keep their order."""
    key = table.c.id if table.name == RunRow.__tablename__ else table.c.run_id
    query = (select(*copied_columns(table)).where(key == run_id).order_by(*table.primary_key.columns)
             .execution_options(yield_per=BATCH_ROWS))
    for batch in src.execute(query).mappings().partitions():
        rows = [dict(r) for r in batch]
        if sweep_id is not None and table.name == RunRow.__tablename__:
            rows = [{**r, "sweep_id": sweep_id} for r in rows]
        out.execute(insert(table), rows)
