"""Canary checks in the store, kept in the metrics rows that already exist (no table of their own).

A check at step s merges into that step's metrics: ``domain/<d>/canaries`` (canary completions
verified), ``domain/<d>/canaries_paid`` (those that earned reward) and, when any did,
``canary/alarms`` (the alarms the trainer printed). ``palestra stats`` sums the counts per domain
and ``palestra report`` marks the alarms on its timeline.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from curriculum.steps import domain_totals
from domains.canaries import CanaryResult, canary_alarms

ALARMS_KEY = "canary/alarms"


def canary_metrics(results: Iterable[CanaryResult]) -> dict[str, Any]:
    """One check's results as metrics values to merge into its step's row."""
    results = list(results)
    values: dict[str, Any] = {}
    for result in results:
        for name, count in (("canaries", 1), ("canaries_paid", int(result.paid))):
            key = f"domain/{result.domain}/{name}"
            values[key] = values.get(key, 0) + count
    alarms = canary_alarms(results)
    if alarms:
        values[ALARMS_KEY] = alarms
    return values


def canary_counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per domain, canaries verified and paid over every check of a run (its metrics rows)."""
    rows = list(rows)
    verified, paid = domain_totals(rows, "canaries"), domain_totals(rows, "canaries_paid")
    return {domain: {"canaries": verified.get(domain, 0), "canaries_paid": paid.get(domain, 0)}
            for domain in {**verified, **paid}}


def canary_alarm_steps(rows: Iterable[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """(step, alarm) for every canary alarm a run recorded, in step order."""
    return [(int(row["step"]), alarm) for row in rows for alarm in row.get(ALARMS_KEY) or []]
