"""Draw training tasks for a plan, keeping the held-out evaluation tasks out of training; with a
prompt selector, each slot draws extra candidates and the selector picks. A training draw is
handed to its domain's ``drawn`` with the step and how often the task was drawn before (counted
for the domains that ask, such as hidden code tests rotated by epoch).

With hint shares (the plan's ``hints``, from ``cold_start``), ``share * n`` of a domain's ``n``
tasks in a training draw, rounded up or down at random, are put in their hinted form
(``Domain.hinted``, in the ``hint_form`` asked for: words, or a lead the trainer writes for half of
each group); the rounding and the tasks come from a generator seeded by (seed, step,
domain), and a task the domain has no hint for stays plain. The
hint comes before ``drawn``: a hinted task is a task of its own (its id differs), counted, rotated
and replayed as one. A draw without a step (held-out sets, the SFT blend) never carries hints."""
from __future__ import annotations

import math
import random
from collections import Counter
from typing import Mapping

from curriculum.prompts import PromptSelector
from domains.api import Domain, Task
from domains.registry import DomainError


def heldout_per_level(per_level: int, min_per_domain: int, levels: int) -> int:
    """Held-out tasks at each level of a domain with ``levels`` levels: ``per_level``, or more where
    that would leave the domain below ``min_per_domain`` in all."""
    return max(per_level, math.ceil(min_per_domain / levels))


class TaskSource:
    def __init__(self, domains: dict[str, Domain], heldout_ids: set[str], seed: int,
                 selector: PromptSelector | None = None, hint_form: str = "words") -> None:
        self.domains, self.hint_form = domains, hint_form
        self.heldout_ids = heldout_ids
        self.rng, self.seed = random.Random(f"train/{seed}"), seed
        self.selector = selector
        self.visits: Counter[str] = Counter()  # training draws of each task of a domain that counts them
        if heldout_ids:
            self._check_room()

    def _check_room(self) -> None:
        """Say at the start, not at the first plan that reaches it, where the held-out set covers a
        (domain, level)'s whole task space (a dataset with eight distinct tasks and 20 held out).
        The test draws come from a generator of their own: the training stream is untouched."""
        rng = random.Random(f"room/{self.seed}")
        for name in sorted(self.domains):
            for level in self.domains[name].levels:
                self._draw_one(name, level, 1, rng)

    def draw(self, counts: dict[tuple[str, int], int], step: int | None = None,
             rng: random.Random | None = None, hints: Mapping[str, float] | None = None) -> list[Task]:
        """Tasks for each (domain, level) slot of a plan, in a deterministic order. With a training
        ``step`` and a prompt selector, each slot draws extra candidates and the selector picks;
        with a training ``step`` and ``hints`` (domain -> share), that share of each domain's tasks
        is hinted. A draw with its own ``rng`` leaves the training stream (``self.rng``) where it was."""
        rng = self.rng if rng is None else rng
        slots: list[tuple[str, list[Task]]] = []
        for (name, level), n in sorted(counts.items()):
            if n <= 0:
                continue
            if step is None or self.selector is None:
                chosen = self._draw_one(name, level, n, rng)
            else:
                candidates = self._draw_one(name, level, self.selector.candidates(name, n), rng)
                chosen = self.selector.choose(name, level, candidates, n, step)
            slots.append((name, chosen))
        if step is None:
            return [task for _, chosen in slots for task in chosen]
        hinted = self._hinted_positions(slots, step, hints or {})
        tasks: list[Task] = []
        for name, chosen in slots:
            for task in chosen:
                if len(tasks) in hinted:
                    task = self.domains[name].hinted(task, self.hint_form) or task
                tasks.append(self._drawn(name, task, step))
        return tasks

    def _hinted_positions(self, slots: list[tuple[str, list[Task]]], step: int,
                          hints: Mapping[str, float]) -> set[int]:
        """Positions in the draw of the tasks to hint: ``share * n`` of each domain's ``n``, over all
        of its levels, rounded at random (up with the chance of its fraction). Why at random: a
        domain drawn once or twice a step (8 prompts over 8 domains) would otherwise see a share
        under a half rounded to no hint at all, and its hints withdrawn at its first success."""
        positions: dict[str, list[int]] = {}
        index = 0
        for name, chosen in slots:
            positions.setdefault(name, []).extend(range(index, index + len(chosen)))
            index += len(chosen)
        hinted: set[int] = set()
        for name, found in positions.items():
            expected = min(1.0, max(0.0, float(hints.get(name, 0.0)))) * len(found)
            rng = random.Random(f"hints/{self.seed}/{step}/{name}")
            k = math.floor(expected)
            if expected > k:  # an exact count draws no number: it picks the tasks it picked before random rounding
                k += rng.random() < expected - k
            if k > 0:
                hinted.update(rng.sample(found, k))
        return hinted

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
        raise DomainError(f"domain {name!r} level {level}: could not draw {n} tasks outside the held-out set in 50 "
                          "rounds (its task space is about the size of the held-out set); hold out fewer "
                          "(eval.tasks_per_level, eval.min_tasks_per_domain) or leave the domain out")

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "visits": dict(self.visits)}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(_as_rng_state(state["rng"]))
        self.visits = Counter(state.get("visits", {}))  # a checkpoint from before visits were counted has none


def _as_rng_state(state):
    # random.getstate() is a nested tuple; it may come back from storage as lists
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
