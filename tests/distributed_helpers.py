"""A deterministic domain with graded rewards, for tests/test_distributed.py.

The reward is the share of distinct digits in the completion, so an untrained model already gets
varied rewards within a group (and GRPO a non-zero gradient). It lives in its own module because
the trainer processes that torchrun starts, and their spawned verifier workers, import it by name
(the test puts this folder on PYTHONPATH).
"""
from __future__ import annotations

import random

from domains.api import Domain, Status, Task, VerifyResult, user_prompt


class DigitShare(Domain):
    name = "digit_share"
    levels = (1, 2)

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        return [Task(self.name, level, user_prompt(f"digits {level} {rng.randint(0, 10**6)}"), {}) for _ in range(n)]

    def verify(self, task: Task, completion: str) -> VerifyResult:
        share = len(set(completion) & set("0123456789")) / 10
        return VerifyResult(share, share == 1.0, Status.OK if share == 1.0 else Status.WRONG)

    def reference(self, task: Task) -> str:
        return "0123456789"


DIGITS = DigitShare()


def main_with_a_failing_rank() -> None:
    """``palestra-train``, except that rank ``FAIL_RANK`` raises when step 2 starts."""
    import os

    from trainer import app
    from trainer.recipe.grpo import GRPORecipe

    train_step = GRPORecipe.train_step

    def failing_step(self, step):
        if step == 2 and self.world.rank == int(os.environ["FAIL_RANK"]):
            raise RuntimeError(f"injected failure on rank {self.world.rank}")
        return train_step(self, step)

    GRPORecipe.train_step = failing_step
    app.main()


if __name__ == "__main__":  # torchrun ... -m distributed_helpers
    main_with_a_failing_rank()
