"""Procedural math task families: arithmetic, linear equations, fractions.

Each family has five difficulty levels and is sized for the built-in tiny model (a ~1M-parameter
character-level transformer trained for minutes on a CPU): prompts are bare expressions such as
``12+7=`` (under 40 characters) and the reference completion is a short worked solution ending in
the boxed answer, ``2+7=9,1+0=1,\\boxed{19}`` (``domains/math/work.py`` says why and how; at most
60 characters, within the trainer's default ``max_new_tokens`` of 64 with the end token). Level 1 is single-digit
addition; each level adds digits, operations, negative numbers or terms. The worked solution lives
in ``Task.meta``: it is how the reference solves the problem, not part of the problem, so it does
not enter the task id. Every random draw goes through the ``rng`` passed to
``sample``, so a seed fixes the tasks exactly.

Held-out sets come from ``Domain.heldout``, and the trainer never draws a held-out task for SFT or
GRPO (``curriculum/tasks.py``). At low levels the problem space is small (level 1 of arithmetic has 100
problems), so held-out success there measures whether the model generalises to sums it has never
seen, not recall. With answer-only references a tiny model scored near 1.0 on the training problems
of a level and 0.5 on its held-out ones; the worked solutions are there to close that gap.
"""
from __future__ import annotations

import math
import random
import re
from fractions import Fraction
from typing import Callable, ClassVar

from domains.api import Messages, Task, exchange
from domains.math.answer import BOX_REQUEST, MathAnswerDomain
from domains.math.work import column_add, column_subtract, signed_sum, solution

Problem = tuple[str, str, list[str]]  # (prompt text, gold answer, steps of the worked solution)
Generator = Callable[[random.Random], Problem]


def _term(value: int) -> str:
    """A number as the second or later operand: negatives in parentheses, ``5+(-3)``."""
    return f"({value})" if value < 0 else str(value)


