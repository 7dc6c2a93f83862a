"""Recording a scored plan step from another trainer: the one way TRL's and verl's integrations
turn a step's completions into Palestra groups and hand them to the Curriculum."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from curriculum.curriculum import Curriculum
from curriculum.steps import Group
from curriculum.types import rewards_agree
from domains.api import Task
from domains.verify.pool import Verdict
from trainer.distributed import SharedCurriculum
from trainer.update.losses import group_advantages


def record_step(curriculum: Curriculum | SharedCurriculum, step: int, tasks: Sequence[Task],
                scored: Sequence[Sequence[tuple[str, Verdict]]], advantage_std: str,
                extra: dict[str, Any] | None = None) -> None:
    """Record plan step ``step``: task p's completions ``scored[p]`` as (text, verdict), with the
    advantages Palestra's trainer would give them (so the learnability signals mean the same in
    every run), and the step's overall metrics under the keys Palestra's trainer stores."""
    rewards = torch.tensor([[v.result.reward for _, v in done] for done in scored], dtype=torch.float32)  # [P, G]
    advantages = group_advantages(rewards, advantage_std)  # [P, G]
    groups = [Group(task, [text for text, _ in done], [verdict for _, verdict in done], advantages[p].tolist())
              for p, (task, done) in enumerate(zip(tasks, scored))]
    metrics = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
               "zero_variance_share": float(rewards_agree(rewards.numpy()).mean()), "rollouts": rewards.numel(),
               **(extra or {})}
    curriculum.record(step, groups, metrics)
