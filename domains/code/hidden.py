"""Hidden, rotated tests: which of a code task's tests score a completion.

A task's ``cases`` are its pool of hidden tests. With ``hidden_tests.score`` set, a training draw
scores only a seeded subset of that many, and the subset changes as the task comes back: each
training step (``rotate: step``) or each time the same task is drawn again (``rotate: epoch``; for
a dataset drawn evenly, its pass over the data). A policy that fits the tests it was paid for
meets others the next time. Held-out evaluation scores the whole pool.

Examples shown in the prompt never score: a procedural task keeps its shown examples apart from
its cases, and a stdin/stdout case whose input and output both appear in the task's prompt (an
APPS statement's sample) is left out of every subset and of the held-out pool.

The subset travels in the payload as ``scored_tests`` (indices into ``cases``; the task's id does
not change) and comes back in the verdict's details. It is a function of the task, the options and
the step or draw count only, all of which the store keeps (the run's config, each result's step,
the groups a task was drawn in), so ``palestra replay`` draws it again and scores exactly the tests
that scored the stored result. HumanEval's ``check(candidate)`` is one trusted function, not
separate cases: it always scores whole.
"""
from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field

from domains.api import Task, stable_hash
from domains.config import StrictModel

log = logging.getLogger("palestra.code")

SCORED_KEY = "scored_tests"


class HiddenTestsConfig(StrictModel):
    """The ``hidden_tests`` options of a code domain; off (every test scores) unless ``score`` is set."""

    score: int | None = Field(None, ge=1)  # tests that score a training completion at once; None: all
    rotate: Literal["step", "epoch"] = "step"  # a new subset every training step, or every draw of the task
    seed: int = 0


def shown_in_prompt(task: Task) -> set[int]:
    """Indices of the stdin/stdout cases the prompt shows (input and output both in its text)."""
    if task.payload.get("format") != "stdio":
        return set()
    text = "\n".join(m["content"] for m in task.prompt)
    return {i for i, case in enumerate(task.payload.get("cases", []))
            if case["input"].strip() and case["output"].strip()
            and case["input"].strip() in text and case["output"].strip() in text}


def hidden_indices(task: Task) -> list[int]:
    """Indices of the cases the prompt does not show; every case when it shows them all (a row
    whose tests are only its samples has nothing else to score)."""
    shown = shown_in_prompt(task)
    everything = range(len(task.payload.get("cases", [])))
    return [i for i in everything if i not in shown] or list(everything)


def full_pool(task: Task) -> list[int] | None:
    """The held-out subset: every hidden case; None when that is every case."""
    return _unless_every(task, hidden_indices(task))


def _unless_every(task: Task, hidden: list[int]) -> list[int] | None:
    return hidden if len(hidden) < len(task.payload.get("cases", [])) else None


def scoring_subset(task: Task, config: HiddenTestsConfig, turn: int) -> list[int] | None:
    """The seeded subset of hidden tests that scores ``task`` on its ``turn`` (a step or a draw
    count); None when every test scores (rotation off, or HumanEval)."""
    if config.score is None or task.payload.get("format") == "humaneval":
        return None
    pool = hidden_indices(task)
    if len(pool) <= config.score:  # too few to rotate: all of them score
        return _unless_every(task, pool)
    rng = random.Random(stable_hash("hidden-tests", config.seed, task.id, turn))
    return sorted(rng.sample(pool, config.score))


def heldout_version(task: Task, config: HiddenTestsConfig) -> Task:
    """A held-out task scores its whole pool of hidden tests (with hidden tests on: not the cases
    its prompt shows)."""
    if config.score is None or task.payload.get("format") == "humaneval":
        return task
    return with_subset(task, full_pool(task))


def with_subset(task: Task, subset: list[int] | None) -> Task:
    """``task`` scoring only ``subset`` of its cases (None: all of them); the id stays the task's."""
    payload = {k: v for k, v in task.payload.items() if k != SCORED_KEY}
    if subset is not None:
        payload[SCORED_KEY] = list(subset)
    return task if payload == task.payload else replace(task, payload=payload)


def scored_cases(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The cases that score: the payload's subset when it names one, else every case."""
    cases = payload["cases"]
    subset = payload.get(SCORED_KEY)
    return cases if subset is None else [cases[i] for i in subset]


class TooFewToRotate:
    """Says once per domain that some of its tasks have too few hidden tests to rotate (they score all)."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def note(self, task: Task, config: HiddenTestsConfig) -> None:
        if task.domain in self.said or config.score is None:
            return
        if task.payload.get("format") == "humaneval":
            why = "HumanEval's check() is one function and scores whole"
        elif (hidden := len(hidden_indices(task))) <= config.score:
            why = (f"task {task.meta.get('task_id') or task.id} has {hidden} hidden tests, "
                   f"not more than hidden_tests.score={config.score}")
        else:
            return
        self.said.add(task.domain)
        log.warning("%s: %s; such tasks score every test they have (said once)", task.domain, why)


TOO_FEW = TooFewToRotate()
