"""Held-out evaluation per domain and level on a fixed set that training never draws from."""
from __future__ import annotations

from collections import defaultdict

import torch

from domains.api import Domain, Task
from domains.pool import VerifierPool
from trainer.models import encode_prompt
from trainer.rollout import generate


def heldout_tasks(domains: dict[str, Domain], per_level: int, seed: int) -> list[Task]:
    tasks: list[Task] = []
    for name in sorted(domains):
        for level in domains[name].levels:
            tasks.extend(domains[name].heldout(level, per_level, seed))
    return tasks


def evaluate(
    model: torch.nn.Module, tokenizer, tasks: list[Task], pool: VerifierPool, *,
    max_new_tokens: int, temperature: float = 0.0, batch_size: int = 64, seed: int = 0,
) -> dict[str, float]:
    """Success rate per domain (``eval/<domain>``), per level and the macro average."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    futures = []
    model.eval()
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start:start + batch_size]
        rollout = generate(
            model, [encode_prompt(tokenizer, t.prompt) for t in chunk], max_new_tokens=max_new_tokens,
            eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, temperature=temperature,
            generator=generator,
        )
        texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=False)
        futures += [pool.submit(task, text) for task, text in zip(chunk, texts)]
    model.train()
    hits: dict[tuple[str, int], list[float]] = defaultdict(list)
    for task, future in zip(tasks, futures):
        hits[(task.domain, task.level)].append(float(future.result().result.correct))
    return summarise(hits)


def summarise(hits: dict[tuple[str, int], list[float]]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    per_domain: dict[str, list[float]] = defaultdict(list)
    for (name, level), values in sorted(hits.items()):
        metrics[f"eval/{name}/level{level}"] = sum(values) / len(values)
        per_domain[name].extend(values)
    for name, values in per_domain.items():
        metrics[f"eval/{name}"] = sum(values) / len(values)
    metrics["eval/macro"] = sum(metrics[f"eval/{n}"] for n in per_domain) / max(1, len(per_domain))
    return metrics


def format_eval(metrics: dict[str, float], title: str) -> str:
    names = sorted(k.split("/")[1] for k in metrics if k.count("/") == 1 and k != "eval/macro")
    lines = [title] + [f"  {n:<22}{metrics[f'eval/{n}']:.3f}" for n in names]
    lines.append(f"  {'macro':<22}{metrics['eval/macro']:.3f}")
    return "\n".join(lines)
