"""The read side of the stats store: every query ``StatsStore`` answers, as the mixin ``StoreReads``.

``StatsStore`` (``curriculum.store``) opens the database, checks its schema and writes; these
methods only read, through ``self.reader`` (the engine with ``read_only=True``: SQLite reads take
no write lock). Damaged compressed blobs read as None rather than stopping a replay or a report.

A step's plan and statistics are in one of two layouts (``curriculum.store_arrays``): rows in the
version-1 tables for steps written before the store was upgraded, one ``step_arrays`` row since.
``step_stats``, ``plans`` and ``plan_vectors`` return the version-1 rows either way, in step order.
"""
from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, Iterable

from sqlalchemy import func, select

from curriculum.schema import (
    MetricRow,
    PlanRow,
    PlanVectorRow,
    PromptStatRow,
    PromptStepRow,
    ResultRow,
    RunDomainsRow,
    RunRow,
    StepArrayRow,
    StepStatRow,
    TaskRow,
)
from curriculum.store_arrays import decode_plans, decode_stats, decode_vector

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def _decompress(blob: bytes | None) -> str:
    return zlib.decompress(blob).decode("utf-8") if blob else ""


# Readers of completions and tasks get None for a damaged blob, so one bad row does not stop a
# replay or a report over thousands of good ones.
def _text_or_none(blob: bytes | None) -> str | None:
    try:
        return _decompress(blob)
    except (zlib.error, UnicodeDecodeError):
        return None


