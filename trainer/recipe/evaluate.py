"""Held-out evaluation per domain and level on a fixed set that training never draws from."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from curriculum.tasks import heldout_per_level
from domains.api import Domain, Task
from domains.verify.pool import Pool
from domains.registry import DomainError
from trainer.config import EvalConfig, SamplingConfig
from trainer.sampling.episodes import by_rollout, sample_rows
from trainer.sampling.rollout import Sampler, generate


Hits = dict[tuple[str, int], list[float]]  # (domain, level) -> each held-out task's success (0/1, or a share)


def heldout_tasks(domains: dict[str, Domain], per_level: int, seed: int, min_per_domain: int = 0) -> list[Task]:
    """Every domain's held-out tasks, level by level: ``per_level`` at each, or more where a domain
    has too few levels to reach ``min_per_domain`` (a one-level domain scored on four tasks swings
    a whole point of its success on one answer). A domain that cannot draw them (a plugin's
    ``sample`` that raises, a dataset without tasks at a level) is named in a DomainError."""
    tasks: list[Task] = []
    for name in sorted(domains):
        levels = domains[name].levels
        per = heldout_per_level(per_level, min_per_domain, len(levels))
        for level in levels:
            try:
                tasks.extend(domains[name].heldout(level, per, seed))
            except Exception as exc:  # a plugin's bug, not ours: say whose
                raise DomainError(f"domain {name!r} could not draw its held-out tasks at level {level}: "
                                  f"{type(exc).__name__}: {exc}") from exc
    return tasks


def evaluate(
    model: torch.nn.Module, tokenizer, tasks: list[Task], pool: Pool, *,
    max_new_tokens: int, max_episode_tokens: int = 256, temperature: float = 0.0, batch_size: int = 64, seed: int = 0,
    samples: int = 1, sampler: Sampler = generate,
) -> Hits:
    """Each task's success, grouped by (domain, level) in the order of ``tasks``: 0 or 1, or with
    ``samples`` > 1 the share of that many completions that succeed (sampled pass@1, the way RLVR
    papers report it at a temperature). ``summarise`` turns them into rates and
    ``paired_gain_interval`` compares two evaluations of the same tasks."""
    hinted = [task.id for task in tasks if task.meta.get("hint")]
    if hinted:  # a hint (or a lead) would score the help, not the model
        raise ValueError(f"held-out evaluation got {len(hinted)} hinted tasks (the first: {hinted[0]}); "
                         "it scores plain tasks only")
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    futures, ordered = [], []
    draws = [task for task in tasks for _ in range(samples)]
    model.eval()
    for kind in by_rollout(draws, pool.domains):  # keeps order within a kind: a task's copies stay together
        for start in range(0, len(kind), batch_size):
            chunk = kind[start:start + batch_size]
            _, texts = sample_rows(model, tokenizer, chunk, pool.domains, max_new_tokens=max_new_tokens,
                                   max_episode_tokens=max_episode_tokens, temperature=temperature, generator=generator,
                                   sampler=sampler)
            futures += [pool.submit(task, text) for task, text in zip(chunk, texts)]
            ordered += chunk
    model.train()
    correct = [float(future.result().result.correct) for future in futures]
    pool.raise_if_broken()
    hits: Hits = defaultdict(list)
    for start in range(0, len(ordered), samples):
        task = ordered[start]
        hits[(task.domain, task.level)].append(sum(correct[start:start + samples]) / samples)
    return dict(hits)


class HeldoutEvaluation:
    """The run's fixed held-out set, how it is decoded, and what it scored before and after GRPO."""

    def __init__(self, domains: dict[str, Domain], settings: EvalConfig, sampling: SamplingConfig) -> None:
        self.tasks = heldout_tasks(domains, settings.tasks_per_level, settings.seed, settings.min_tasks_per_domain)
        self.cfg, self.sampling = settings, sampling  # the eval section; the trainer's sampling for the token budgets
        self.hits: dict[str, Hits] = {}  # "before"/"after" GRPO: held-out success, task by task

    def run(self, model: torch.nn.Module, tokenizer, pool: Pool, sampler: Sampler,
            keep: str | None = None) -> dict[str, float]:
        """Evaluate now; ``keep`` files the result under "before" or "after" GRPO."""
        hits = evaluate(model, tokenizer, self.tasks, pool, max_new_tokens=self.sampling.max_new_tokens,
                        max_episode_tokens=self.sampling.max_episode_tokens, temperature=self.cfg.temperature,
                        batch_size=self.sampling.rollout_batch_size, seed=self.cfg.seed, samples=self.cfg.samples,
                        sampler=sampler)
        if keep:
            self.hits[keep] = hits
        return summarise(hits)

    def settings(self) -> dict:
        """What decides how the held-out tasks are decoded and scored, besides the tasks themselves."""
        return {"temperature": self.cfg.temperature, "samples": self.cfg.samples,
                "max_new_tokens": self.sampling.max_new_tokens, "max_episode_tokens": self.sampling.max_episode_tokens}

    def summary(self) -> dict:
        """Held-out success before and after GRPO, the macro gain and its paired 95% interval."""
        before, after = (summarise(self.hits[k]) if k in self.hits else {} for k in ("before", "after"))
        summary = {"before": before, "after": after, "macro_gain": None}
        if before and after:
            summary["macro_gain"] = after["eval/macro"] - before["eval/macro"]
            summary["macro_gain_ci95"] = paired_gain_interval(self.hits["before"], self.hits["after"], seed=self.cfg.seed)
        return summary

    def state_dict(self) -> dict:
        return {"heldout_hits": self.hits, "heldout_ids": [t.id for t in self.tasks],
                "heldout_settings": self.settings()}

    def load_state_dict(self, state: dict) -> bool:
        """The evaluations of a checkpoint; False (and none kept) when its held-out tasks or their
        settings differ from this run's, so nothing after could be compared with them."""
        self.hits = state.get("heldout_hits", {})
        settings = self.settings()
        if state.get("heldout_ids") != [t.id for t in self.tasks] or state.get("heldout_settings", settings) != settings:
            self.hits = {}
            return False
        return True


