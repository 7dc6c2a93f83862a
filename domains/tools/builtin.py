"""Three procedural tool domains sized for the built-in tiny model.

- ``tool_calculator``: arithmetic on 3- to 6-digit numbers, which a small model cannot do in its
  head, through ``add``/``sub``/``mul``; one call at levels 1-2, chains of 2-3 calls that feed one
  result into the next call at levels 3-5. The answer is ``\\boxed{n}``.
- ``tool_kv_store``: bring a small key-value store to a target state with ``set``/``del``, one
  write per turn. At levels 1-3 the prompt shows the store; at 4-5 it is hidden and must be read
  with ``dump`` (level 5 takes five turns, the domain's default ``max_turns``). The state
  counts writes per key, so any write the reference does not make (even re-setting a value that is
  already right) fails. The final turn is free text (the reference says ``done``).
- ``tool_lookup``: follow a chain through a hidden staff table with ``get(n)``, e.g.
  ``ann.mgr.city=``: one lookup at levels 1-2, up to four at level 5 (whose default ``max_turns``
  is therefore 5). The answer is ``\\boxed{name}``.

Prompts list the tools as bare signatures (``add,sub,mul(a,b)``) rather than JSON schemas: a
character-level model with a few hundred characters of context learns the call shape from the SFT
reference transcripts, and the full schemas stay available from ``ToolEnvironment.tools()`` for
models with a chat template. A chat prompt opens with one solved exchange (a question, the call, the
tool's answer, the final answer) on values no task can have: SmolLM2-135M-Instruct made no call at
all until it saw one (docs/experiments.md). Every random draw goes through the ``rng`` passed to
``sample``.
"""
from __future__ import annotations

import json
import random
from functools import cached_property
from typing import Any, ClassVar

from pydantic import Field

from domains.api import DomainConfig, Messages, Task, user_prompt
from domains.tools.calls import OPEN, render_call
from domains.tools.environment import ToolConfig, ToolDomain, ToolEnvironment, ToolError, tool

LIMIT = 10**12  # argument bound: keeps every result exact and every call cheap
INT = {"type": "integer", "minimum": -LIMIT, "maximum": LIMIT}


def _task(domain: ToolDomain, level: int, compact: str, chat: str, payload: dict[str, Any],
          env: type[ToolEnvironment]) -> Task:
    """A task whose chat-style prompt offers ``env``'s tools after the domain's solved exchange."""
    prompt = domain.prompt(compact, chat, tools=env.tools(), example=domain.chat_example)
    return Task(domain=domain.name, level=level, prompt=prompt, payload=payload, meta={"family": domain.name})


class ProceduralToolDomain(ToolDomain):
    """Shared level check and worked example; subclasses implement ``_draw(level, rng) -> Task``
    and set ``example``."""

    levels = (1, 2, 3, 4, 5)
    example: ClassVar[tuple[str, dict[str, Any]]]  # (chat question, payload) of a task outside the task space

    @cached_property
    def chat_example(self) -> Messages:
        """``example`` solved by its reference turns against a real environment, so the tool's
        answers in it read exactly as they will in an episode; played once, not for every task drawn."""
        question, payload = self.example
        solved = Task(domain=self.name, level=1, prompt=user_prompt(question), payload=payload)
        return [*solved.prompt, *json.loads(self.reference(solved))]

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        if level not in self.levels:
            raise ValueError(f"domain {self.name!r} has no level {level} (levels: {list(self.levels)})")
        return [self._draw(level, rng) for _ in range(n)]

    def _draw(self, level: int, rng: random.Random) -> Task:
        raise NotImplementedError(f"domain {self.name!r} must implement _draw()")

    def lead(self, task: Task) -> str | None:
        """The first call of the reference transcript, written exactly as the reference (and the
        chat prompt's solved example) writes calls; the tool's answer, and so the final answer,
        the model still has to get by making it. None for a task solved without a call."""
        first = next(iter(task.payload.get("reference_turns", [])), "")
        return first if first.startswith(OPEN) else None

    def hint(self, task: Task) -> str | None:
        """The lead (the first call) in words after the question."""
        first = self.lead(task)
        if first is None:
            return None
        return first if self.config.prompt_style != "chat" else f"make this call first: {first}"


