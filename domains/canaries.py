"""Canaries: completions that must never earn reward, run through the verifier pool on purpose.

A domain names its canaries in ``Domain.canaries()``: functions that, given a task, write a
known exploit or a near miss (several boxed answers, a program that exits early claiming success, a
tool transcript that skips the calls). A canary may return None for a task it does not apply to (a
code canary that needs an entry point, on a stdio task). ``run_canaries`` writes each canary's
completion for a few held-out tasks of every level and verifies them all through the pool that
training uses, so a verifier that starts paying for an exploit (a changed library, a weakened
option, a bug) shows at once rather than after the policy has learned it.

Canaries never touch the training stream: their tasks come from ``Domain.heldout`` (its own
seeded generator) and canary functions are deterministic in the task.
"""
from __future__ import annotations

from dataclasses import dataclass
from domains.api import Canary, Domain, Task, one_line
from domains.verify.pool import Pool


@dataclass(frozen=True)
class CanaryResult:
    domain: str
    canary: str
    level: int
    task_id: str
    reward: float
    status: str  # the verifier's status, or "canary_error" when the canary itself raised
    message: str = ""
    scored: bool = True  # False: the verifier could not judge it (no sandbox here, say)

    @property
    def paid(self) -> bool:
        """The canary earned reward: the verifier lets an exploit through."""
        return self.reward > 0


def canary_tasks(domain: Domain, per_level: int, seed: int) -> list[Task]:
    """A few held-out tasks of every level of ``domain`` (never tasks training draws)."""
    return [task for level in domain.levels for task in domain.heldout(level, per_level, seed)]


def run_canaries(domains: dict[str, Domain], pool: Pool, per_level: int, seed: int) -> list[CanaryResult]:
    """Every canary of every domain on ``per_level`` held-out tasks per level, verified by ``pool``;
    a domain without canaries contributes nothing. A canary that raises, or a domain that cannot
    draw its held-out tasks, is reported as a ``canary_error`` result, and nothing of it verified."""
    results: list[CanaryResult] = []
    submitted: list[tuple[str, Task, str]] = []
    for name in sorted(domains):
        canaries = domains[name].canaries()
        if canaries:
            _write(domains[name], canaries, per_level, seed, results, submitted)
    verdicts = pool.verify_many([(task, completion) for _, task, completion in submitted])
    for (canary, task, _), verdict in zip(submitted, verdicts):
        result = verdict.result
        results.append(CanaryResult(task.domain, canary, task.level, task.id, result.reward, result.status.value,
                                    str(result.details.get("message", ""))[:200], result.scored))
    return results


def _write(domain: Domain, canaries: dict[str, Canary], per_level: int, seed: int, errors: list[CanaryResult],
           submitted: list[tuple[str, Task, str]]) -> None:
    """Each of ``canaries``' completions for each of the domain's canary tasks, into ``submitted``."""
    try:
        tasks = canary_tasks(domain, per_level, seed)
    except Exception as exc:  # a plugin that cannot draw its held-out tasks: nothing to write
        errors.append(CanaryResult(domain.name, "(held-out tasks)", 0, "", 0.0, "canary_error", _why(exc)))
        return
    for task in tasks:
        for canary, write in canaries.items():
            try:
                completion = write(task)
            except Exception as exc:  # the plugin's canary is broken: say so, verify nothing
                errors.append(CanaryResult(domain.name, canary, task.level, task.id, 0.0, "canary_error", _why(exc)))
                continue
            if completion is not None:
                submitted.append((canary, task, completion))


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {one_line(exc, 200)}"


def canary_alarms(results: list[CanaryResult]) -> list[str]:
    """One alarm per (domain, canary) that earned reward on any task, naming both."""
    paid: dict[tuple[str, str], list[CanaryResult]] = {}
    for result in results:
        if result.paid:
            paid.setdefault((result.domain, result.canary), []).append(result)
    return [f"canary {canary!r} of {domain} earned reward {max(r.reward for r in hits):.2f} on {len(hits)} "
            f"held-out task(s) (e.g. {hits[0].task_id} at level {hits[0].level}): its verifier pays for an exploit"
            for (domain, canary), hits in sorted(paid.items())]
