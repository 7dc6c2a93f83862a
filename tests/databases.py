"""The databases the store tests run on: SQLite in the test's folder, always, and PostgreSQL when a
server was started for the run (``make test`` starts one and fails without it; elsewhere its
variants are skipped, each saying why)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from curriculum.schema import Base, make_engine

PG_URL = os.environ.get("PALESTRA_TEST_PG_URL") or None
needs_pg = pytest.mark.skipif(
    not PG_URL, reason="no PostgreSQL server for this run (PALESTRA_TEST_PG_URL unset; `make test` starts one)")
# the `params` of a store fixture: the PostgreSQL variant is collected, and so seen, even without a server
DATABASES = ["sqlite", pytest.param("postgresql", marks=needs_pg)]


def empty_database(kind: str, tmp_path: Path, name: str = "palestra.db") -> str:
    """The URL of an empty database of ``kind``: a new SQLite file, or the test server emptied."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / name}"
    engine = make_engine(PG_URL)
    Base.metadata.drop_all(engine)
    engine.dispose()
    return PG_URL