# -- calculator ------------------------------------------------------------------------------------
class CalculatorEnv(ToolEnvironment):
    """Stateless: the answer is all that is graded."""

    @tool("add", "a+b", a=INT, b=INT)
    def add(self, a: int, b: int) -> int:
        return int(a) + int(b)

    @tool("sub", "a-b", a=INT, b=INT)
    def sub(self, a: int, b: int) -> int:
        return int(a) - int(b)

    @tool("mul", "a*b", a=INT, b=INT)
    def mul(self, a: int, b: int) -> int:
        return int(a) * int(b)

    def state(self) -> dict[str, Any]:
        return {}


OPS = {"add": ("+", lambda a, b: a + b), "sub": ("-", lambda a, b: a - b), "mul": ("*", lambda a, b: a * b)}


def _digits(rng: random.Random, n: int) -> int:
    return rng.randint(10 ** (n - 1), 10**n - 1)


def _chain(steps: list[tuple[str, int | None, int]]) -> tuple[list[str], int]:
    """Reference turns for a chain ``(op, a, b)``; ``a=None`` means "the previous result"."""
    turns, value = [], 0
    for op, a, b in steps:
        a = value if a is None else a
        turns.append(render_call(op, a=a, b=b))
        value = OPS[op][1](a, b)
    return turns + [f"\\boxed{{{value}}}"], value


def _compute(expression: str) -> str:
    return (f"Compute {expression} with the tools, one call at a time (they are exact where mental "
            "arithmetic is not), then give the result in \\boxed{}.")


def _chain_payload(steps: list[tuple[str, int | None, int]]) -> dict[str, Any]:
    turns, value = _chain(steps)
    return {"reference_turns": turns, "answer": str(value)}


class Calculator(ProceduralToolDomain):
    name = "tool_calculator"
    tools_line = "add,sub,mul(a,b)"
    example = (_compute("12*34"), _chain_payload([("mul", 12, 34)]))  # tasks use 3 digits or more

    def environment(self, task: Task) -> ToolEnvironment:
        return CalculatorEnv()

    def _draw(self, level: int, rng: random.Random) -> Task:
        expression, steps = getattr(self, f"_level{level}")(rng)
        return _task(self, level, f"{self.tools_line}\n{expression}=", _compute(expression),
                     _chain_payload(steps), CalculatorEnv)

    def _level1(self, rng: random.Random) -> tuple[str, list]:
        a, b = _digits(rng, 3), _digits(rng, 3)
        return f"{a}*{b}", [("mul", a, b)]

    def _level2(self, rng: random.Random) -> tuple[str, list]:
        op = rng.choice(["add", "sub", "mul"])
        a, b = (_digits(rng, 4), _digits(rng, 3)) if op == "mul" else (_digits(rng, 6), _digits(rng, 6))
        return f"{a}{OPS[op][0]}{b}", [(op, a, b)]

    def _level3(self, rng: random.Random) -> tuple[str, list]:
        a, b, c = _digits(rng, 3), _digits(rng, 3), _digits(rng, 4)
        op = rng.choice(["add", "sub"])
        return f"{a}*{b}{OPS[op][0]}{c}", [("mul", a, b), (op, None, c)]

    def _level4(self, rng: random.Random) -> tuple[str, list]:
        a, b, c = _digits(rng, 4), _digits(rng, 4), _digits(rng, 3)
        op = rng.choice(["add", "sub"])
        return f"({a}{OPS[op][0]}{b})*{c}", [(op, a, b), ("mul", None, c)]

    def _level5(self, rng: random.Random) -> tuple[str, list]:
        a, b, c, d = _digits(rng, 3), _digits(rng, 3), _digits(rng, 4), _digits(rng, 2)
        op = rng.choice(["add", "sub"])
        return f"({a}*{b}{OPS[op][0]}{c})*{d}", [("mul", a, b), (op, None, c), ("mul", None, d)]


