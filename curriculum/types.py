"""Records that cross the boundary between the trainer (or simulator) and the scheduler."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Plan:
    """What one step trains on: how many prompts to draw per (domain, level)."""

    step: int
    domains: list[str]  # order of the arrays below
    weights: np.ndarray  # [D] mixture weights, sum to 1
    levels: np.ndarray  # [D] current difficulty level per domain (int)
    counts: dict[tuple[str, int], int] = field(default_factory=dict)  # (domain, level) -> prompts
    hints: np.ndarray | None = None  # [D] share of each domain's training tasks drawn hinted (None: none)
    # the last step whose results the plan saw (0: none). One less than ``step`` when steps run in
    # turn; two less under the trainer's async pipeline, which plans step t+1 before recording step t
    seen_step: int = 0

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
    # written by the trainer's lead (a led group's first members, ``domains.api.led_members``):
    # stored with the rest, left out of the statistics, which measure what the domain does unled
    led: bool = False


# Rewards closer than this are equal: a group of partial rewards whose float values differ in the
# last bits still teaches nothing.
ZERO_VARIANCE_TOLERANCE = 1e-9


def spread_is_zero(lowest: Any, highest: Any) -> np.ndarray:
    """Per group, from its lowest and highest reward: whether its rewards all agree."""
    return (np.asarray(highest) - np.asarray(lowest)) < ZERO_VARIANCE_TOLERANCE


def rewards_agree(rewards: Any) -> np.ndarray:
    """[..., G] rewards -> [...] bool: the groups whose completions all earned the same reward (zero
    variance: every group-relative advantage is 0, so GRPO learns nothing from them). The one
    definition behind dynamic sampling, the logged zero-variance share and the stored counts that
    the mixing policies read."""
    r = np.asarray(rewards)
    return spread_is_zero(r.min(axis=-1), r.max(axis=-1))


@dataclass
class GroupArrays:
    """One step's outcomes as arrays, one row per group (prompt): what a trainer that computes in
    arrays — the simulator — records instead of building an ``Outcome`` per completion. The
    scheduler aggregates the arrays directly; iterating yields the equivalent ``Outcome`` rows
    (built only when something asks for them, such as the store's ``results`` table). Verdicts
    are ``ok`` or ``wrong`` only: there are no verifier failures in arrays."""

    domains: list[str]  # [P] each group's domain
    levels: np.ndarray  # [P] each group's level
    task_ids: list[str]  # [P]
    reward: np.ndarray  # [P, G]
    correct: np.ndarray  # [P, G] bool
    advantage: np.ndarray  # [P, G]
    # [P] how many of each row's first members a lead wrote (``Outcome.led``); None: none were
    led: np.ndarray | None = None

    def __len__(self) -> int:
        return self.reward.size

    def __iter__(self):
        rewards, correct, advantages = self.reward.tolist(), self.correct.tolist(), self.advantage.tolist()
        led = [0] * len(self.domains) if self.led is None else self.led.tolist()
        for g, (domain, level, task) in enumerate(zip(self.domains, self.levels.tolist(), self.task_ids)):
            for j, (r, c, a) in enumerate(zip(rewards[g], correct[g], advantages[g])):
                yield Outcome(domain, level, task, g, r, c, "ok" if c else "wrong", a, led=j < led[g])
