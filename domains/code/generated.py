"""Procedural code domains small enough for the built-in tiny model to learn.

Two families, five levels each. A task is a one-line spec such as ``def f(x): return x plus 3``
(under 60 characters) whose reference completion is ``def f(x):\\n return x+3`` (about 40 characters
at most); hidden function-call tests sit in the payload and run through the sandbox like any other
code task. Levels grow from one operator to a conditional or an aggregate over a filtered list.

For hidden, rotated tests (``domains.code.hidden``) a task can carry a larger pool (``tests``) of
which ``hidden_tests.score`` score at once, and its prompt can show a few worked calls
(``examples``) drawn apart from that pool, so that no test the model was shown ever scores.

* ``code_functions`` — integer functions ``f(x)``.
* ``code_lists`` — functions ``f(a)`` of a short list of integers.

Every template is a pair (spec words, Python expression) with ``{k}`` (and ``{m}``) for constants.
Expected outputs come from evaluating that same expression here, on our own trusted template text, so
a reference solution and its tests can never disagree. Six tests per task, chosen to give as many
different answers as the function allows, so that a constant answer cannot pass by luck.

The task space is small (a few hundred distinct prompts per family), so held-out tasks share
prompts with training tasks and differ only in their hidden test arguments: held-out success
measures mastery of the family, not generalisation to unseen specs.
"""
from __future__ import annotations

import io
import random
import tokenize
from typing import Any, Literal

from pydantic import Field

from domains.api import Task
from domains.code.verifier import CodeConfig, CodeDomain

Template = tuple[str, str]  # (words after "return", Python expression)

INT_TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: (("x plus {k}", "x+{k}"), ("x minus {k}", "x-{k}"), ("{k} minus x", "{k}-x")),
    2: (("x times {k}", "x*{k}"), ("x mod {k}", "x%{k}"), ("x div {k}", "x//{k}"), ("x squared", "x*x")),
    3: (("x times {k} plus {m}", "x*{k}+{m}"), ("x plus {k} times {m}", "(x+{k})*{m}"),
        ("x squared plus {k}", "x*x+{k}")),
    4: (("max of x and {k}", "max(x,{k})"), ("abs of x minus {k}", "abs(x-{k})"),
        ("x is above {k}", "x>{k}"), ("x is even", "x%2==0")),
    5: (("sum of 0..x", "sum(range(x+1))"), ("{k} if x is odd else x", "{k} if x%2 else x"),
        ("number of digits of x", "len(str(abs(x)))")),
}

LIST_TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: (("sum of a", "sum(a)"), ("max of a", "max(a)"), ("min of a", "min(a)"), ("len of a", "len(a)")),
    2: (("a reversed", "a[::-1]"), ("a sorted", "sorted(a)"), ("first item of a", "a[0]"),
        ("last item of a", "a[-1]"), ("first {k} items of a", "a[:{k}]")),
    3: (("each item plus {k}", "[x+{k} for x in a]"), ("each item times {k}", "[x*{k} for x in a]"),
        ("count of {k} in a", "a.count({k})")),
    4: (("items of a above {k}", "[x for x in a if x>{k}]"), ("even items of a", "[x for x in a if x%2==0]"),
        ("max minus min of a", "max(a)-min(a)")),
    5: (("sum of squares of a", "sum(x*x for x in a)"), ("count items above {k}", "sum(x>{k} for x in a)"),
        ("a sorted without repeats", "sorted(set(a))")),
}

N_CASES = 6


class CodeGenConfig(CodeConfig):
    # "function": the model writes ``def f(x):\n return x+3`` (references up to ~42 characters).
    # "expression": the model writes only ``x+3`` (up to ~24): the verifier puts ``def f(x):\n
    # return `` in front, HumanEval's prompt-prepending convention. For small generation budgets.
    completion: Literal["function", "expression"] = "function"
    tests: int = Field(N_CASES, ge=2, le=24)  # hidden tests a task carries (its pool)
    examples: int = Field(0, ge=0, le=4)  # calls with their results shown in the prompt, never tests