def _fraction_text(value: Fraction) -> str:
    """Gold answers: reduced ``p/q``, or an integer when the denominator is 1."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


FRACTION_REQUEST = "Give it as a fraction in lowest terms (or a whole number)."


class ProceduralMath(MathAnswerDomain):
    """A family of generated problems; subclasses fill ``generators`` (one per level)."""

    levels = (1, 2, 3, 4, 5)
    family = ""

    def generators(self) -> dict[int, Generator]:
        raise NotImplementedError(f"domain {self.name!r} must implement generators() (one per level)")

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        generate = self.generators().get(level)
        if generate is None:
            raise ValueError(f"domain {self.name!r} has no level {level} (levels: {list(self.levels)})")
        return [self._task(level, *generate(rng)) for _ in range(n)]

    def _task(self, level: int, prompt: str, answer: str, steps: list[str]) -> Task:
        prompt = self.prompt(prompt, self.chat_question(prompt), example=self.chat_example)
        return Task(domain=self.name, level=level, prompt=prompt, payload={"answer": answer},
                    meta={"family": self.family, "solution": solution(steps, answer)})

    def chat_question(self, compact: str) -> str:
        """The problem in words, for prompt_style chat (``compact`` ends in ``=``)."""
        return f"What is {compact.rstrip('=')}? {BOX_REQUEST}"

    def hint(self, task: Task) -> str | None:
        """The first step of the worked solution (``first_step_hint``): ``7+8=15`` for ``47+38=``,
        ``x=7-3`` for ``x+3=7``, ``3/6+2/6`` for ``1/2+1/3``; in chat, ``begin with 7+8=15``."""
        question = task.prompt[-1]["content"]
        step = first_step_hint(task.meta.get("solution") or "", str(task.payload["answer"]), question)
        if step is None:
            return None
        return step if self.config.prompt_style != "chat" else f"begin with {step}"

    # One worked exchange before a chat question: SmolLM2-135M-Instruct boxed none of 24 arithmetic
    # answers asked in words alone and all of them after this (docs/experiments.md).
    chat_example: ClassVar[Messages] = exchange(f"What is 2+3? {BOX_REQUEST}",
                                                "2 + 3 = 5. The final answer is \\boxed{5}.")


# -- hints --------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"\(?(-?\d+)\)?(?:/\(?(-?\d+)\)?)?")


def literal_value(text: str) -> Fraction | None:
    """The value of a number written as a step writes one (``12``, ``-3``, ``(-3)``, ``56/(-8)``);
    None for anything else (an expression, ``x``, a zero denominator)."""
    match = _NUMBER.fullmatch(text.strip())
    if match is None or match.group(2) in ("0", "-0"):
        return None
    return Fraction(int(match.group(1)), int(match.group(2) or 1))


def first_step_hint(solution_text: str, answer: str, question: str) -> str | None:
    """The hint of a worked solution (``domains.math.work.solution``): its first step, less a final
    value equal to the answer (``x=40-(-3)=43`` → ``x=40-(-3)``; a one-step ``1/2+1/3`` ends
    ``=5/6`` and becomes ``3/6+2/6``, the terms over their common denominator). None when what is
    left the question already shows (``3+4`` of ``3+4=``, ``x`` of ``8x=56``): those one-step
    problems have nothing between question and answer to give. The answer is never in a hint: no
    side of its equation is a number equal to it."""
    steps = [s for s in solution_text.split(",") if s and not s.startswith("\\boxed")]
    if not steps:
        return None
    sides = steps[0].split("=")
    gold = literal_value(answer)
    if len(sides) > 1 and gold is not None and literal_value(sides[-1]) == gold:
        sides = sides[:-1]
    if gold is not None and any(literal_value(side) == gold for side in sides):
        return None  # e.g. x=0 reached in the middle of a step: nothing left to hint
    hint = "=".join(sides)
    if len(sides) == 1 and hint in question:
        return None
    return hint


# -- arithmetic -------------------------------------------------------------------------------------
def _add_single(rng: random.Random) -> Problem:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"{a}+{b}=", str(a + b), column_add(a, b)


def _add_sub_two_digit(rng: random.Random) -> Problem:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    if rng.random() < 0.5:
        return f"{a}+{b}=", str(a + b), column_add(a, b)
    a, b = max(a, b), min(a, b)  # level 2 keeps differences non-negative
    return f"{a}-{b}=", str(a - b), column_subtract(a, b)


def _mul_or_negative(rng: random.Random) -> Problem:
    if rng.random() < 0.5:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"{a}*{b}=", str(a * b), [f"{a}*{b}={a * b}"]  # times tables are recalled, not worked
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    steps = column_subtract(a, b) if a >= b else signed_sum(a, -b)  # signed_sum(70, -0) would add
    return f"{a}-{b}=", str(a - b), steps  # may be negative


def _step(left: int, op: str, right: int) -> tuple[str, int]:
    """One operation of a longer expression, as a step: ``6*(-18)=-108``, and its value."""
    value = {"+": left + right, "-": left - right, "*": left * right}[op]
    return f"{left}{op}{_term(right)}={value}", value


def _three_terms(rng: random.Random) -> Problem:
    a, b, c = (rng.randint(-20, 20) for _ in range(3))
    if rng.random() < 0.5:
        product, p = _step(b, "*", c)
        total, value = _step(a, "+", p)
        return f"{a}+{_term(b)}*{_term(c)}=", str(value), [product, total]
    product, p = _step(a, "*", b)
    total, value = _step(p, "-", c)
    return f"{a}*{_term(b)}-{_term(c)}=", str(value), [product, total]


def _parenthesised(rng: random.Random) -> Problem:
    a, b, c, d = rng.randint(-50, 50), rng.randint(-50, 50), rng.randint(2, 19), rng.randint(-99, 99)
    first, s = _step(a, "+", b)
    second, p = _step(s, "*", c)
    third, value = _step(p, "-", d)
    return f"({a}+{_term(b)})*{c}-{_term(d)}=", str(value), [first, second, third]


class Arithmetic(ProceduralMath):
    name = "arithmetic"
    family = "arithmetic"

    def generators(self) -> dict[int, Generator]:
        return {1: _add_single, 2: _add_sub_two_digit, 3: _mul_or_negative, 4: _three_terms, 5: _parenthesised}


# -- linear equations -------------------------------------------------------------------------------
def _linear(a: int, b: int) -> str:
    """``a*x + b`` written the way a person would: ``3x-5``, ``-x+2``, ``x``."""
    coefficient = {1: "", -1: "-"}.get(a, str(a))
    if b == 0:
        return f"{coefficient}x"
    return f"{coefficient}x{'+' if b > 0 else '-'}{abs(b)}"


def _equation(left: str, right: int | str) -> str:
    return f"{left}={right}, x="


def _isolate(b: int, c: int) -> list[str]:
    """Steps from ``x+b=c`` to x: move b across, then work out ``c-b``."""
    return [f"x={c}{'-' if b > 0 else '+'}{abs(b)}", *signed_sum(c, -b)]


def _x_plus_b(rng: random.Random) -> Problem:
    x, b = rng.randint(0, 9), rng.randint(1, 9)
    return _equation(_linear(1, b), x + b), str(x), _isolate(b, x + b)


def _x_minus_or_plus(rng: random.Random) -> Problem:
    x, b = rng.randint(0, 20), rng.randint(1, 20)
    b = b if rng.random() < 0.5 else -b
    return _equation(_linear(1, b), x + b), str(x), _isolate(b, x + b)


def _divide(a: int, c: int) -> list[str]:
    """The last step of ``ax=c``: ``x=-56/8``; none when ``a`` is 1 and x is already known."""
    return [] if a == 1 else [f"x={c}/{_term(a)}"]


def _move_and_divide(a: int, b: int, right: int) -> list[str]:
    """Steps of ``ax+b=right``: move b across, ``3x=17-5=12``, then divide."""
    return [f"{_linear(a, 0)}={right}-{_term(b)}={right - b}", *_divide(a, right - b)]


def _ax_equals_c(rng: random.Random) -> Problem:
    a, x = rng.randint(2, 9), rng.randint(-9, 9)
    return _equation(_linear(a, 0), a * x), str(x), _divide(a, a * x)


def _ax_plus_b(rng: random.Random) -> Problem:
    a, b, x = rng.choice([-1, 1]) * rng.randint(2, 9), rng.randint(-20, 20), rng.randint(-20, 20)
    return _equation(_linear(a, b), a * x + b), str(x), _move_and_divide(a, b, a * x + b)


def _both_sides(rng: random.Random) -> Problem:
    a = rng.choice([-1, 1]) * rng.randint(2, 19)
    c = rng.choice([k for k in range(-12, 13) if k not in (0, a)])
    x, b = rng.randint(-30, 30), rng.randint(-99, 99)
    d = (a - c) * x + b  # so that a*x + b = c*x + d holds exactly
    return _equation(_linear(a, b), _linear(c, d)), str(x), _move_and_divide(a - c, b, d)


class LinearEquations(ProceduralMath):
    name = "linear_equations"
    family = "linear_equations"

    def chat_question(self, compact: str) -> str:
        equation = compact.removesuffix(", x=")
        return f"Solve {equation} for x. {BOX_REQUEST}"

    chat_example = exchange(f"Solve 2x+1=7 for x. {BOX_REQUEST}",
                            "2x = 7 - 1 = 6, so x = 6 / 2 = 3. The final answer is \\boxed{3}.")

    def generators(self) -> dict[int, Generator]:
        return {1: _x_plus_b, 2: _x_minus_or_plus, 3: _ax_equals_c, 4: _ax_plus_b, 5: _both_sides}


# -- fractions ----------------------------------------------------------------------------------------
def _proper(rng: random.Random, max_den: int) -> Fraction:
    den = rng.randint(2, max_den)
    return Fraction(rng.randint(1, den - 1), den)


def _raw(f: Fraction) -> str:
    return f"{f.numerator}/{f.denominator}"


def _over_common(terms: list[Fraction], signs: str) -> list[str]:
    """The steps (just one): every term over the least common denominator, and their sum,
    ``3/6+2/6=5/6``; the box then holds the sum in lowest terms."""
    den = math.lcm(*(t.denominator for t in terms))
    numerators = [t.numerator * den // t.denominator for t in terms]
    total = numerators[0] + sum(n if s == "+" else -n for s, n in zip(signs, numerators[1:]))
    written = f"{numerators[0]}/{den}" + "".join(f"{s}{n}/{den}" for s, n in zip(signs, numerators[1:]))
    return [f"{written}={total}/{den}"]


def _same_denominator(rng: random.Random) -> Problem:
    den = rng.randint(2, 9)
    a, b = rng.randint(1, den - 1), rng.randint(1, den - 1)
    return f"{a}/{den}+{b}/{den}=", _fraction_text(Fraction(a + b, den)), [f"{a}/{den}+{b}/{den}={a + b}/{den}"]


def _small_sum(rng: random.Random) -> Problem:
    p, q = _proper(rng, 6), _proper(rng, 6)
    return f"{_raw(p)}+{_raw(q)}=", _fraction_text(p + q), _over_common([p, q], "+")


def _sum_or_difference(rng: random.Random) -> Problem:
    p, q = _proper(rng, 10), _proper(rng, 10)
    op = "+" if rng.random() < 0.5 else "-"
    return f"{_raw(p)}{op}{_raw(q)}=", _fraction_text(p + q if op == "+" else p - q), _over_common([p, q], op)


def _product_or_quotient(rng: random.Random) -> Problem:
    p, q = _proper(rng, 12), _proper(rng, 12)
    if rng.random() < 0.5:
        product = f"{_raw(p)}*{_raw(q)}={p.numerator * q.numerator}/{p.denominator * q.denominator}"
        return f"{_raw(p)}*{_raw(q)}=", _fraction_text(p * q), [product]
    flipped = f"{_raw(p)}*{q.denominator}/{q.numerator}={p.numerator * q.denominator}/{p.denominator * q.numerator}"
    return f"({_raw(p)})/({_raw(q)})=", _fraction_text(p / q), [flipped]


def _three_fractions(rng: random.Random) -> Problem:
    p, q, r = _proper(rng, 12), _proper(rng, 12), _proper(rng, 12)
    s1, s2 = rng.choice("+-"), rng.choice("+-")
    value = p + (q if s1 == "+" else -q) + (r if s2 == "+" else -r)
    return f"{_raw(p)}{s1}{_raw(q)}{s2}{_raw(r)}=", _fraction_text(value), _over_common([p, q, r], s1 + s2)


class Fractions(ProceduralMath):
    name = "fractions"
    family = "fractions"

    def chat_question(self, compact: str) -> str:
        return f"What is {compact.rstrip('=')}? {FRACTION_REQUEST} {BOX_REQUEST}"

    chat_example = exchange(f"What is 1/2+1/4? {FRACTION_REQUEST} {BOX_REQUEST}",
                            "1/2 + 1/4 = 2/4 + 1/4 = 3/4. The final answer is \\boxed{3/4}.")

    def generators(self) -> dict[int, Generator]:
        return {1: _same_denominator, 2: _small_sum, 3: _sum_or_difference,
                4: _product_or_quotient, 5: _three_fractions}


ARITHMETIC = Arithmetic()
LINEAR_EQUATIONS = LinearEquations()
FRACTIONS = Fractions()
