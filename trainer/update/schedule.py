"""The GRPO learning-rate schedule: a linear warm-up, then constant, linear or cosine decay."""
from __future__ import annotations

import math


def lr_factor(step: int, warmup: int, total: int, decay: str) -> float:
    """The multiple of ``trainer.optim.lr`` for the update after ``step`` earlier ones: it rises linearly
    over ``warmup`` updates, then holds (``constant``) or falls towards zero (``linear``,
    ``cosine``), which it would reach at update ``total``: the last of ``total`` updates takes
    1/(total − warmup) of the rate, as in transformers' schedules of those names."""
    if step < warmup:
        return (step + 1) / warmup
    if decay == "constant" or total <= warmup:
        return 1.0
    left = max(0.0, 1.0 - (step - warmup) / (total - warmup))  # 1 at the end of warm-up, 0 at the end
    return left if decay == "linear" else 0.5 * (1.0 - math.cos(math.pi * left))


def apply_settings(optimizer, lr_schedule, lr: float, weight_decay: float) -> None:
    """Puts the configured ``lr`` and ``weight_decay`` into an optimizer and LambdaLR schedule
    just loaded from a checkpoint. Loading brings back the values the run started with (the
    optimizer's groups and the schedule's ``base_lrs``), so a resume launched with another rate
    would otherwise print the change and go on at the old one. With unchanged settings this
    recomputes exactly the rate the schedule had set (the same product, base × factor)."""
    factors = [f(lr_schedule.last_epoch) for f in lr_schedule.lr_lambdas]
    lr_schedule.base_lrs = [lr] * len(optimizer.param_groups)
    for group, factor in zip(optimizer.param_groups, factors):
        group.update(initial_lr=lr, lr=lr * factor, weight_decay=weight_decay)
    lr_schedule._last_lr = [group["lr"] for group in optimizer.param_groups]  # what get_last_lr() reports
