"""Worked solutions for the procedural math domains, written the way a small model can learn them.

A reference completion that is only the boxed answer asks the model to recall each sum whole, so it
can only memorise: a 0.8M-parameter model scored 0.94 on level-1 sums it had trained on and 0.5 on
held-out ones, and RL on the trained sums did not transfer. A worked solution breaks each problem
into steps that every other problem also uses: column addition and subtraction reduce any sum to
single-digit facts and a carry, so a held-out ``47+38`` is made of the same steps as the trained
ones, and sharpening those steps with RL helps on problems never trained on.

Steps are comma-separated equations and the answer is boxed at the end, e.g. ``47+38=`` →
``7+8=15,4+3+1=8,\\boxed{85}``. Only the box is graded (``domains.math.answer.grade_answer``); the steps
are the model's own business.

- ``column_add(a, b)``: one step per column, right to left, the shorter number padded with zeros,
  ``+1`` when a column carries.
- ``column_subtract(a, b)`` for ``a >= b``: one step per column; a column that borrows is written
  with its digit plus ten (``12-8=4``) and the next column pays ``-1`` (``5-1-3=1``).
- ``signed_sum(a, b)``: ``a + b`` for signed integers, turned into one column addition or
  subtraction of the magnitudes and a sign (``-13+15`` → ``15-13``).
"""
from __future__ import annotations


def _digits(n: int, width: int) -> list[int]:
    """Digits of ``n`` (non-negative), least significant first, padded with zeros to ``width``."""
    return [int(c) for c in reversed(str(n).zfill(width))]


def _width(*numbers: int) -> int:
    return max(len(str(n)) for n in numbers)


def column_add(a: int, b: int) -> list[str]:
    """Steps of ``a + b`` for non-negative integers, one column at a time."""
    width = _width(a, b)
    steps, carry = [], 0
    for x, y in zip(_digits(a, width), _digits(b, width)):
        total = x + y + carry
        steps.append(f"{x}+{y}{'+1' if carry else ''}={total}")
        carry = total // 10
    return steps


def column_subtract(a: int, b: int) -> list[str]:
    """Steps of ``a - b`` for ``a >= b >= 0``, one column at a time, borrowing from the next."""
    if not 0 <= b <= a:
        raise ValueError(f"column_subtract needs a >= b >= 0, got {a} and {b}")
    width = _width(a, b)
    steps, borrow = [], 0
    for x, y in zip(_digits(a, width), _digits(b, width)):
        left, value = f"{x}{'-1' if borrow else ''}", x - borrow - y
        borrow = int(value < 0)
        if borrow:  # "15-1-8=6": the digit plus ten, still true arithmetic as written
            left, value = f"1{left}", value + 10
        steps.append(f"{left}-{y}={value}")
    return steps


def signed_sum(a: int, b: int) -> list[str]:
    """Steps of ``a + b`` for signed integers: one column operation on the magnitudes, after a
    step that rewrites the sum when it is not already written that way (``-13+15`` → ``15-13``)."""
    if a >= 0 and b >= 0:
        return column_add(a, b)
    if a < 0 and b < 0:
        return [f"-({-a}+{-b})", *column_add(-a, -b)]
    big, small = max(abs(a), abs(b)), min(abs(a), abs(b))
    if a >= 0 and a + b >= 0:  # a-|b| as written
        return column_subtract(big, small)
    return [f"-({big}-{small})" if a + b < 0 else f"{big}-{small}", *column_subtract(big, small)]


def solution(steps: list[str], answer: str) -> str:
    """The reference completion: the steps, then the boxed answer."""
    return "".join(f"{step}," for step in steps) + f"\\boxed{{{answer}}}"
