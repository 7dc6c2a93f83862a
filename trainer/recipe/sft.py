"""Supervised warm start on the domains' reference completions.

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
from trainer.models.loading import encode_completion, encode_prompt
from trainer.sampling.episodes import transcript_tokens
from trainer.sampling.rollout import left_pad, positions


Example = tuple[list[int], list[int], list[int]]  # prompt ids, completion ids, loss mask over the completion


def reference_pairs(tokenizer, tasks: list[Task], domains: dict[str, Domain]) -> list[Example]:
    """(prompt, completion + EOS, loss mask) for each task that has a reference completion; tool
    transcripts keep the tool responses in the sequence but out of the loss."""
    examples = []
    for task in tasks:
        domain = domains[task.domain]
        reference = domain.reference(task)
        if reference is None:
            continue
        if domain.multi_turn:
            completion, mask = transcript_tokens(tokenizer, reference, domain.stop_text)
        else:
            completion = encode_completion(tokenizer, reference)
            mask = [1] * len(completion)
        examples.append((encode_prompt(tokenizer, task.prompt), completion, mask))
    return examples


def token_losses(model: torch.nn.Module, examples: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy [B, L] of every predicted token and the mask [B, L] of those that count: the
    masked-in completion tokens (the prompt is context, not a target)."""
    device = next(model.parameters()).device
    ids, mask = left_pad([p + c for p, c, _ in examples], pad_id)
    targets = torch.full_like(ids, -100)
    width = ids.shape[1]
    for row, (_, completion, loss_mask) in enumerate(examples):
        keep = torch.tensor(loss_mask, dtype=torch.bool)
        span = ids[row, width - len(completion):]
        targets[row, width - len(completion):] = torch.where(keep, span, torch.full_like(span, -100))
    ids, mask, targets = ids.to(device), mask.to(device), targets[:, 1:].to(device)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits[:, :-1]
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100, reduction="none"
    ).view(targets.shape)
    return losses, targets != -100


def supervised_loss(model: torch.nn.Module, examples: list[Example], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over the examples' counted tokens."""
    losses, counted = token_losses(model, examples, pad_id)
    return losses.sum() / counted.sum().clamp(min=1)


def example_losses(model: torch.nn.Module, examples: list[Example], pad_id: int) -> torch.Tensor:
    """Each example's mean cross-entropy over its own counted tokens [B]."""
    losses, counted = token_losses(model, examples, pad_id)
    return losses.sum(dim=1) / counted.sum(dim=1).clamp(min=1)


def length_buckets(examples: list[Example], max_tokens: int) -> list[list[Example]]:
    """The examples sorted by length and cut into micro-batches of at most ``max_tokens`` padded
    tokens (a longer example gets one of its own). Lengths differ by domain and level (a short
    answer, a long tool transcript): padded to its own longest row, a step of the main job's warm
    start took 0.52 s instead of 0.86 s with one micro-batch per domain (bench/cpu_phases.py: 0.82
    with levels drawn evenly)."""
    buckets: list[list[Example]] = []
    for example in sorted(examples, key=lambda e: len(e[0]) + len(e[1])):
        longest = len(example[0]) + len(example[1])  # sorted: the newest row is the longest
        if buckets and (len(buckets[-1]) + 1) * longest <= max_tokens:
            buckets[-1].append(example)
        else:
            buckets.append([example])
    return buckets


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
