"""The canary check of a training run (the ``audit`` config group).

At the start of every launch and every ``audit.every`` GRPO steps, each domain's canaries
(``domains.canaries``) are verified through the run's own verifier pool on a few held-out tasks per
level. A canary that earns reward raises a health alarm naming the domain and the canary, and the
check's counts are stored with the step's metrics. Alarms never stop a run, with one opt-in
exception: ``stop_on_canary`` stops it with a checkpoint that resumes.

The check draws no training randomness (held-out tasks come from their own seeded stream) and
changes nothing the run samples or trains on, so a run with it and one without give the same
numbers.
"""
from __future__ import annotations

from collections import Counter

from pydantic import Field

from domains.canaries import CanaryResult
from domains.config import StrictModel


class AuditConfig(StrictModel):
    at_start: bool = True  # check the canaries when a launch starts (a fresh run or a resume)
    every: int = Field(0, ge=0)  # also every this many GRPO steps; 0: never during training
    tasks_per_level: int = Field(1, ge=1)  # held-out tasks per level each canary is written for
    stop_on_canary: bool = False  # a canary that earns reward stops the run (with a checkpoint)

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0


class CanaryPaid(RuntimeError):
    """``audit.stop_on_canary`` is set and a canary earned reward; one line, with how to go on."""


def canary_summary(step: int, results: list[CanaryResult]) -> str:
    """The console line of one check: how many canaries ran, and which earned reward or failed."""
    domains = len({r.domain for r in results})
    paid = sum(r.paid for r in results)
    line = f"canary check at step {step}: {len(results)} canary completions of {domains} domains, {paid} earned reward"
    broken = Counter(f"{r.domain}:{r.canary}" for r in results if r.status == "canary_error")
    if broken:
        line += f"; canaries that raised: {', '.join(sorted(broken))}"
    unscored = sum(not r.scored for r in results)
    if unscored:
        line += f"; {unscored} could not be judged"
    return line
