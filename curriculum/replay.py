"""Re-verify stored results and report every reward that comes out differently.

Each result row keeps the completion, the task id (the task itself is in the ``tasks`` table),
the verifier's version and the run's config (domains and their options, library versions). A
replay rebuilds the domains from that config, verifies every completion again in a fresh verifier
pool, and compares reward and status. A nondeterministic verifier, a changed verifier or a changed
library shows up as mismatches. A domain that chose at draw time what scores a task (rotated hidden
code tests) gets the task as it was drawn: its step, and how often it had been drawn before, from
the stored groups.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from curriculum.store import StatsStore
from domains.api import Domain, Task
from domains.verify.pool import VerifierPool
from domains.registry import load_all


@dataclass
class Mismatch:
    step: int
    domain: str
    task_id: str
    stored_reward: float
    replayed_reward: float
    stored_status: str
    replayed_status: str


@dataclass
class ReplayReport:
    run_id: str
    checked: int = 0
    missing_tasks: int = 0  # results whose task is not in the store
    unreadable: int = 0  # results whose completion or task is stored damaged
    unknown_domains: dict[str, int] = field(default_factory=dict)  # results of domains not in the run's config
    unscored: int = 0  # re-verified results the verifier could not judge (e.g. no code sandbox here)
    version_changes: dict[str, str] = field(default_factory=dict)  # domain -> "stored -> now"
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def unchecked(self) -> int:
        return self.missing_tasks + self.unreadable + sum(self.unknown_domains.values())

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mismatches": [asdict(m) for m in self.mismatches]}


def replay(store: StatsStore, run_id: str, step: int | None = None, workers: int = 2) -> ReplayReport:
    run = store.run(run_id)
    domains = run_domains(run)
    rows = store.results(run_id, step=step)
    if step is not None and not rows:
        recorded = f"steps 1-{run['last_step']}" if run["last_step"] >= 1 else "no recorded steps"
        raise ValueError(f"run {run_id} has no results at step {step} (it has {recorded})")
    # each task once, however many completions it has; None where it is stored damaged
    tasks = {i: readable_task(data) for i, data in store.tasks(run_id, {r["task_id"] for r in rows}).items()}
    report = ReplayReport(run_id)
    checkable = []
    for row in rows:
        task = tasks.get(row["task_id"])
        if row["domain"] not in domains:
            report.unknown_domains[row["domain"]] = report.unknown_domains.get(row["domain"], 0) + 1
        elif row["task_id"] not in tasks:
            report.missing_tasks += 1
        elif task is None or row["completion"] is None:
            report.unreadable += 1
        else:
            checkable.append((row, task))
            now = domains[row["domain"]].version
            if row["verifier_version"] and row["verifier_version"] != now:
                report.version_changes[row["domain"]] = f"{row['verifier_version']} -> {now}"
    counting = any(domain.counts_draws for domain in domains.values())  # the earlier steps' draws count too
    drawn = as_drawn(store.results(run_id) if counting and step is not None else rows, domains)
    with VerifierPool(domains, workers=workers) as pool:
        verdicts = pool.verify_many([(drawn(row, task), row["completion"]) for row, task in checkable])
        pool.raise_if_broken()  # not a report of every row as a mismatch
    for (row, _), verdict in zip(checkable, verdicts):
        report.checked += 1
        result = verdict.result
        # compared all the same: a stored error that fails again matches, and a stored verdict the
        # verifier cannot give now is a mismatch; the count says how many mismatches may be this machine's
        report.unscored += not result.scored
        if abs(result.reward - row["reward"]) > 1e-9 or result.status.value != row["status"]:
            report.mismatches.append(Mismatch(row["step"], row["domain"], row["task_id"], row["reward"],
                                              result.reward, row["status"], result.status.value))
    return report


def as_drawn(history: list[dict], domains: dict[str, Domain]):
    """A function of (result row, stored task) that gives the task as the curriculum handed it to
    the domain's ``drawn``: at the row's step, after as many draws of it as ``history`` (the run's
    result rows in step order, one group a draw) holds before. The store keeps no verdict details,
    so this is how a stored result's scored tests (``payload["scored_tests"]``) are read back."""
    rotating = {name for name, domain in domains.items() if domain.rotates}
    counting = {name for name, domain in domains.items() if domain.counts_draws}
    visits: dict[tuple[int, int], int] = {}  # (step, group) -> earlier draws of its task
    counted: Counter[str] = Counter()
    for row in history:
        key = (row["step"], row["group_index"])
        if row["domain"] in counting and key not in visits:
            visits[key] = counted[row["task_id"]]
            counted[row["task_id"]] += 1

    def drawn(row: dict, task: Task) -> Task:
        if row["domain"] not in rotating:
            return task
        return domains[row["domain"]].drawn(task, row["step"], visits.get((row["step"], row["group_index"]), 0))
    return drawn


def run_domains(run: dict) -> dict[str, Domain]:
    """A stored run's domains, built from its config (names and options) as it trained with them."""
    config = run["config"] or {}
    return load_all(config.get("domains", []), config.get("domain_options") or {})


def readable_task(data: dict | None) -> Task | None:
    """The stored task, or None when its JSON is damaged."""
    if data is None:
        return None
    try:
        return Task.from_json(data)
    except (KeyError, TypeError, ValueError):
        return None
