"""Records that cross the boundary between the trainer (or simulator) and the scheduler."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Plan:
    """What one step trains on: how many prompts to draw per (domain, level)."""

    step: int
    domains: list[str]  # order of the arrays below
    weights: np.ndarray  # [D] mixture weights, sum to 1
    levels: np.ndarray  # [D] current difficulty level per domain (int)
    counts: dict[tuple[str, int], int] = field(default_factory=dict)  # (domain, level) -> prompts

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class Outcome:
    """One verified completion, as the scheduler records it."""

    domain: str
    level: int
    task_id: str
    group: int  # index of the prompt (group) within the step
    reward: float
    correct: bool
    status: str
    advantage: float = 0.0
    prompt_hash: str = ""
    completion_hash: str = ""
    latency_s: float = 0.0
    completion: str = ""  # kept (compressed) for audit and replay
    verifier_version: str = ""