def _json_or_none(blob: bytes | None) -> dict | None:
    text = _text_or_none(blob)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class StoreReads:
    """The queries of ``StatsStore``; the class that mixes this in sets ``reader`` and ``safe_url``."""

    reader: "Engine"
    safe_url: str
    layout_version: int  # the store's schema version when opened: 1 has no step_arrays table

    def _array_steps(self, run_id: str, decode) -> list[dict]:
        """``decode(row, domains)`` of every ``step_arrays`` row of the run, in step order, flattened
        when it returns a list."""
        if self.layout_version < 2:
            return []
        t = StepArrayRow.__table__
        with self.reader.connect() as conn:
            domains = conn.execute(select(RunDomainsRow.domains).where(RunDomainsRow.run_id == run_id)).scalar()
            rows = conn.execute(select(t).where(t.c.run_id == run_id).order_by(t.c.step)).mappings().all()
        out: list[dict] = []
        for row in rows:
            decoded = decode(row, domains)
            out += decoded if isinstance(decoded, list) else [decoded]
        return out

    def _both_layouts(self, run_id: str, table, order: tuple[str, ...], decode) -> list[dict]:
        """The version-1 rows of ``table`` and the decoded ``step_arrays`` ones, in step order."""
        query = select(table).where(table.c.run_id == run_id).order_by(*(table.c[c] for c in order))
        with self.reader.connect() as conn:
            old = [dict(r) for r in conn.execute(query).mappings().all()]
        new = self._array_steps(run_id, decode)
        # a step is in one layout or the other; sorted() is stable, so each step keeps its order
        return sorted(old + new, key=lambda r: r["step"]) if old and new else old or new

    # -- runs ---------------------------------------------------------------------------------
    def runs(self) -> list[dict]:
        cols = (RunRow.id, RunRow.name, RunRow.sweep_id, RunRow.status, RunRow.seed,
                RunRow.last_step, RunRow.started_at)
        with self.reader.connect() as conn:
            rows = conn.execute(select(*cols).order_by(RunRow.started_at, RunRow.id)).mappings().all()
        return [dict(r) for r in rows]

    def run(self, run_id: str) -> dict:
        with self.reader.connect() as conn:
            row = conn.execute(select(RunRow.__table__).where(RunRow.id == run_id)).mappings().first()
        if row is None:
            raise KeyError(f"no run {run_id!r} in {self.safe_url!r}")
        return dict(row)

    # -- results and step statistics ------------------------------------------------------------
    def tasks(self, run_id: str, ids: Iterable[str] | None = None) -> dict[str, dict | None]:
        """Stored tasks by id, as Task JSON; None for one stored damaged."""
        query = select(TaskRow.task_id, TaskRow.task).where(TaskRow.run_id == run_id)
        if ids is not None:
            query = query.where(TaskRow.task_id.in_(list(ids)))
        with self.reader.connect() as conn:
            return {i: _json_or_none(blob) for i, blob in conn.execute(query)}

    def results(self, run_id: str, step: int | None = None) -> list[dict]:
        """Result rows in step order, the completion as text (None where it is stored damaged)."""
        query = select(ResultRow.__table__).where(ResultRow.run_id == run_id)
        if step is not None:
            query = query.where(ResultRow.step == step)
        with self.reader.connect() as conn:
            rows = conn.execute(query.order_by(ResultRow.step, ResultRow.id)).mappings().all()
        return [{**r, "completion": _text_or_none(r["completion"])} for r in rows]

    def count_results(self, run_id: str) -> int:
        with self.reader.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(ResultRow)
                                    .where(ResultRow.run_id == run_id)).scalar())

    def step_stats(self, run_id: str) -> list[dict]:
        """Per step and (domain, level) with attempts: the sums, ordered by step, domain, level."""
        return self._both_layouts(run_id, StepStatRow.__table__, ("step", "domain", "level"), decode_stats)

    def plans(self, run_id: str) -> list[dict]:
        """Per step and domain that got prompts: weight, level, n_prompts; by step and domain."""
        return self._both_layouts(run_id, PlanRow.__table__, ("step", "domain"), decode_plans)

    def plan_vectors(self, run_id: str) -> list[dict]:
        """Every step's full plan: {step, domains, weights, levels} (lists in domain order)."""
        return self._both_layouts(run_id, PlanVectorRow.__table__, ("step",), decode_vector)

    def metrics(self, run_id: str) -> list[dict]:
        query = select(MetricRow.step, MetricRow.values).where(MetricRow.run_id == run_id)
        with self.reader.connect() as conn:
            rows = conn.execute(query.order_by(MetricRow.step)).all()
        return [{"step": step, **values} for step, values in rows]

    def verdict_counts(self, run_id: str) -> dict[str, dict[str, int]]:
        """Per domain, the stored completions by verdict: ``correct``, and the others by status
        (an ``ok`` that is not correct earned partial credit). A run stored without its
        per-completion rows (the simulator's default) has none."""
        query = (select(ResultRow.domain, ResultRow.status, ResultRow.correct, func.count())
                 .where(ResultRow.run_id == run_id)
                 .group_by(ResultRow.domain, ResultRow.status, ResultRow.correct))
        counts: dict[str, dict[str, int]] = {}
        with self.reader.connect() as conn:
            for domain, status, correct, n in conn.execute(query):
                key = "correct" if correct else status
                counts.setdefault(domain, {})[key] = counts.get(domain, {}).get(key, 0) + int(n)
        return counts

    def domain_summary(self, run_id: str) -> list[dict]:
        """Per domain: attempts, successes, success_rate, varied_groups (groups whose completions'
        rewards differed: the only ones with an advantage to learn from), and the latest planned
        weight and level."""
        counts: dict[str, list[int]] = {}
        for row in self.step_stats(run_id):
            total = counts.setdefault(row["domain"], [0, 0, 0])
            total[0] += int(row["attempts"])
            total[1] += int(row["successes"])
            total[2] += int(row["groups"]) - int(row["zero_var_groups"])
        vectors = self.plan_vectors(run_id)
        latest = vectors[-1] if vectors else {"domains": [], "weights": [], "levels": []}
        plans = {d: (float(w), int(lv)) for d, w, lv in zip(latest["domains"], latest["weights"], latest["levels"])}
        summary = []
        for domain in sorted(set(counts) | set(plans)):
            attempts, successes, varied = counts.get(domain, (0, 0, 0))
            weight, level = plans.get(domain, (None, None))
            summary.append(dict(domain=domain, attempts=attempts, successes=successes,
                                success_rate=successes / attempts if attempts else None,
                                varied_groups=varied, weight=weight, level=level))
        return summary

    # -- per-prompt statistics (PromptSelector) -------------------------------------------------
    def prompt_stats(self, run_id: str, domain: str | None = None) -> list[dict]:
        """Per prompt totals of a run (optionally of one domain), ordered by domain and task id."""
        t = PromptStatRow.__table__
        query = select(t).where(t.c.run_id == run_id)
        if domain is not None:
            query = query.where(t.c.domain == domain)
        with self.reader.connect() as conn:
            return [dict(r) for r in conn.execute(query.order_by(t.c.domain, t.c.task_id)).mappings()]

    def prompt_steps(self, run_id: str, until_step: int | None = None) -> list[dict]:
        """Per step, per prompt deltas of a run (up to ``until_step``), in step order."""
        t = PromptStepRow.__table__
        query = select(t).where(t.c.run_id == run_id)
        if until_step is not None:
            query = query.where(t.c.step <= until_step)
        with self.reader.connect() as conn:
            return [dict(r) for r in conn.execute(query.order_by(t.c.step, t.c.task_id)).mappings()]

    # -- sweeps ------------------------------------------------------------------------------
    def sweep_runs(self, sweep_id: str) -> list[dict]:
        """The runs recorded under ``sweep_id``, configs included, oldest first."""
        query = (select(RunRow.__table__).where(RunRow.sweep_id == sweep_id)
                 .order_by(RunRow.started_at, RunRow.id))
        with self.reader.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings().all()]

    def step_totals(self, run_id: str) -> list[dict]:
        """Per step: attempts, successes, groups and zero-variance groups summed over domains."""
        keys = ("attempts", "successes", "groups", "zero_var_groups")
        totals: dict[int, dict] = {}
        for row in self.step_stats(run_id):
            total = totals.setdefault(row["step"], {"step": row["step"], **dict.fromkeys(keys, 0)})
            for key in keys:
                total[key] += int(row[key])
        return list(totals.values())