def summarise(hits: Hits) -> dict[str, float]:
    metrics: dict[str, float] = {}
    per_domain: dict[str, list[float]] = defaultdict(list)
    for (name, level), values in sorted(hits.items()):
        metrics[f"eval/{name}/level{level}"] = sum(values) / len(values)
        per_domain[name].extend(values)
    for name, values in per_domain.items():
        metrics[f"eval/{name}"] = sum(values) / len(values)
    metrics["eval/macro"] = sum(metrics[f"eval/{n}"] for n in per_domain) / max(1, len(per_domain))
    return metrics


def paired_gain_interval(before: Hits, after: Hits, *, level: float = 0.95, resamples: int = 2000,
                         seed: int = 0) -> tuple[float, float]:
    """A bootstrap confidence interval for the macro gain ``after - before`` on the same tasks.

    Each resample draws tasks with replacement within every (domain, level) cell and scores the
    same draw before and after. Pairing is what makes a small gain measurable: a task that both
    evaluations solve (or both miss) adds no noise, where two independent samples would."""
    if before.keys() != after.keys() or any(len(before[c]) != len(after[c]) for c in before):
        raise ValueError("the two evaluations are not of the same held-out tasks")
    rng = np.random.default_rng(seed)
    gains_by_domain: dict[str, list[np.ndarray]] = defaultdict(list)
    for cell in sorted(before):
        diff = np.asarray(after[cell]) - np.asarray(before[cell])
        draws = rng.integers(0, len(diff), size=(resamples, len(diff)))
        gains_by_domain[cell[0]].append(diff[draws])  # [resamples, tasks in the cell]
    # a domain's rate pools its cells (as in summarise); the macro averages the domains
    per_domain = [np.concatenate(cells, axis=1).mean(axis=1) for cells in gains_by_domain.values()]
    macro = np.mean(per_domain, axis=0)
    tail = (1.0 - level) / 2
    return float(np.quantile(macro, tail)), float(np.quantile(macro, 1.0 - tail))


def format_eval(metrics: dict[str, float], title: str) -> str:
    names = sorted(k.split("/")[1] for k in metrics if k.count("/") == 1 and k != "eval/macro")
    width = max([len("macro"), *map(len, names)]) + 2
    lines = [title] + [f"  {n:<{width}}{metrics[f'eval/{n}']:.3f}" for n in names]
    lines.append(f"  {'macro':<{width}}{metrics['eval/macro']:.3f}")
    return "\n".join(lines)
