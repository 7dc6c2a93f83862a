"""Test-only domains for tests/test_trl_integration.py.

Their own module, not the test file, because the verifier pool's spawned workers unpickle a domain
by importing its module; the test puts this folder on ``sys.path`` (workers inherit it).
"""
from __future__ import annotations

import random

from domains.api import Domain, Status, Task, VerifyResult, user_prompt


class ByLengthDomain(Domain):
    """Every completion is "correct"; the reward is its length mod 5, over 4 (0, .25, ... 1).

    "Always correct" makes the mix and the difficulty move for sure (prioritized drops the domain,
    threshold raises its level); a reward that depends on the text makes "TRL got the verifier's
    reward" a real check, and gives groups non-zero advantages.
    """

    name = "by_length"
    levels = (1, 2, 3)

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        return [Task(self.name, level, user_prompt(f"{rng.randint(0, 99)}+{level}="), {"level": level})
                for _ in range(n)]

    def verify(self, task: Task, completion: str) -> VerifyResult:
        return VerifyResult((len(completion) % 5) / 4, True, Status.OK, {"length": len(completion)})


class CrashingDomain(Domain):
    """A verifier with a bug: it raises on every completion (the pool turns that into reward 0)."""

    name = "crashing"
    levels = (1,)

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        return [Task(self.name, level, user_prompt(f"{rng.randint(0, 9)}*2="), {}) for _ in range(n)]

    def verify(self, task: Task, completion: str) -> VerifyResult:
        raise ZeroDivisionError("the verifier divided by zero")


BY_LENGTH = ByLengthDomain()
CRASHING = CrashingDomain()
