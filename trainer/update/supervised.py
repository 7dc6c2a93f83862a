"""The supervised loss on reference completions: the SFT warm start trains on it alone, and the
GRPO update blends it in (``sft.blend``).
"""
from __future__ import annotations

import torch

from domains.api import Domain, Task
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
