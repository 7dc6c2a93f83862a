"""The GRPO learning-rate schedule: a linear warm-up, then constant, linear or cosine decay."""
from __future__ import annotations

import math


def lr_factor(step: int, warmup: int, total: int, decay: str) -> float:
    """The multiple of ``trainer.lr`` for the update after ``step`` earlier ones: it rises linearly
    over ``warmup`` updates, then holds (``constant``) or falls to zero at update ``total``
    (``linear``, ``cosine``), as TRL's and verl's schedules of those names do."""
    if step < warmup:
        return (step + 1) / warmup
    if decay == "constant" or total <= warmup:
        return 1.0
    left = max(0.0, 1.0 - (step - warmup) / (total - warmup))  # 1 at the end of warm-up, 0 at the end
    return left if decay == "linear" else 0.5 * (1.0 - math.cos(math.pi * left))
