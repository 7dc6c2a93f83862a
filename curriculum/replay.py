"""Re-verify stored results and report every reward that comes out differently.

Each result row keeps the completion, the task id (the task itself is in the ``tasks`` table),
the verifier's version and the run's config (domains and their options, library versions). A
replay rebuilds the domains from that config, verifies every completion again in a fresh verifier
pool, and compares reward and status. A nondeterministic verifier, a changed verifier or a changed
library shows up as mismatches.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from curriculum.store import StatsStore
from domains.api import Task
from domains.pool import VerifierPool
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
    missing_tasks: int = 0
    version_changes: dict[str, str] = field(default_factory=dict)  # domain -> "stored -> now"
    mismatches: list[Mismatch] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mismatches": [asdict(m) for m in self.mismatches]}


def replay(store: StatsStore, run_id: str, step: int | None = None, workers: int = 2) -> ReplayReport:
    config = store.run(run_id)["config"] or {}
    domains = load_all(config.get("domains", []), config.get("domain_options") or {})
    rows = store.results(run_id, step=step)
    tasks = store.tasks(run_id, {r["task_id"] for r in rows})
    report = ReplayReport(run_id)
    checkable = []
    for row in rows:
        if row["task_id"] not in tasks or row["domain"] not in domains:
            report.missing_tasks += 1
            continue
        checkable.append(row)
        now = domains[row["domain"]].version
        if row["verifier_version"] and row["verifier_version"] != now:
            report.version_changes[row["domain"]] = f"{row['verifier_version']} -> {now}"
    with VerifierPool(domains, workers=workers) as pool:
        verdicts = pool.verify_many([(Task.from_json(tasks[r["task_id"]]), r["completion"]) for r in checkable])
        pool.raise_if_broken()  # not a report of every row as a mismatch
    for row, verdict in zip(checkable, verdicts):
        report.checked += 1
        result = verdict.result
        if abs(result.reward - row["reward"]) > 1e-9 or result.status.value != row["status"]:
            report.mismatches.append(Mismatch(row["step"], row["domain"], row["task_id"], row["reward"],
                                              result.reward, row["status"], result.status.value))
    return report