# -- key-value store -------------------------------------------------------------------------------
KEY = {"type": "string", "pattern": "^[a-z]$"}
VALUE = {"type": "integer", "minimum": 0, "maximum": 9}  # one digit keeps prompts short
KEYS = "abcdefgh"


class KVStoreEnv(ToolEnvironment):
    def __init__(self, data: dict[str, int]) -> None:
        super().__init__()
        self.data = dict(data)
        self.writes: dict[str, int] = {}

    def _wrote(self, key: str) -> None:
        self.writes[key] = self.writes.get(key, 0) + 1

    @tool("set", "store v under k", k=KEY, v=VALUE)
    def set_value(self, k: str, v: int) -> str:
        self.data[k] = int(v)
        self._wrote(k)
        return "ok"

    @tool("del", "delete k", k=KEY)
    def delete(self, k: str) -> str:
        if k not in self.data:
            raise ToolError(f"no key {k}")
        del self.data[k]
        self._wrote(k)
        return "ok"

    @tool("dump", "the whole store")
    def dump(self) -> dict[str, int]:
        return dict(sorted(self.data.items()))

    def state(self) -> dict[str, Any]:
        return {"data": dict(sorted(self.data.items())), "writes": dict(sorted(self.writes.items()))}


def _show(data: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(data.items())) or "-"


def _edit(rng: random.Random, data: dict[str, int], changes: int) -> dict[str, int]:
    """A target ``changes`` edits away from ``data``: new keys, new values, deletions."""
    target = dict(data)
    for key in rng.sample([k for k in KEYS], changes):
        if key in target and rng.random() < 0.5:
            del target[key]
        else:
            target[key] = rng.choice([v for v in range(10) if v != target.get(key)])
    return target


def _writes(have: dict[str, int], want: dict[str, int]) -> list[str]:
    """The calls that turn ``have`` into ``want``, in key order, one per turn: the trainer's
    rollout ends a turn at the first complete call, so references never batch calls."""
    calls = []
    for key in sorted(set(have) | set(want)):
        if key not in want:
            calls.append(render_call("del", k=key))
        elif have.get(key) != want[key]:
            calls.append(render_call("set", k=key, v=want[key]))
    return calls


def _make_hold(have: dict[str, int], want: dict[str, int], shown: bool) -> str:
    holds = ("is empty" if not have else f"holds {_show(have)}") if shown else \
        "holds keys you cannot see (dump() lists them)"
    return f"A key-value store {holds}. With the tools, make it hold exactly {_show(want)}, then reply done."


def _store_payload(have: dict[str, int], want: dict[str, int], shown: bool) -> dict[str, Any]:
    turns = ([] if shown else [render_call("dump")]) + _writes(have, want) + ["done"]
    return {"store": have, "reference_turns": turns}


class KVConfig(ToolConfig):
    max_turns: int = Field(default=5, ge=1, le=64)  # level 5: dump, three writes, done


class KVStore(ProceduralToolDomain):
    name = "tool_kv_store"
    Config: ClassVar[type[DomainConfig]] = KVConfig
    tools_line = "set(k,v),del(k),dump()"
    example = (_make_hold({"x": 1}, {"x": 1, "y": 2}, True),  # tasks' keys are a-h
               _store_payload({"x": 1}, {"x": 1, "y": 2}, True))
    # (keys in the store, edits to make, store shown in the prompt) per level
    shapes: ClassVar[dict[int, tuple[tuple[int, int], int, bool]]] = {
        1: ((0, 2), 1, True), 2: ((2, 3), 1, True), 3: ((3, 4), 2, True),
        4: ((3, 4), 2, False), 5: ((4, 5), 3, False),  # turns: 2, 2, 3, 4, 5
    }

    def environment(self, task: Task) -> ToolEnvironment:
        return KVStoreEnv(task.payload["store"])

    def _draw(self, level: int, rng: random.Random) -> Task:
        (low, high), changes, shown = self.shapes[level]
        have = {k: rng.randint(0, 9) for k in rng.sample(KEYS, rng.randint(low, high))}
        if level == 1:  # one new key: the gentlest start
            key = rng.choice([k for k in KEYS if k not in have])
            want = {**have, key: rng.randint(0, 9)}
        else:
            want = _edit(rng, have, changes)
        prompt = f"{self.tools_line}\nhave {_show(have) if shown else '?'}\nwant {_show(want)}"
        return _task(self, level, prompt, _make_hold(have, want, shown), _store_payload(have, want, shown),
                     KVStoreEnv)


