"""Reading tool calls out of assistant text: Hermes/Qwen ``<tool_call>{...}</tool_call>`` blocks.

Parsing is deliberately strict, because a reward that accepts sloppy calls teaches sloppy calls:

- the JSON between the tags must parse on its own (no trailing text, no NaN/Infinity), with no
  duplicate keys at any depth (``json`` would silently keep the last one);
- a call is exactly ``{"name": <str>, "arguments": <object>}``;
- an unclosed tag (a truncated generation) or a ``<tool_call>`` inside another is malformed;
- sizes are bounded before anything is parsed: a call body longer than ``MAX_CALL_CHARS``, an
  integer with more than ``MAX_INT_DIGITS`` digits, or nesting deeper than ``MAX_DEPTH`` is
  malformed, so a hostile completion costs linear time and never reaches a tool.

Text outside the tags is ignored here; the environment decides what a turn without calls means.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALL_CHARS = 4096  # a real call in these domains is under 200 characters
MAX_INT_DIGITS = 30  # bigger integers are never a sensible argument; bounds int() work
MAX_DEPTH = 16


class CallFormatError(ValueError):
    """The assistant text holds a tool call that cannot be read."""


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedTurn:
    """The calls in one assistant turn, in order, and the text outside them."""

    calls: list[Call] = field(default_factory=list)
    text: str = ""  # the turn with every call block removed (where a final answer lives)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise CallFormatError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise CallFormatError(f"integer with more than {MAX_INT_DIGITS} digits")
    return int(text)


def _reject_constant(name: str) -> Any:
    raise CallFormatError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 is valid JSON syntax but overflows to inf
        raise CallFormatError(f"number {text[:40]} is out of range")
    return value


def _depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth, stopping early once past ``limit`` (json's own recursion limit is ~1000)."""
    if limit < 0:
        return 1
    if isinstance(value, dict):
        return 1 + max((_depth(v, limit - 1) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v, limit - 1) for v in value), default=0)
    return 0


def loads_strict(text: str, max_chars: int = MAX_CALL_CHARS) -> Any:
    """``json.loads`` that rejects duplicate keys, NaN/Infinity, huge integers and deep nesting."""
    if len(text) > max_chars:
        raise CallFormatError(f"JSON longer than {max_chars} characters")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_bounded_int,
                           parse_float=_finite_float, parse_constant=_reject_constant)
    except CallFormatError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise CallFormatError(f"invalid JSON: {str(exc)[:120]}") from None
    if _depth(value) > MAX_DEPTH:
        raise CallFormatError(f"JSON nested deeper than {MAX_DEPTH}")
    return value


def call_from_json(value: Any) -> Call:
    """A parsed JSON value as a Call: exactly the keys ``name`` (string) and ``arguments`` (object)."""
    if not isinstance(value, dict):
        raise CallFormatError("a tool call must be a JSON object")
    if set(value) != {"name", "arguments"}:
        raise CallFormatError('a tool call has exactly the keys "name" and "arguments"')
    name, arguments = value["name"], value["arguments"]
    if not isinstance(name, str) or not name:
        raise CallFormatError('"name" must be a non-empty string')
    if not isinstance(arguments, dict):
        raise CallFormatError('"arguments" must be a JSON object')
    return Call(name, arguments)


def _call_blocks(text: str) -> tuple[list[str], str]:
    """The bodies between ``<tool_call>`` and ``</tool_call>``, and the text outside them."""
    bodies, outside, pos = [], [], 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            break
        end = text.find(CLOSE, start)
        if end < 0:
            raise CallFormatError("<tool_call> is never closed")
        body = text[start + len(OPEN):end]
        if OPEN in body:
            raise CallFormatError("<tool_call> inside <tool_call>")
        outside.append(text[pos:start])
        bodies.append(body)
        pos = end + len(CLOSE)
    rest = text[pos:]
    if CLOSE in rest:  # a closing tag with no opening one: the call was mangled, not omitted
        raise CallFormatError("</tool_call> without <tool_call>")
    outside.append(rest)
    return bodies, "".join(outside)


def parse_turn(text: str, max_calls: int = 8, max_call_chars: int = MAX_CALL_CHARS) -> ParsedTurn:
    """All calls in one assistant turn; raises CallFormatError if any of them cannot be read."""
    bodies, outside = _call_blocks(text)
    if len(bodies) > max_calls:
        raise CallFormatError(f"more than {max_calls} tool calls in one turn")
    return ParsedTurn([call_from_json(loads_strict(body.strip(), max_call_chars)) for body in bodies], outside)


def tools_message(tools: list[dict[str, Any]]) -> str:
    """A system message that offers ``tools`` (OpenAI-style schemas) in the Hermes format, which
    Qwen's and Hermes' chat templates write themselves: for a model whose template takes no tools."""
    listed = "\n".join(json.dumps({"type": "function", "function": t}, ensure_ascii=False) for t in tools)
    return ("You may call functions to help with the task. Their signatures are within <tools></tools> XML "
            f"tags:\n<tools>\n{listed}\n</tools>\nFor each call, reply with a JSON object holding the "
            f"function's name and arguments within {OPEN}{CLOSE} XML tags:\n"
            f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}')


def offer_tools(messages: list[dict[str, Any]], template_takes_tools: bool) -> tuple[list[dict[str, Any]], list | None]:
    """A prompt's messages as a chat template renders them, and the tool schemas to give the
    template's ``tools=`` argument: a template that takes tools gets the schemas carried by the
    system message (which goes away if it says nothing else); for any other template, and for
    readers that render no template, the schemas are written into that message in the Hermes
    format, after the run's system prompt."""
    offered = next((m for m in messages if "tools" in m), None)
    if offered is None:
        return messages, None
    tools, own = offered["tools"], offered["content"]
    if template_takes_tools:
        rest = [] if not own else [{"role": offered["role"], "content": own}]
        return [r for m in messages for r in (rest if m is offered else [m])], tools
    content = "\n\n".join(t for t in (own, tools_message(tools)) if t)
    return [{"role": offered["role"], "content": content} if m is offered else m for m in messages], None


def render_call(name: str, /, **arguments: Any) -> str:
    """A call as the reference transcripts write it: compact JSON, short enough for a tiny model. ``name``
    is positional only: a tool may have a parameter called ``name``."""
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"), ensure_ascii=False)
    return f"{OPEN}{body}{CLOSE}"
