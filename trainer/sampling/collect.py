"""Collecting one step's rollouts: draw the plan's tasks, sample G completions per task in chunks,
verify them in the worker pool (a chunk's verification overlaps the next chunk's sampling) and,
with dynamic sampling, replace the groups whose rewards all agree by fresh ones.

Under ``torchrun`` each rank samples and verifies its share of the tasks and every rank gets the
whole step back; a chunk's sampling noise is seeded by where it sits in the step, never by the
rank, so a step gets the same completions in any number of processes and again after a resume.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

from curriculum.steps import Group
from curriculum.types import Plan
from domains.api import Domain, Task
from domains.verify.pool import Pool
from trainer.config import TrainerConfig
from trainer.distributed import SharedCurriculum, World
from trainer.sampling.batch import (StepBatch, chunk_seed, concat, generation_chunks, planned_first, rollout_on_cpu,
                                    shrink_counts, varied_groups)
from trainer.sampling.episodes import by_rollout, group_rows, sample_rows
from trainer.sampling.rollout import Sampler


@dataclass
class StepRollouts:
    """What one step generated and which of it trains."""

    batch: StepBatch  # the groups trained on, in order: P groups of G rows
    generated: list[StepBatch]  # every batch sampled this step, refills included: all count and are recorded
    kept: list[tuple[int, int]]  # [P] where trained group i was generated: (batch, group)

    def groups(self, advantages: torch.Tensor) -> list[Group]:
        """Every generated group in order, with the advantages it trained on (``advantages`` is
        [P, G], row i for trained group i); a group left out trained on zeros. A task drawn twice
        is two groups."""
        trained = {origin: advantages[i].tolist() for i, origin in enumerate(self.kept)}
        groups = []
        for b, batch in enumerate(self.generated):
            G = batch.group_size
            for p, task in enumerate(batch.tasks):
                rows = slice(p * G, (p + 1) * G)
                groups.append(Group(task, batch.texts[rows], batch.verdicts[rows], trained.get((b, p), [0.0] * G)))
        return groups


class RolloutCollector:
    """Samples and verifies a step's tasks with the policy as it is now."""

    def __init__(self, model: torch.nn.Module, tokenizer, domains: dict[str, Domain], pool: Pool,
                 settings: TrainerConfig, *, seed: int, world: World, device: torch.device,
                 sampler: Callable[[], Sampler], autocast: Callable[[], ContextManager]) -> None:
        self.model, self.tokenizer, self.domains, self.pool = model, tokenizer, domains, pool
        self.settings, self.seed, self.world, self.device = settings, seed, world, device
        self.sampler, self.autocast = sampler, autocast  # the sampler is asked for per chunk: it may hold stale weights
        # async pipeline: the rollouts carry the sampling policy's log-probs, for the update's importance weights
        self.behaviour_logprobs = settings.system.pipeline == "async"

    def collect_step(self, plan: Plan, curriculum: SharedCurriculum, timer: dict[str, float]) -> StepRollouts:
        """The plan's tasks, generated and verified; with dynamic sampling, groups whose rewards all
        agree are left out and replaced, in up to ``max_refill_rounds`` rounds, by groups drawn in the
        plan's own proportions of (domain, level)."""
        t = self.settings
        # oversampling draws k times the plan's prompts at once: on a CPU a bigger first batch costs
        # less than the refill rounds it saves, each of which decodes again from the start
        counts = {slot: n * t.sampling.oversample for slot, n in plan.counts.items()}
        generated = [self.collect(curriculum.draw(counts, step=plan.step), timer, (plan.step, 0))]
        everything = list(range(len(generated[0].tasks)))
        first = planned_first(generated[0], plan.counts, t.prompts_per_step,
                              random.Random(f"oversample/{self.seed}/{plan.step}")) \
            if t.sampling.dynamic_sampling else everything
        kept = [(0, p) for p in first]
        for refill_round in range(1, 1 + (t.sampling.max_refill_rounds if t.sampling.dynamic_sampling else 0)):
            missing = t.prompts_per_step - len(kept)
            if missing <= 0:
                break
            if t.sampling.refill_from == "dropped":  # each planned slot still without a trained group
                wanted = Counter(plan.counts) - Counter(_slot(generated[r].tasks[p]) for r, p in kept)
            else:
                wanted = Counter(_slot(task) for b in generated for task in b.tasks)
            tasks = curriculum.draw(shrink_counts(wanted, missing), step=plan.step)
            refill = self.collect(tasks, timer, (plan.step, refill_round))
            generated.append(refill)
            # keep a random subset of an overshooting refill: the first groups would always favour the
            # kinds sampled first (math before code before tool episodes)
            # (from dropped slots: each slot's own groups first, as in an oversampled first round)
            first_for = dict(wanted) if t.sampling.refill_from == "dropped" else {}
            chosen = planned_first(refill, first_for, missing,
                                   random.Random(f"refill/{self.seed}/{plan.step}/{refill_round}"))
            kept += [(refill_round, p) for p in sorted(chosen)]
        kept = kept or [(0, p) for p in everything]  # nothing varied: train on zeros (a no-op)
        parts = [generated[r].select([p for r2, p in kept if r2 == r]) for r in range(len(generated))]
        batch = concat([b for b in parts if b.tasks], self.tokenizer.pad_token_id)
        return StepRollouts(batch, generated, kept)

    def collect(self, tasks: list[Task], timer: dict[str, float], seed_key: tuple[int, int]) -> StepBatch:
        """G completions per task, sampled in chunks and verified; ``seed_key`` is (step, round).
        Each rank takes its contiguous share of the tasks; the shares are gathered in rank order."""
        t = self.settings
        per_chunk = max(1, t.sampling.rollout_batch_size // t.group_size)
        tasks = [task for kind in by_rollout(tasks, self.domains) for task in kind]  # shares split kinds alike
        lo, hi = self.world.share(len(tasks))
        sampled = []  # (tasks, rollout, texts, verdict futures) per chunk
        start = time.perf_counter()
        self.model.eval()
        for first, chunk in generation_chunks(tasks[lo:hi], per_chunk, self.domains):
            rows = group_rows(chunk, t.group_size)
            noise = torch.Generator(device=self.device).manual_seed(chunk_seed(self.seed, *seed_key, lo + first))
            with self.autocast():
                rollout, texts = sample_rows(
                    self.model, self.tokenizer, rows, self.domains, max_new_tokens=t.sampling.max_new_tokens,
                    max_episode_tokens=t.sampling.max_episode_tokens, temperature=t.sampling.temperature, top_p=t.sampling.top_p,
                    generator=noise, sampler=self.sampler(), keep_cache=t.sampling.episode_cache,
                    with_logprobs=self.behaviour_logprobs)
            futures = [self.pool.submit(task, text) for task, text in zip(rows, texts)]
            sampled.append((chunk, rollout_on_cpu(rollout), texts, futures))
        self.model.train()
        timer["generate"] += time.perf_counter() - start
        start = time.perf_counter()
        parts = [StepBatch(chunk, t.group_size, rollout, texts, [f.result() for f in futures])
                 for chunk, rollout, texts, futures in sampled]
        self.pool.raise_if_broken()  # before a batch of error verdicts reaches the model or the store
        parts = self.world.gather_lists(parts)  # rank order = task order
        timer["verify_wait"] += time.perf_counter() - start  # with several ranks: until every share is in
        return concat(parts, self.tokenizer.pad_token_id)


def _slot(task: Task) -> tuple[str, int]:
    return task.domain, task.level
