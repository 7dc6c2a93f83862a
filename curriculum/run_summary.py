"""What one stored run did, per domain: the rows of ``palestra stats`` and of the report's table.

Both read the store through its read API only. ``domain_stats`` is what ``palestra stats`` prints
(attempts, successes, the last planned weight and level, completions by verdict, and each domain's
share of the prompts planned, of the groups trained and of the groups with a reward spread over the
run); ``domain_table``
adds what a reader of the report wants next to it: each domain's share of the rollouts, the level
it reached, and its training and held-out success at the start and at the end of the run.
"""
from __future__ import annotations

import numpy as np

from curriculum.canary_log import canary_counts
from curriculum.steps import domain_totals
from domains.api import Status

# the verdict columns of `palestra stats` and the report: how each domain's completions were judged
VERDICT_COLUMNS = {"correct": "correct", "partial": Status.OK.value, "wrong": Status.WRONG.value,
                   "format_error": Status.FORMAT_ERROR.value, "timeout": Status.TIMEOUT.value,
                   "error": Status.ERROR.value, "sandbox_violation": Status.SANDBOX_VIOLATION.value}
WINDOW_SHARE = 0.1  # training success "at the start" and "at the end": the first and last tenth of the steps


def domain_stats(store, run_id: str, metrics: list[dict] | None = None) -> list[dict]:
    """Per domain, the row ``palestra stats`` prints."""
    rows = store.domain_summary(run_id)
    verdicts = store.verdict_counts(run_id)
    metrics = store.metrics(run_id) if metrics is None else metrics
    # completions the verifier could not judge: summed from the steps' metrics (the results rows
    # keep only their status, ``error``)
    unscored, canaries = domain_totals(metrics, "unscored"), canary_counts(metrics)
    planned, trained = planned_shares(store.plans(run_id)), trained_shares(metrics)
    # a trained share also counts all-fail groups kept when refills ran out; the varied share, the
    # groups with a reward spread, is what GRPO learned from
    varied_total = sum(row["varied_groups"] for row in rows)
    for row in rows:
        found = verdicts.get(row["domain"], {})
        row.update({column: found.get(status, 0) for column, status in VERDICT_COLUMNS.items()},
                   unscored=unscored.get(row["domain"], 0),
                   **canaries.get(row["domain"], {"canaries": 0, "canaries_paid": 0}),
                   planned_share=planned.get(row["domain"], 0.0) if planned else None,
                   trained_share=trained.get(row["domain"], 0.0) if trained else None,
                   varied_share=row["varied_groups"] / varied_total if varied_total else None)
    return rows


def planned_shares(plans: list[dict]) -> dict[str, float]:
    """Per domain, its share of all the prompts the run's plans gave out (``store.plans`` rows: the
    ``domain/<name>/prompts`` of every step, summed); empty for a run without a stored plan."""
    totals: dict[str, int] = {}
    for row in plans:
        totals[row["domain"]] = totals.get(row["domain"], 0) + int(row["n_prompts"])
    return _shares(totals)


def trained_shares(metrics: list[dict]) -> dict[str, float]:
    """Per domain, its share of all the groups that reached an update (``domain/<name>/trained``
    summed over the steps); empty for a run stored before that metric existed, where it is unknown."""
    return _shares(domain_totals(metrics, "trained"))


def _shares(totals: dict[str, int]) -> dict[str, float]:
    whole = sum(totals.values())
    return {d: n / whole for d, n in totals.items()} if whole else {}


def domain_table(store, run_id: str, vectors: list[dict], metrics: list[dict]) -> list[dict]:
    """``domain_stats`` plus share of rollouts, highest planned level, and training and held-out
    success at the start and at the end (None where the run has no such measurement)."""
    rows = domain_stats(store, run_id, metrics)
    total = sum(r["attempts"] for r in rows) or 1
    domains = list(vectors[0]["domains"]) if vectors else []
    highest = dict(zip(domains, np.max([v["levels"] for v in vectors], axis=0).tolist())) if vectors else {}
    train_first, train_last = training_success(store.step_stats(run_id))
    heldout = heldout_series(metrics, domains)
    held_first, held_last = (heldout[0][1], heldout[-1][1]) if heldout else ({}, {})
    for row in rows:
        d = row["domain"]
        row.update(share=row["attempts"] / total, highest_level=highest.get(d),
                   train_first=train_first.get(d), train_last=train_last.get(d),
                   heldout_first=held_first.get(d), heldout_last=held_last.get(d))
    return rows


def training_success(step_stats: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """Per domain, training success over the first and over the last tenth of the recorded steps."""
    steps = sorted({r["step"] for r in step_stats})
    if not steps:
        return {}, {}
    n = max(1, int(len(steps) * WINDOW_SHARE))
    return _success_over(step_stats, set(steps[:n])), _success_over(step_stats, set(steps[-n:]))


def _success_over(step_stats: list[dict], steps: set[int]) -> dict[str, float]:
    sums: dict[str, list[int]] = {}
    for r in step_stats:
        if r["step"] in steps:
            s = sums.setdefault(r["domain"], [0, 0])
            s[0] += r["successes"]
            s[1] += r["attempts"]
    return {d: successes / attempts for d, (successes, attempts) in sums.items() if attempts}


def heldout_series(metrics: list[dict], domains: list[str]) -> list[tuple[int, dict[str, float]]]:
    """(step, held-out success by domain name) for every step that stored it per domain. A trainer
    stores ``heldout/<domain>``; the simulator only the ``heldout/domains`` vector, in plan order."""
    series = []
    for row in metrics:
        named = {d: float(row[f"heldout/{d}"]) for d in domains if f"heldout/{d}" in row}
        vector = row.get("heldout/domains")
        if not named and vector is not None and len(vector) == len(domains):
            named = {d: v / 1000.0 for d, v in zip(domains, vector)}  # stored in thousandths
        if named:
            series.append((int(row["step"]), named))
    return series


def run_alarms(metrics: list[dict]) -> list[tuple[int, str]]:
    """(step, alarm) for every health alarm the run stored, in step order."""
    return [(int(row["step"]), str(text)) for row in metrics for text in row.get("alarms") or []]

