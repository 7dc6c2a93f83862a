"""Draw training tasks for a plan, keeping the held-out evaluation tasks out of training; with a
prompt selector, each slot draws extra candidates and the selector picks. A training draw is
handed to its domain's ``drawn`` with the step and how often the task was drawn before (counted
for the domains that ask, such as hidden code tests rotated by epoch)."""
from __future__ import annotations

import random
from collections import Counter

from curriculum.prompts import PromptSelector
from domains.api import Domain, Task


class TaskSource:
    def __init__(self, domains: dict[str, Domain], heldout_ids: set[str], seed: int,
                 selector: PromptSelector | None = None) -> None:
        self.domains = domains
        self.heldout_ids = heldout_ids
        self.rng = random.Random(f"train/{seed}")
        self.selector = selector
        self.visits: Counter[str] = Counter()  # training draws of each task of a domain that counts them

    def draw(self, counts: dict[tuple[str, int], int], step: int | None = None,
             rng: random.Random | None = None) -> list[Task]:
        """Tasks for each (domain, level) slot of a plan, in a deterministic order. With a training
        ``step`` and a prompt selector, each slot draws extra candidates and the selector picks.
        A draw with its own ``rng`` leaves the training stream (``self.rng``) where it was."""
        rng = self.rng if rng is None else rng
        tasks: list[Task] = []
        for (name, level), n in sorted(counts.items()):
            if n <= 0:
                continue
            if step is None or self.selector is None:
                chosen = self._draw_one(name, level, n, rng)
            else:
                candidates = self._draw_one(name, level, self.selector.candidates(name, n), rng)
                chosen = self.selector.choose(name, level, candidates, n, step)
            tasks.extend(chosen if step is None else [self._drawn(name, t, step) for t in chosen])
        return tasks

    def _drawn(self, name: str, task: Task, step: int) -> Task:
        domain = self.domains[name]
        if not domain.rotates:
            return task
        if not domain.counts_draws:
            return domain.drawn(task, step, 0)
        visit = self.visits[task.id]
        self.visits[task.id] += 1
        return domain.drawn(task, step, visit)

    def _draw_one(self, name: str, level: int, n: int, rng: random.Random) -> list[Task]:
        domain = self.domains[name]
        kept: list[Task] = []
        # Held-out tasks are rejected and redrawn. A domain whose every task is held out would
        # loop forever, so after a generous number of rounds we give up loudly.
        for _ in range(50):
            kept += [t for t in domain.sample(level, n - len(kept), rng) if t.id not in self.heldout_ids]
            if len(kept) >= n:
                return kept[:n]
        raise RuntimeError(f"domain {name!r} level {level}: could not draw {n} tasks outside the held-out set")

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "visits": dict(self.visits)}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(_as_rng_state(state["rng"]))
        self.visits = Counter(state.get("visits", {}))  # a checkpoint from before visits were counted has none


def _as_rng_state(state):
    # random.getstate() is a nested tuple; it may come back from storage as lists
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
