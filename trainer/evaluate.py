"""Held-out evaluation per domain and level on a fixed set that training never draws from."""
from __future__ import annotations

from collections import defaultdict

import torch

from domains.api import Domain, Task
from domains.backend import Pool
from trainer.episodes import by_domain, sample_rows
from trainer.rollout import Sampler, generate


def heldout_tasks(domains: dict[str, Domain], per_level: int, seed: int) -> list[Task]:
    tasks: list[Task] = []
    for name in sorted(domains):
        for level in domains[name].levels:
            tasks.extend(domains[name].heldout(level, per_level, seed))
    return tasks


def evaluate(
    model: torch.nn.Module, tokenizer, tasks: list[Task], pool: Pool, *,
    max_new_tokens: int, max_episode_tokens: int = 256, temperature: float = 0.0, batch_size: int = 64, seed: int = 0,
    sampler: Sampler = generate,
) -> dict[str, float]:
    """Success rate per domain (``eval/<domain>``), per level and the macro average."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    futures, ordered = [], []
    model.eval()
    for kind in by_domain(tasks):
        for start in range(0, len(kind), batch_size):
            chunk = kind[start:start + batch_size]
            _, texts = sample_rows(model, tokenizer, chunk, pool.domains, max_new_tokens=max_new_tokens,
                                   max_episode_tokens=max_episode_tokens, temperature=temperature, generator=generator,
                                   sampler=sampler)
            futures += [pool.submit(task, text) for task, text in zip(chunk, texts)]
            ordered += chunk
    model.train()
    hits: dict[tuple[str, int], list[float]] = defaultdict(list)
    for task, future in zip(ordered, futures):
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
    width = max([len("macro"), *map(len, names)]) + 2
    lines = [title] + [f"  {n:<{width}}{metrics[f'eval/{n}']:.3f}" for n in names]
    lines.append(f"  {'macro':<{width}}{metrics['eval/macro']:.3f}")
    return "\n".join(lines)