# -- lookup chains ---------------------------------------------------------------------------------
NAME = {"type": "string", "pattern": "^[a-z]{1,8}$"}
CITIES = ("oslo", "rome", "lima", "kyiv", "baku", "doha", "riga", "nice", "bern", "pune", "cork", "fez")
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"


class LookupEnv(ToolEnvironment):
    """Read-only: the state is the table itself, so only the answer can be wrong."""

    def __init__(self, table: dict[str, dict[str, str]]) -> None:
        super().__init__()
        self.table = table

    @tool("get", "the record of person n", n=NAME)
    def get(self, n: str) -> dict[str, str]:
        if n not in self.table:
            raise ToolError(f"no person {n}")
        return dict(self.table[n])

    def state(self) -> dict[str, Any]:
        return {"table": self.table}


class LookupConfig(ToolConfig):
    max_turns: int = Field(default=5, ge=1, le=64)  # level 5 needs four lookups and an answer


def _names(rng: random.Random, n: int) -> list[str]:
    names: set[str] = set()
    while len(names) < n:
        names.add(rng.choice(CONSONANTS) + rng.choice(VOWELS) + rng.choice(CONSONANTS))
    return sorted(names)


def _follow(start: str, hops: int, field: str) -> str:
    wanted = "their manager" if field == "mgr" else "their city"
    chain = f"follow the manager (mgr) {hops} time{'s' * (hops != 1)}, then give " if hops else "give "
    return (f"get(n) looks up person n in a table of people, each with a manager (mgr) and a city. Start "
            f"from {start}: {chain}{wanted} in \\boxed{{}}.")


def _table_payload(table: dict[str, dict[str, str]], start: str, hops: int, field: str) -> dict[str, Any]:
    turns, person = [], start
    for _ in range(hops):
        turns.append(render_call("get", n=person))
        person = table[person]["mgr"]
    turns.append(render_call("get", n=person))
    answer = table[person][field]
    return {"table": table, "reference_turns": turns + [f"\\boxed{{{answer}}}"], "answer": answer}


class Lookup(ProceduralToolDomain):
    name = "tool_lookup"
    Config: ClassVar[type[DomainConfig]] = LookupConfig
    tools_line = "get(n)"
    example = (_follow("anna", 0, "city"),  # tasks' names have three letters
               _table_payload({"anna": {"mgr": "otto", "city": "oslo"}, "otto": {"mgr": "anna", "city": "rome"}},
                              "anna", 0, "city"))
    # (people in the table, hops through "mgr" before the last field, last field) per level
    shapes: ClassVar[dict[int, tuple[int, int, str]]] = {
        1: (3, 0, "city"), 2: (3, 0, "mgr"), 3: (4, 1, "city"), 4: (5, 2, "city"), 5: (6, 3, "city"),
    }

    def environment(self, task: Task) -> ToolEnvironment:
        return LookupEnv(task.payload["table"])

    def _draw(self, level: int, rng: random.Random) -> Task:
        size, hops, field = self.shapes[level]
        people = _names(rng, size)
        # everyone's manager is someone else, so a chain never stalls on a self-loop
        table = {p: {"mgr": rng.choice([q for q in people if q != p]), "city": rng.choice(CITIES)} for p in people}
        start = rng.choice(people)
        path = ".".join([start] + ["mgr"] * hops + [field])
        return _task(self, level, f"{self.tools_line}\n{path}=", _follow(start, hops, field),
                     _table_payload(table, start, hops, field), LookupEnv)


TOOL_CALCULATOR = Calculator()
TOOL_KV_STORE = KVStore()
TOOL_LOOKUP = Lookup()
