"""How a store written by an older Palestra is brought up to ``SCHEMA_VERSION``: one step per version.

``StatsStore`` opens a store, finds its schema version in ``meta`` and, when it is older, runs
every step after it in order, in one transaction with the version bump (a failed upgrade leaves
the store as it was). A read-only open (``create=False``) upgrades nothing: the readers understand
every version's layout.

To change the schema: raise ``SCHEMA_VERSION`` in ``curriculum.schema`` and add the step that takes
a store from the version before to it in ``STEPS``. A step must be idempotent — two runs of a
sweep may open the same old store at once — and should keep what older versions wrote readable
rather than rewrite it (a sweep's database can hold millions of rows).
"""
from __future__ import annotations

from typing import Any, Callable

from sqlalchemy import update

from curriculum.schema import SCHEMA_VERSION, MetaRow, RunDomainsRow, StepArrayRow


def _compact_steps(conn: Any) -> None:
    """Version 2: a step's plan and statistics become one row of binary arrays (``step_arrays``,
    indexed by ``run_domains``). The version-1 tables keep the steps already written."""
    for table in (RunDomainsRow, StepArrayRow):
        table.__table__.create(conn, checkfirst=True)


# version -> the step that takes a store from version - 1 to it
STEPS: dict[int, Callable[[Any], None]] = {2: _compact_steps}


def upgrade(conn: Any, found: int) -> None:
    """Run the steps from ``found`` to ``SCHEMA_VERSION`` on ``conn`` (inside its transaction)."""
    for version in range(found + 1, SCHEMA_VERSION + 1):
        STEPS[version](conn)
    conn.execute(update(MetaRow).where(MetaRow.key == "schema_version").values(value=str(SCHEMA_VERSION)))
