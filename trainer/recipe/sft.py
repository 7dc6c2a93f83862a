"""Supervised warm start on the domains' reference completions (its loss: ``trainer.update.supervised``).

A randomly initialised model never produces a correct answer, so GRPO would see only zero-variance
groups and learn nothing. A short SFT phase on known-good completions gives it a foothold; it
stops well before mastery so that reinforcement learning has something to improve.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Callable

import torch

from domains.api import Domain, Task
from trainer.config import SFTConfig
from trainer.update.supervised import example_losses, length_buckets, reference_pairs


def _accumulate(model, tokenizer, tasks: list[Task], domains: dict[str, Domain], max_tokens: int,
                grad_scale: float = 1.0) -> float | None:
    """Backward the batch's loss, the mean over examples of each one's mean token loss, one length
    bucket at a time; returns it (None when no task has a reference). Every example counts alike,
    however long and whichever bucket it shares: the batch's mix of (domain, level) is the draw's,
    not its lengths', and the gradient does not depend on ``max_tokens``."""
    examples = reference_pairs(tokenizer, tasks, domains)
    total = 0.0
    for bucket in length_buckets(examples, max_tokens):
        loss = example_losses(model, bucket, tokenizer.pad_token_id).sum() / len(examples)
        (loss * grad_scale if grad_scale != 1.0 else loss).backward()
        total += loss.item()
    return total if examples else None


def warm_start_counts(domains: dict[str, Domain], level_decay: float, k: int, rng: random.Random
                      ) -> dict[tuple[str, int], int]:
    """How many of ``k`` examples each (domain, level) gets in a warm-start batch: every domain
    alike, and within one, level i+1 ``level_decay`` times as likely as level i. Easier levels get
    more of the budget because a small model masters them first, which is where GRPO finds groups
    with mixed outcomes to learn from."""
    slots = [(name, level) for name in sorted(domains) for level in domains[name].levels]
    weights = [level_decay ** domains[name].levels.index(level) for name, level in slots]
    return dict(Counter(rng.choices(slots, weights=weights, k=k)))


def warm_start(
    model: torch.nn.Module, tokenizer, domains: dict[str, Domain], cfg: SFTConfig, *,
    draw: Callable[[dict[tuple[str, int], int]], list[Task]], seed: int, log: Callable[[int, dict], None],
    grad_scale: float = 1.0,
) -> None:
    """``cfg.steps`` AdamW steps on batches spread evenly over every (domain, level). ``grad_scale``
    scales the gradient (sharded ranks that each compute the same batch's, then sum them, take
    1/ranks of it)."""
    if cfg.steps == 0:
        return
    rng = random.Random(f"sft/{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)) * max(0.1, 1 - s / cfg.steps)
    )
    model.train()
    for step in range(1, cfg.steps + 1):
        tasks = draw(warm_start_counts(domains, cfg.level_decay, cfg.batch_size, rng))
        optimizer.zero_grad(set_to_none=True)
        loss = _accumulate(model, tokenizer, tasks, domains, cfg.micro_batch_tokens, grad_scale)
        if loss is None:
            raise RuntimeError("SFT warm start: none of the selected domains provides reference completions")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 25 == 0 or step == cfg.steps:
            log(step, {"sft/loss": loss, "sft/lr": schedule.get_last_lr()[0]})
