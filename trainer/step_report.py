"""What a GRPO step reports: its metrics, overall and per domain, and the store's outcome rows."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np
import torch

from curriculum.types import Outcome, Plan
from domains.api import FAILURE_STATUSES, Domain, Status, Task, stable_hash
from domains.verify.pool import Verdict
from trainer.batch import StepBatch


def outcomes(recorded: list[StepBatch], kept: list[tuple[int, int]], advantages: torch.Tensor,
             domains: dict[str, Domain]) -> list[Outcome]:
    """One store row per completion generated this step, refills included. ``kept[i]`` is where
    trained group i was generated, (batch, group), and ``advantages[i]`` its advantages; completions
    that were not trained on (discarded zero-variance groups) get advantage 0."""
    trained_adv = {origin: advantages[i].tolist() for i, origin in enumerate(kept)}
    rows, group = [], 0
    for b, batch in enumerate(recorded):
        for p, task in enumerate(batch.tasks):
            group_adv = trained_adv.get((b, p), [0.0] * batch.group_size)
            prompt_hash = stable_hash(task.prompt)
            version = domains[task.domain].version
            for g in range(batch.group_size):
                row = p * batch.group_size + g
                verdict, text = batch.verdicts[row], batch.texts[row]
                rows.append(Outcome(
                    domain=task.domain, level=task.level, task_id=task.id, group=group,
                    reward=verdict.result.reward, correct=verdict.result.correct,
                    status=verdict.result.status.value, advantage=group_adv[g],
                    prompt_hash=prompt_hash, completion_hash=stable_hash(text), latency_s=verdict.latency_s,
                    completion=text, verifier_version=version,
                ))
            group += 1
    return rows


def step_metrics(step: int, plan: Plan, batch: StepBatch, recorded: list[StepBatch], update: dict[str, float],
                 timer: dict[str, float]) -> dict[str, Any]:
    """The step's metrics: overall (reward, lengths, time split, the update's loss terms) and per domain."""
    r = batch.rollout
    lengths = r.completion_mask.sum(dim=1).float()
    rewards = batch.rewards
    generated_tokens = sum(int(b.rollout.completion_mask.sum()) for b in recorded)
    all_tasks = [t for b in recorded for t in b.tasks]
    all_verdicts = [v for b in recorded for v in b.verdicts]
    metrics: dict[str, Any] = {
        "step": step,
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
        "zero_variance_share": float(torch.cat([b.zero_variance() for b in recorded]).float().mean()),
        "completion_len/mean": float(lengths.mean()), "completion_len/max": float(lengths.max()),
        "truncated_rate": float(r.truncated.float().mean()),
        "rollouts": sum(len(b.verdicts) for b in recorded),
        "tokens_per_s": generated_tokens / max(timer["generate"], 1e-9),
        "time/generate": timer["generate"], "time/verify_wait": timer["verify_wait"], "time/train": timer["train"],
        **update,
    }
    per_domain = domain_metrics(all_tasks, all_verdicts, batch.group_size, recorded)
    for i, name in enumerate(plan.domains):
        row = per_domain.get(name, {})
        metrics[f"domain/{name}/weight"] = float(plan.weights[i])
        metrics[f"domain/{name}/level"] = int(plan.levels[i])
        metrics[f"domain/{name}/prompts"] = sum(n for (d, _), n in plan.counts.items() if d == name)
        for key, value in row.items():
            metrics[f"domain/{name}/{key}"] = value
    return metrics


def domain_metrics(tasks: list[Task], verdicts: list[Verdict], group_size: int,
                   recorded: list[StepBatch]) -> dict[str, dict[str, float]]:
    """Reward, zero-variance share, error counts, success by level and (tool domains) call stats."""
    rows: dict[str, list] = defaultdict(list)
    for i, verdict in enumerate(verdicts):
        rows[tasks[i // group_size].domain].append((tasks[i // group_size].level, verdict.result))
    zero_var: dict[str, list[bool]] = defaultdict(list)
    for b in recorded:
        for task, flat in zip(b.tasks, b.zero_variance().tolist()):
            zero_var[task.domain].append(flat)
    out = {}
    for name, results in rows.items():
        statuses = Counter(r.status for _, r in results)
        stats = {
            "reward": float(np.mean([r.reward for _, r in results])), "zero_var": float(np.mean(zero_var[name])),
            "errors": sum(statuses[status] for status in FAILURE_STATUSES),
            "format_errors": statuses[Status.FORMAT_ERROR],
            "unscored": sum(not r.scored for _, r in results),  # the verifier could not judge: no verdict
        }
        for level in sorted({lv for lv, _ in results}):
            stats[f"level{level}/success"] = float(np.mean([r.correct for lv, r in results if lv == level]))
        episodes = [r.details for _, r in results if "turns" in r.details]
        if episodes:  # tool domains: their verifier reports what it replayed
            calls = sum(d.get("calls", 0) for d in episodes)
            stats["tool_calls"] = calls / len(episodes)
            stats["turns"] = float(np.mean([d["turns"] for d in episodes]))
            stats["invalid_call_rate"] = sum(d.get("invalid_calls", 0) for d in episodes) / max(1, calls)
        out[name] = stats
    return out
