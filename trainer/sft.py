"""Supervised warm start on the domains' reference completions.

A randomly initialised model never produces a correct answer, so GRPO would see only zero-variance
groups and learn nothing. A short SFT phase on known-good completions gives it a foothold; it
stops well before mastery so that reinforcement learning has something to improve.
"""
from __future__ import annotations

import random
from typing import Callable

import torch

from domains.api import Domain, Task
from trainer.config import SFTConfig
from trainer.models import encode_completion, encode_prompt
from trainer.rollout import left_pad, positions


def reference_pairs(tokenizer, tasks: list[Task], domains: dict[str, Domain]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids + EOS) for each task that has a reference completion."""
    pairs = []
    for task in tasks:
        reference = domains[task.domain].reference(task)
        if reference is not None:
            pairs.append((encode_prompt(tokenizer, task.prompt), encode_completion(tokenizer, reference)))
    return pairs


def supervised_loss(model: torch.nn.Module, pairs: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over the completion tokens only (the prompt is context, not a target)."""
    device = next(model.parameters()).device
    ids, mask = left_pad([p + c for p, c in pairs], pad_id)
    targets = torch.full_like(ids, -100)
    for row, (_, completion) in enumerate(pairs):
        targets[row, ids.shape[1] - len(completion):] = ids[row, ids.shape[1] - len(completion):]
    ids, mask, targets = ids.to(device), mask.to(device), targets.to(device)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets[:, 1:].reshape(-1), ignore_index=-100
    )


def warm_start(
    model: torch.nn.Module, tokenizer, domains: dict[str, Domain], cfg: SFTConfig, *,
    draw: Callable[[dict[tuple[str, int], int]], list[Task]], seed: int, log: Callable[[int, dict], None],
) -> None:
    """``cfg.steps`` AdamW steps on batches spread evenly over every (domain, level)."""
    if cfg.steps == 0:
        return
    rng = random.Random(f"sft/{seed}")
    slots = [(name, level) for name in sorted(domains) for level in domains[name].levels]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)) * max(0.1, 1 - s / cfg.steps)
    )
    model.train()
    for step in range(1, cfg.steps + 1):
        counts: dict[tuple[str, int], int] = {}
        for _ in range(cfg.batch_size):
            slot = rng.choice(slots)
            counts[slot] = counts.get(slot, 0) + 1
        pairs = reference_pairs(tokenizer, draw(counts), domains)
        if not pairs:
            raise RuntimeError("SFT warm start: none of the selected domains provides reference completions")
        loss = supervised_loss(model, pairs, tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 25 == 0 or step == cfg.steps:
            log(step, {"sft/loss": loss.item(), "sft/lr": schedule.get_last_lr()[0]})
