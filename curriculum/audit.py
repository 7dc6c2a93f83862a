"""Spot-check audits: a stratified sample of a run's rewarded completions, with flags worth a look.

``build_audit`` draws rewarded results per (domain, level, early or late half of the run), in
turn from each stratum until the sample is full, with a seeded generator; it re-verifies the sample
with the run's own domains (as ``replay`` builds them) for the verifier's details, and flags:

- *short*: reward 1 with a completion under a third of the length of the domain's references;
- *repeated*: the same completion rewarded on ``REPEAT_TASKS`` or more different tasks;
- *diverging*: between two held-out evaluations, a domain's training reward rose while its held-out
  success fell (only when the run evaluated periodically).

``curriculum.audit_page`` writes the page (``palestra audit``).
"""
from __future__ import annotations

import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from curriculum.replay import as_drawn, readable_task, run_domains
from curriculum.store import StatsStore
from domains.api import Domain, Task
from domains.registry import DomainError
from domains.verify.pool import VerifierPool

SHORT_FRACTION = 1 / 3  # a rewarded completion this much shorter than the references is flagged
REPEAT_TASKS = 3  # a completion rewarded on this many different tasks is flagged
DIVERGENCE = 0.05  # reward up and held-out down by more than this between two evaluations

Stratum = tuple[str, int, str]  # (domain, level, "early" or "late")


@dataclass
class Sampled:
    """One sampled result: the stored row, its task, and what the audit found."""

    row: dict[str, Any]
    stratum: Stratum
    task: Task | None = None
    reference: str | None = None
    verdict: dict[str, Any] | None = None  # the re-verified VerifyResult's JSON
    flags: list[str] = field(default_factory=list)


@dataclass
class Audit:
    run: dict[str, Any]
    size: int
    seed: int
    strata: dict[Stratum, int]  # rewarded results per stratum
    samples: list[Sampled]
    repeated: dict[str, tuple[int, str]]  # completion hash -> (different tasks rewarded on, text), flagged ones
    divergences: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def build_audit(store: StatsStore, run_id: str, size: int = 40, seed: int = 0, workers: int = 2,
                reverify: bool = True) -> Audit:
    run = store.run(run_id)
    results = store.results(run_id)
    rewarded = [r for r in results if r["reward"] > 0 and r["completion"] is not None]
    if not rewarded:
        raise ValueError(f"run {run_id} has no rewarded completions to audit")
    strata = _strata(rewarded)
    samples = _draw(strata, size, random.Random(seed))
    tasks = store.tasks(run_id, {s.row["task_id"] for s in samples})
    for sample in samples:
        sample.task = readable_task(tasks.get(sample.row["task_id"]))
    audit = Audit(run, size, seed, {k: len(v) for k, v in sorted(strata.items())}, samples,
                  _repeated(rewarded), _divergences(store, run_id))
    domains = _domains(run, audit.notes)
    drawn = as_drawn(results, domains)  # a rotated code task shows, and scores, the tests that scored it
    for sample in samples:
        if sample.task is not None and sample.row["domain"] in domains:
            sample.task = drawn(sample.row, sample.task)
    if domains and reverify:
        _reverify(domains, samples, workers)
    _flag(audit, domains)
    return audit


def _strata(rows: list[dict]) -> dict[Stratum, list[dict]]:
    """Rewarded rows by domain, level and half of the run (early: up to the middle step)."""
    first, last = rows[0]["step"], max(r["step"] for r in rows)
    middle = (first + last) / 2
    strata: dict[Stratum, list[dict]] = defaultdict(list)
    for row in rows:
        strata[(row["domain"], row["level"], "early" if row["step"] <= middle else "late")].append(row)
    return strata


def _draw(strata: dict[Stratum, list[dict]], size: int, rng: random.Random) -> list[Sampled]:
    """Up to ``size`` rows, one from each stratum in turn (each stratum shuffled), so a small
    stratum is seen as surely as a large one."""
    queues = {key: rng.sample(rows, len(rows)) for key, rows in sorted(strata.items())}
    chosen: list[Sampled] = []
    while len(chosen) < size and any(queues.values()):
        for key, queue in queues.items():
            if queue and len(chosen) < size:
                chosen.append(Sampled(queue.pop(), key))
    return sorted(chosen, key=lambda s: (s.stratum, s.row["step"], s.row["id"]))


