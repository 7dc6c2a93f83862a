"""Tool environments and the base class of tool domains.

An episode: the model sees the task's prompt, writes an assistant turn; if the turn holds tool calls
the environment runs them and its answer goes back as one tool message; a turn without calls is the
final answer and ends the episode. ``ToolEnvironment.step`` is that loop's only moving part, so the
trainer's rollout and the verifier's replay run exactly the same code.

What counts as what:

- **malformed** (unclosed or nested tags, bad JSON, duplicate keys, oversized calls, not
  ``{"name", "arguments"}``): fatal — the episode ends and the verifier says ``format_error``.
  Going on would only spend generation on a transcript that scores 0 anyway.
- **invalid** (unknown tool, arguments that fail the tool's JSON schema, a tool that refuses, e.g.
  deleting a missing key): the call gets an ``{"error": ...}`` result, is counted in
  ``invalid_calls`` and changes nothing; the episode goes on and can still succeed.

Tools are methods marked with ``@tool``; dispatch looks the name up in the class's registry of such
methods — never ``eval`` or ``getattr`` on a model-chosen string.
"""
from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import jsonschema
from pydantic import Field

from domains.api import Canary, Domain, DomainConfig, Status, Task, VerifyResult, stable_hash
from domains.tools.calls import CLOSE, Call, CallFormatError, loads_strict, parse_turn
from domains.tools.canaries import tool_canaries

MAX_TURN_CHARS = 16_384  # longer assistant turns are malformed before any parsing
MAX_TRANSCRIPT_CHARS = 262_144
MAX_CALLS_PER_TURN = 8
ERROR_CHARS = 160  # error observations are fed back to the model: keep them short


class ToolError(Exception):
    """Raised by a tool for a call it refuses; becomes an ``{"error": ...}`` observation."""


def tool(name: str, description: str, **properties: dict[str, Any]) -> Callable:
    """Mark an environment method as a tool. ``properties`` are JSON-schema properties of its
    arguments; all are required and no others are allowed."""
    schema = {"type": "object", "properties": properties, "required": sorted(properties),
              "additionalProperties": False}

    def mark(method: Callable) -> Callable:
        method.tool_spec = {"name": name, "description": description, "parameters": schema}
        return method
    return mark


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False)


def _error(message: str) -> dict[str, str]:
    return {"error": message[:ERROR_CHARS]}


@dataclass
class Turn:
    """What one assistant turn did.

    ``observation``: the tool message to append (None when nothing goes back: a final answer, or a
    malformed turn). ``done``: the episode is over. ``calls``/``invalid_calls``: this turn's counts.
    ``format_error``: why the turn was malformed (then ``done`` is True).
    """

    observation: str | None
    done: bool
    invalid_calls: int = 0
    calls: int = 0
    format_error: str | None = None