class _ProceduralCodeDomain(CodeDomain):
    """One family: templates per level, an argument name and an argument generator."""

    Config = CodeGenConfig
    levels = (1, 2, 3, 4, 5)
    arg = "x"
    templates: dict[int, tuple[Template, ...]] = {}

    def random_arg(self, rng: random.Random) -> Any:
        raise NotImplementedError(f"domain {self.name!r} must implement random_arg() (one argument for f)")

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        if level not in self.templates:
            raise ValueError(f"{self.name}: no level {level} (levels: {list(self.levels)})")
        return [self._task(level, rng) for _ in range(n)]

    def _task(self, level: int, rng: random.Random) -> Task:
        while True:  # redraw the rare constant for which every test has the same answer
            words, expr = rng.choice(self.templates[level])
            consts = {"k": rng.randint(2, 9), "m": rng.randint(1, 9)}
            words, expr = words.format(**consts), expr.format(**consts)
            fn = eval(f"lambda {self.arg}: {expr}")  # our own template text, never model output
            args = self._telling_args(fn, rng)
            cases = [{"args": [a], "expected": fn(a)} for a in args[: self.config.tests]]
            if len({repr(c["expected"]) for c in cases}) > 1:
                break
        head = f"def f({self.arg}):\n return "
        payload = {"format": "call", "entry_point": "f", "cases": cases, "reference": head + expr}
        if self.config.completion == "expression":
            payload.update(reference=expr, prompt_code=head)
        shown = [{"args": [a], "expected": fn(a)} for a in args[self.config.tests:]]
        if shown:  # kept with the task for the record; never among the cases that score
            payload["examples"] = shown
        prompt = self.prompt(f"def f({self.arg}): return {words}{_compact_examples(shown)}",
                             self._chat_text(words, _chat_examples(shown)))
        return Task(domain=self.name, level=level, prompt=prompt, payload=payload, meta={"spec": words})

    def hint(self, task: Task) -> str | None:
        """The signature and the head of its one body line: about the first half of the returned
        expression's tokens (``def f(x):\\n return max(x`` for ``max(x,3)``), so the model still
        writes the rest; with ``completion: expression``, the head of the expression alone."""
        expression = task.payload["reference"]
        head = f"def f({self.arg}):\n return "
        expression = expression.removeprefix(head)
        start = expression_head(expression)
        if start is None:
            return None
        if self.config.completion == "expression":
            return start if self.config.prompt_style != "chat" else f"the expression begins `{start}`"
        if self.config.prompt_style != "chat":
            return head + start
        return f"the function begins\n```python\n{head}{start}\n```"

    def _chat_text(self, words: str, examples: str) -> str:
        if self.config.completion == "expression":
            return (f"Complete `def f({self.arg}): return` with an expression that gives {words}.{examples} "
                    "Reply with the expression alone.")
        return (f"Write a Python function `f({self.arg})` that returns {words}.{examples} "
                f"Reply with the function in a ```python code block.")

    def _telling_args(self, fn, rng: random.Random) -> list[Any]:
        """``tests`` distinct arguments, as many distinct answers first as the function gives, so a
        constant (e.g. 0 for "count of 8 in a") cannot pass by luck; then ``examples`` more for the
        prompt. The same 60 draws whatever the counts: the task stream does not depend on them."""
        pool: list[Any] = []
        for _ in range(60):
            arg = self.random_arg(rng)
            if arg not in pool:
                pool.append(arg)
        chosen, answers = [], []
        for arg in pool:  # one argument per new answer
            answer = repr(fn(arg))  # repr: True and 1 are different answers
            if answer not in answers:
                chosen.append(arg)
                answers.append(answer)
        chosen = chosen[: self.config.tests]
        rest = [a for a in pool if a not in chosen]
        return chosen + rest[: self.config.tests + self.config.examples - len(chosen)]


def expression_head(expression: str) -> str | None:
    """The first half (rounded up) of a Python expression's tokens, as written: ``max(x`` of
    ``max(x,3)``, ``x*3`` of ``x*3+5``; None when it has a single token (a head would be all of it)."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(expression).readline)
                  if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT,
                                    tokenize.DEDENT)]
    except (tokenize.TokenError, SyntaxError):
        return None
    if len(tokens) < 2 or any(t.start[0] != 1 for t in tokens):
        return None  # one token, or more than one line
    return expression[:tokens[(len(tokens) + 1) // 2 - 1].end[1]]


def _compact_examples(shown: list[dict[str, Any]]) -> str:
    return "".join(f"; f({c['args'][0]!r})={c['expected']!r}" for c in shown)


def _chat_examples(shown: list[dict[str, Any]]) -> str:
    calls = " and ".join(f"`f({c['args'][0]!r})` returns `{c['expected']!r}`" for c in shown)
    return f" For example, {calls}." if calls else ""  # between the request and the answer format


class IntFunctionsDomain(_ProceduralCodeDomain):
    name = "code_functions"
    arg = "x"
    templates = INT_TEMPLATES

    def random_arg(self, rng: random.Random) -> int:
        return rng.randint(-20, 30)


class ListFunctionsDomain(_ProceduralCodeDomain):
    name = "code_lists"
    arg = "a"
    templates = LIST_TEMPLATES

    def random_arg(self, rng: random.Random) -> list[int]:
        return [rng.randint(-9, 12) for _ in range(rng.randint(1, 6))]


CODE_FUNCTIONS = IntFunctionsDomain()
CODE_LISTS = ListFunctionsDomain()
