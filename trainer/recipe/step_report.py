"""What a GRPO step reports of itself: reward, lengths, the time split and the update's loss terms.
The per-domain metrics come from the curriculum, which records the step (``curriculum.steps``)."""
from __future__ import annotations

from typing import Any

import torch

from trainer.sampling.collect import StepRollouts


def step_metrics(step: int, rollouts: StepRollouts, update: dict[str, float], timer: dict[str, float]) -> dict[str, Any]:
    """Reward and lengths of the rows trained on; zero-variance share, rollouts and tokens/s of
    everything generated (refills included); the update's statistics."""
    batch, generated = rollouts.batch, rollouts.generated
    r = batch.rollout
    lengths = r.completion_mask.sum(dim=1).float()
    rewards = batch.rewards
    generated_tokens = sum(int(b.rollout.completion_mask.sum()) for b in generated)
    return {
        "step": step,
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
        "zero_variance_share": float(torch.cat([b.zero_variance() for b in generated]).float().mean()),
        "completion_len/mean": float(lengths.mean()), "completion_len/max": float(lengths.max()),
        "truncated_rate": float(r.truncated.float().mean()),
        "rollouts": sum(len(b.verdicts) for b in generated),
        "tokens_per_s": generated_tokens / max(timer["generate"], 1e-9),
        "time/generate": timer["generate"], "time/verify_wait": timer["verify_wait"], "time/train": timer["train"],
        **update,
    }