class ToolEnvironment:
    """One episode's state and tools. Subclasses add ``@tool`` methods and implement ``state``."""

    _tools: ClassVar[dict[str, Callable]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        registry: dict[str, Callable] = {}
        for klass in reversed(cls.__mro__):
            for attr in vars(klass).values():
                spec = getattr(attr, "tool_spec", None)
                if spec is not None:
                    registry[spec["name"]] = attr
        cls._tools = registry

    def __init__(self) -> None:
        self.done = False
        self.turns = 0
        self.calls = 0
        self.invalid_calls = 0
        self.last_text = ""  # the final assistant turn, calls removed (where answers are read)

    # -- what the model sees ---------------------------------------------------------------------
    @classmethod
    def tools(cls) -> list[dict[str, Any]]:
        """OpenAI-style schemas (``name``, ``description``, ``parameters``), e.g. for a chat template."""
        return [copy.deepcopy(method.tool_spec) for method in cls._tools.values()]  # callers may edit

    # -- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Canonical JSON-able state; two environments in the same state return equal dicts."""
        raise NotImplementedError(f"{type(self).__name__} must implement state()")

    def state_hash(self) -> str:
        return stable_hash(self.state())

    # -- the episode ----------------------------------------------------------------------------
    def step(self, assistant_text: str) -> Turn:
        """Apply one assistant turn and say what goes back to the model."""
        if self.done:
            return Turn(None, True, format_error="the episode is already over")
        self.turns += 1
        try:
            if len(assistant_text) > MAX_TURN_CHARS:
                raise CallFormatError(f"assistant turn longer than {MAX_TURN_CHARS} characters")
            parsed = parse_turn(assistant_text, MAX_CALLS_PER_TURN)
        except CallFormatError as exc:
            self.done = True
            return Turn(None, True, format_error=str(exc))
        if not parsed.calls:  # no call: this is the final answer
            self.done, self.last_text = True, parsed.text
            return Turn(None, True)
        outcomes = [self._run(call) for call in parsed.calls]
        results = [value for value, _ in outcomes]
        invalid = sum(1 for _, ok in outcomes if not ok)
        self.calls += len(results)
        self.invalid_calls += invalid
        observation = _compact(results[0] if len(results) == 1 else results)
        return Turn(observation, False, invalid_calls=invalid, calls=len(results))

    def _run(self, call: Call) -> tuple[Any, bool]:
        """(result, valid): an invalid call's result is an ``{"error": ...}`` object."""
        method = self._tools.get(call.name)
        if method is None:
            return _error(f"unknown tool {call.name!r}; tools: {','.join(self._tools)}"), False
        schema = method.tool_spec["parameters"]
        problem = jsonschema.exceptions.best_match(_validator(_compact(schema)).iter_errors(call.arguments))
        if problem is not None:
            where = "/".join(map(str, problem.absolute_path)) or "arguments"
            return _error(f"{call.name}: {where}: {problem.message}"), False
        try:
            return method(self, **call.arguments), True
        except ToolError as exc:
            return _error(f"{call.name}: {exc}"), False


# -- transcripts -------------------------------------------------------------------------------------
def parse_transcript(completion: str) -> list[dict[str, str]]:
    """The episode after the prompt as chat messages. Text that is not a JSON list is one assistant
    turn, so single-turn use (and a model that answers at once) still works."""
    if len(completion) > MAX_TRANSCRIPT_CHARS:
        raise CallFormatError(f"transcript longer than {MAX_TRANSCRIPT_CHARS} characters")
    stripped = completion.strip()
    if not stripped.startswith("["):
        return [{"role": "assistant", "content": completion}]
    try:
        messages = loads_strict(stripped, MAX_TRANSCRIPT_CHARS)
    except CallFormatError:
        return [{"role": "assistant", "content": completion}]  # text that merely starts with "["
    if not isinstance(messages, list) or not messages:
        raise CallFormatError("a transcript is a non-empty list of messages")
    for message in messages:
        if (not isinstance(message, dict) or message.get("role") not in ("assistant", "tool")
                or not isinstance(message.get("content"), str)):
            raise CallFormatError('each message is {"role": "assistant"|"tool", "content": <string>}')
    if messages[0]["role"] != "assistant":
        raise CallFormatError("a transcript starts with an assistant turn")
    return messages


def boxed_answers(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` in ``text`` (braces matched, so nesting comes out whole)."""
    found, pos = [], 0
    while (start := text.find("\\boxed{", pos)) >= 0:
        depth, i = 0, start + len("\\boxed")
        for i in range(start + len("\\boxed"), len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
        if depth:
            break  # unclosed box: no answer from here on
        found.append(text[start + len("\\boxed{"):i].strip())
        pos = i + 1
    return found


# -- domains ---------------------------------------------------------------------------------------------
class ToolConfig(DomainConfig):
    max_turns: int = Field(default=4, ge=1, le=64)  # assistant turns, the final answer included
    invalid_call_penalty: float = Field(default=0.0, ge=0.0, le=1.0)  # per invalid call, on success
    max_new_tokens: int | None = Field(default=80, gt=0)  # per assistant turn: a compact call is ~60 chars


class ToolDomain(Domain):
    """Base of tool domains. Subclasses implement ``sample`` and ``environment``; a task's payload
    holds ``reference_turns`` (assistant turns that solve it) and, when an answer is required,
    ``answer`` (compared with the single ``\\boxed{}`` of the final turn)."""

    Config: ClassVar[type[DomainConfig]] = ToolConfig
    multi_turn = True
    stop_text = CLOSE  # a turn ends at its tool call's closing tag: the environment answers the call

    def environment(self, task: Task) -> ToolEnvironment:
        raise NotImplementedError(f"domain {self.name!r} must implement environment()")

    def check_answer(self, task: Task, final_text: str) -> bool:
        gold = task.payload.get("answer")
        if gold is None:
            return True
        boxes = set(boxed_answers(final_text))
        return len(boxes) == 1 and boxes.pop() == str(gold)

    # -- reference ------------------------------------------------------------------------------
    def reference(self, task: Task) -> str:
        """The reference turns played against a fresh environment, with its real responses."""
        env = self.environment(task)
        messages = []
        for text in task.payload["reference_turns"]:
            turn = env.step(text)
            messages.append({"role": "assistant", "content": text})
            if turn.observation is not None:
                messages.append({"role": "tool", "content": turn.observation})
        return json.dumps(messages, ensure_ascii=False)

    def canaries(self) -> dict[str, Canary]:
        return tool_canaries(self)

    def target_hash(self, task: Task) -> str:
        env = self.environment(task)
        for text in task.payload["reference_turns"]:
            env.step(text)
        return env.state_hash()

    # -- verification ---------------------------------------------------------------------------
    def verify(self, task: Task, completion: str) -> VerifyResult:
        """Replay the transcript's assistant turns on a fresh environment; its tool messages are
        ignored, so a made-up tool response changes nothing."""
        try:
            turns = [m["content"] for m in parse_transcript(completion) if m["role"] == "assistant"]
        except CallFormatError as exc:
            return VerifyResult.failure(Status.FORMAT_ERROR, str(exc), turns=0, calls=0, invalid_calls=0)
        env = self.environment(task)
        counts = {"turns": len(turns)}
        if len(turns) > self.config.max_turns:
            return VerifyResult.failure(Status.WRONG, f"{len(turns)} assistant turns > max_turns "
                                        f"{self.config.max_turns}", **counts, calls=0, invalid_calls=0)
        for index, text in enumerate(turns):
            turn = env.step(text)
            if turn.format_error:
                return VerifyResult.failure(Status.FORMAT_ERROR, f"turn {index + 1}: {turn.format_error}",
                                            **counts, calls=env.calls, invalid_calls=env.invalid_calls)
            if turn.done and index < len(turns) - 1:
                return VerifyResult.failure(Status.FORMAT_ERROR, f"turn {index + 1} ended the episode "
                                            "but more turns follow", **counts, calls=env.calls,
                                            invalid_calls=env.invalid_calls)
        return self._grade(task, env, counts)

    def _grade(self, task: Task, env: ToolEnvironment, counts: dict[str, int]) -> VerifyResult:
        details = {**counts, "calls": env.calls, "invalid_calls": env.invalid_calls}
        if not env.done:
            return VerifyResult.failure(Status.WRONG, "no final answer (the last turn calls a tool)", **details)
        state_ok = env.state_hash() == self.target_hash(task)
        answer_ok = self.check_answer(task, env.last_text)
        details.update(state_ok=state_ok, answer_ok=answer_ok)
        if not (state_ok and answer_ok):
            return VerifyResult(0.0, False, Status.WRONG, details)
        reward = max(0.0, 1.0 - self.config.invalid_call_penalty * env.invalid_calls)
        return VerifyResult(reward, True, Status.OK, details)
