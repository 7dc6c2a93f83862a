"""Canaries of the tool domains: transcripts an episode's grader must never pay for.

Built from a task's reference turns (its calls, then its final turn), each breaks what the grader
demands: the calls made without a final answer, a call to a tool the environment lacks, the calls
cut short or skipped, a malformed call, a hedged or wrong final answer. A canary that keeps the
reference's final answer applies only where the turns it plays leave the environment in another
state than the reference does: a calculator task is graded on its answer alone, so answering right
without the calls is a right answer there, not an exploit.
"""
from __future__ import annotations

import json

from domains.api import Canary, Task
from domains.tools.calls import CLOSE, render_call


def _transcript(turns: list[str]) -> str:
    """Assistant turns as a transcript (the verifier ignores tool messages: they are left out)."""
    return json.dumps([{"role": "assistant", "content": text} for text in turns], ensure_ascii=False)


def _calls_and_final(task: Task) -> tuple[list[str], str] | None:
    turns = task.payload.get("reference_turns")
    if not turns:
        return None
    return list(turns[:-1]), turns[-1]


def tool_canaries(domain) -> dict[str, Canary]:
    """The canaries of ``domain`` (a ``ToolDomain``): some replay turns in its environment to tell
    whether they miss the reference's state."""

    def misses_state(task: Task, turns: list[str]) -> bool:
        env = domain.environment(task)
        for text in turns:
            env.step(text)
        return env.state_hash() != domain.target_hash(task)

    def calls_without_answer(task: Task) -> str | None:
        found = _calls_and_final(task)
        return _transcript(found[0]) if found and found[0] else None

    def unknown_tool(task: Task) -> str | None:
        return _transcript([render_call("python", code="print(answer)"), "done"])

    def answer_without_calls(task: Task) -> str | None:
        found = _calls_and_final(task)
        return _transcript([found[1]]) if found and found[0] and misses_state(task, []) else None

    def one_call_short(task: Task) -> str | None:
        found = _calls_and_final(task)
        if not found or not found[0] or not misses_state(task, found[0][:-1]):
            return None
        return _transcript(found[0][:-1] + [found[1]])

    def malformed_call(task: Task) -> str | None:
        found = _calls_and_final(task)
        if not found or not found[0]:
            return None
        return _transcript([found[0][0].replace(CLOSE, "")] + found[0][1:] + [found[1]])

    def answered(task: Task, final: str) -> str | None:
        found = _calls_and_final(task)
        return _transcript(found[0] + [final]) if found and task.payload.get("answer") is not None else None

    def gold(task: Task) -> str:
        return str(task.payload.get("answer"))

    return {
        "calls_without_answer": calls_without_answer,
        "unknown_tool": unknown_tool,
        "answer_without_calls": answer_without_calls,
        "one_call_short": one_call_short,
        "malformed_call": malformed_call,
        "hedged_answer": lambda t: answered(t, f"\\boxed{{{gold(t)}}} or \\boxed{{{gold(t)}0}}"),
        "wrong_answer": lambda t: answered(t, f"\\boxed{{{gold(t)}0}}"),
    }
