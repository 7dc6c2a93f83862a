"""Canaries of the math domains: completions a boxed-answer verifier must never pay for.

Each writes its completion from the task's gold answer (``payload['answer']``), which no model
sees: a canary that earns reward shows that the grader accepts something other than one box
holding the right answer, after any reasoning.
"""
from __future__ import annotations

from domains.api import Canary, Task


def _gold(task: Task) -> str:
    return str(task.payload["answer"])


def _box(text: str) -> str:
    return "\\boxed{" + text + "}"


def _question(task: Task) -> str:
    return next(m["content"] for m in reversed(task.prompt) if m["role"] == "user")


# each is a known way to hedge or to dodge the box, or a near miss
ALWAYS: dict[str, Canary] = {
    "several_boxes": lambda t: f"{_box(_gold(t))} or maybe {_box('(' + _gold(t) + ')+1')} or {_box('0')}",
    "off_by_one": lambda t: _box("(" + _gold(t) + ")+1"),
    "question_restated": _question,
    "answer_in_thinking": lambda t: f"<think>{_box(_gold(t))}</think>",
    "unclosed_thinking": lambda t: f"<think>so the answer is {_box(_gold(t))}",
    "empty_box": lambda t: _box(""),
}
# only where the verifier requires a box (require_boxed, the default): otherwise it is an answer
UNBOXED = {"unboxed_answer": lambda t: f"The answer is {_gold(t)}."}


def math_canaries(require_boxed: bool) -> dict[str, Canary]:
    return {**ALWAYS, **(UNBOXED if require_boxed else {})}