def _repeated(rows: list[dict]) -> dict[str, tuple[int, str]]:
    """Completion hash -> (different tasks it was rewarded on, its text), for the flagged ones.
    Tasks are told apart by their prompts: two code tasks asking the same thing with other hidden
    tests are one question to the model, and one right answer to both is no sign of anything."""
    tasks: dict[str, set[str]] = defaultdict(set)
    texts: dict[str, str] = {}
    for row in rows:
        tasks[row["completion_hash"]].add(row["prompt_hash"])
        texts.setdefault(row["completion_hash"], row["completion"])
    return {h: (len(t), texts[h]) for h, t in tasks.items() if len(t) >= REPEAT_TASKS}


def _divergences(store: StatsStore, run_id: str) -> list[dict[str, Any]]:
    """Domains whose training reward rose while held-out success fell between evaluations: the
    reward compared is the domain's mean over the steps since the evaluation before."""
    evaluations = [r for r in store.metrics(run_id) if "heldout/macro" in r]
    reward: dict[str, list[tuple[int, float, int]]] = defaultdict(list)
    for stat in store.step_stats(run_id):
        reward[stat["domain"]].append((stat["step"], stat["reward_sum"], stat["attempts"]))
    found = []
    windows = list(zip(evaluations, evaluations[1:], evaluations[2:]))
    for before, start, end in windows:
        for domain, stats in sorted(reward.items()):
            key = f"heldout/{domain}"
            if key not in start or key not in end:
                continue
            early = _mean_reward(stats, before["step"], start["step"])
            late = _mean_reward(stats, start["step"], end["step"])
            fell = start[key] - end[key]
            if early is not None and late is not None and late - early > DIVERGENCE and fell > DIVERGENCE:
                found.append({"domain": domain, "from_step": start["step"], "to_step": end["step"],
                              "reward": (early, late), "heldout": (start[key], end[key])})
    return found


def _mean_reward(stats: list[tuple[int, float, int]], after: int, until: int) -> float | None:
    rewards = [(s, n) for step, s, n in stats if after < step <= until]
    attempts = sum(n for _, n in rewards)
    return sum(s for s, _ in rewards) / attempts if attempts else None


def _domains(run: dict, notes: list[str]) -> dict[str, Domain]:
    """The run's domains, built from its stored config; none (and a note) when that fails here."""
    try:
        return run_domains(run)
    except DomainError as exc:
        notes.append(f"the run's domains cannot be loaded here ({exc}): no references or verifier details")
        return {}


def _reverify(domains: dict[str, Domain], samples: list[Sampled], workers: int) -> None:
    checkable = [s for s in samples if s.task is not None and s.row["domain"] in domains]
    with VerifierPool(domains, workers=workers) as pool:
        verdicts = pool.verify_many([(s.task, s.row["completion"]) for s in checkable])
        pool.raise_if_broken()
    for sample, verdict in zip(checkable, verdicts):
        sample.verdict = verdict.result.to_json()


def _flag(audit: Audit, domains: dict[str, Domain]) -> None:
    references: dict[str, list[int]] = defaultdict(list)
    for sample in audit.samples:
        domain = domains.get(sample.row["domain"])
        if domain is not None and sample.task is not None:
            sample.reference = domain.reference(sample.task)
            if sample.reference is not None:
                references[sample.row["domain"]].append(len(sample.reference))
    diverging = {d["domain"]: (d["from_step"], d["to_step"]) for d in audit.divergences}
    for sample in audit.samples:
        row, typical = sample.row, references.get(sample.row["domain"])
        if row["correct"] and typical and len(row["completion"]) < SHORT_FRACTION * statistics.median(typical):
            sample.flags.append(f"short: {len(row['completion'])} characters, the domain's references "
                                f"{statistics.median(typical):.0f}")
        if row["completion_hash"] in audit.repeated:
            sample.flags.append(f"repeated: rewarded on {audit.repeated[row['completion_hash']][0]} different tasks")
        span = diverging.get(row["domain"])
        if span and span[0] < row["step"] <= span[1]:
            sample.flags.append(f"diverging: reward rose while held-out success fell (steps {span[0]}-{span[1]})")
        if sample.verdict is not None and abs(sample.verdict["reward"] - row["reward"]) > 1e-9:
            sample.flags.append(f"re-verified reward {sample.verdict['reward']:.3f} differs from the stored one")
