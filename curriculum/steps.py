"""What a trainer hands the curriculum after a step — its groups — and what the curriculum makes of
them: one store row per completion and the step's per-domain metrics. Every trainer (Palestra's
recipe, the TRL integration) records through these, so their stored runs read alike."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from curriculum.types import Outcome, Plan, rewards_agree
from domains.api import FAILURE_STATUSES, Domain, Status, Task, led_members, stable_hash
from domains.verify.pool import Verdict


@dataclass
class Group:
    """One prompt's G verified completions, as trained on (or generated and left out)."""

    task: Task
    texts: list[str]  # [G] decoded completions
    verdicts: list[Verdict]  # [G]
    advantages: Sequence[float]  # [G] what each completion trained on; zeros for a group left out

    @property
    def rewards(self) -> list[float]:  # [G]
        return [v.result.reward for v in self.verdicts]


def outcomes(groups: Sequence[Group], domains: dict[str, Domain]) -> list[Outcome]:
    """One store row per completion; ``group`` numbers the groups of the step in the order given."""
    rows = []
    for index, group in enumerate(groups):
        task = group.task
        prompt_hash, version = stable_hash(task.prompt), domains[task.domain].version
        led = led_members(task, len(group.texts))
        for member, (text, verdict, advantage) in enumerate(zip(group.texts, group.verdicts, group.advantages)):
            rows.append(Outcome(
                domain=task.domain, level=task.level, task_id=task.id, group=index,
                reward=verdict.result.reward, correct=verdict.result.correct, status=verdict.result.status.value,
                advantage=float(advantage), prompt_hash=prompt_hash, completion_hash=stable_hash(text),
                latency_s=verdict.latency_s, completion=text, verifier_version=version, led=member < led,
            ))
    return rows


def plan_metrics(plan: Plan, groups: Sequence[Group]) -> dict[str, Any]:
    """The step's ``domain/<name>/...`` metrics: the plan's weight, level and prompts for every
    domain, and what its completions earned for those that had any; and ``plan/seen_step``, the
    last step whose results the plan saw."""
    per_domain = domain_metrics(groups)
    # which step's statistics the plan was made from: a plan made ahead (the async pipeline) saw fewer
    metrics: dict[str, Any] = {"plan/seen_step": int(plan.seen_step)}
    hinted = hinted_groups(plan, groups)
    for i, name in enumerate(plan.domains):
        metrics[f"domain/{name}/weight"] = float(plan.weights[i])
        metrics[f"domain/{name}/level"] = int(plan.levels[i])
        metrics[f"domain/{name}/prompts"] = sum(n for (d, _), n in plan.counts.items() if d == name)
        if hinted is not None:
            metrics[f"domain/{name}/hinted"] = hinted[name]
        for key, value in per_domain.get(name, {}).items():
            metrics[f"domain/{name}/{key}"] = value
    return metrics


def trained_metrics(trained: Iterable[str], domains: Iterable[str] = ()) -> dict[str, int]:
    """The step's ``domain/<name>/trained`` metrics: per domain, how many groups reached the update.
    ``trained`` names the domain of each such group (refills that trained count, groups dynamic
    sampling left out do not). Every one of ``domains`` gets its count, 0 included (the trainer
    names the plan's, as ``prompts`` has them); any other domain only when it trained a group (the
    simulator names none: thousands of domains would fill each stored row with zeros)."""
    counts = Counter(trained)
    names = list(domains)
    names += sorted(set(counts) - set(names))
    return {f"domain/{name}/trained": counts[name] for name in names}


def hinted_groups(plan: Plan, groups: Sequence[Group]) -> Counter[str] | None:
    """Per domain, the step's groups whose task carried a hint (``meta["hint"]``); None, and no
    ``hinted`` metric, at a step whose plan hints nothing and that drew no hinted task."""
    hinted = Counter(g.task.domain for g in groups if g.task.meta.get("hint"))
    if not hinted and (plan.hints is None or not np.any(plan.hints > 0)):
        return None
    return hinted


def domain_metrics(groups: Sequence[Group]) -> dict[str, dict[str, float]]:
    """Per domain: reward, success, zero-variance share, error counts, success by level and (tool
    domains) call statistics."""
    by_domain: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        by_domain[group.task.domain].append(group)
    return {name: _one_domain(found) for name, found in by_domain.items()}


def domain_values(metrics: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The ``domain/<domain>/<name>`` entries of a step's metrics, by domain (what plan_metrics wrote)."""
    head, tail = "domain/", f"/{name}"
    return {key[len(head):-len(tail)]: value for key, value in metrics.items()
            if key.startswith(head) and key.endswith(tail) and "/" not in key[len(head):-len(tail)]}


def domain_totals(rows: Iterable[Mapping[str, Any]], name: str) -> dict[str, int]:
    """Per domain, the ``domain/<domain>/<name>`` counts summed over many steps' metrics rows."""
    totals: dict[str, int] = {}
    for row in rows:
        for domain, value in domain_values(row, name).items():
            totals[domain] = totals.get(domain, 0) + int(value)
    return totals


def format_error_examples(groups: Sequence[Group]) -> dict[str, str]:
    """Per domain, the first completion of the step the verifier called a format error."""
    examples: dict[str, str] = {}
    for group in groups:
        for text, verdict in zip(group.texts, group.verdicts):
            if verdict.result.status == Status.FORMAT_ERROR:
                examples.setdefault(group.task.domain, text)
    return examples


def _one_domain(groups: list[Group]) -> dict[str, float]:
    """One domain's step metrics. Reward and success are the model's own, as the statistics count
    them: a led group's led members (``led_members``) are left out, and their success is
    ``led_success``; counts of completions, errors and calls take every completion."""
    members = [(g.task.level, v.result, j < led_members(g.task, len(g.verdicts)))
               for g in groups for j, v in enumerate(g.verdicts)]
    results = [(level, r) for level, r, _ in members]
    own = [(level, r) for level, r, led in members if not led]  # never empty: at most half a group is led
    statuses = Counter(r.status for _, r in results)
    stats = {
        "completions": len(results),
        "reward": float(np.mean([r.reward for _, r in own])),
        "success": float(np.mean([r.correct for _, r in own])),
        "zero_var": float(np.mean([bool(rewards_agree(g.rewards)) for g in groups])),
        "errors": sum(statuses[s] for s in FAILURE_STATUSES),
        "format_errors": statuses[Status.FORMAT_ERROR],
        "unscored": sum(not r.scored for _, r in results),  # the verifier could not judge: no verdict
    }
    for level in sorted({lv for lv, _ in own}):
        stats[f"level{level}/success"] = float(np.mean([r.correct for lv, r in own if lv == level]))
    led = [r.correct for _, r, is_led in members if is_led]
    if led:
        stats["led_success"] = float(np.mean(led))
    episodes = [r.details for _, r in results if "turns" in r.details]
    if episodes:  # tool domains: their verifier reports what it replayed
        calls = sum(d.get("calls", 0) for d in episodes)
        stats["tool_calls"] = calls / len(episodes)
        stats["turns"] = float(np.mean([d["turns"] for d in episodes]))
        stats["invalid_call_rate"] = sum(d.get("invalid_calls", 0) for d in episodes) / max(1, calls)
    return stats
