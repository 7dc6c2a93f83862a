"""Worked-solution steps: column addition and subtraction, and signed sums built on them."""
from __future__ import annotations

import random

import pytest

from domains.math.work import column_add, column_subtract, signed_sum, solution


def _check(steps: list[str]) -> None:
    for step in steps:
        if "=" in step:
            left, right = step.split("=")
            assert eval(left) == int(right), step  # noqa: S307 - our own digits and operators


def _read_back(steps: list[str]) -> int:
    """The answer digits as a reader takes them from the steps: the last column whole, then the
    units digit of every earlier column, right to left."""
    results = [step.split("=")[1] for step in steps if "=" in step]
    return int(results[-1] + "".join(r[-1] for r in reversed(results[:-1])))


def test_column_addition_worked_by_hand() -> None:
    # 47 + 38: 7+8 = 15 writes 5 and carries 1; 4+3+1 = 8 -> 85
    assert column_add(47, 38) == ["7+8=15", "4+3+1=8"]
    # 99 + 99: both columns carry, the last one's 19 is written whole -> 198
    assert column_add(99, 99) == ["9+9=18", "9+9+1=19"]
    assert column_add(6, 6) == ["6+6=12"]
    assert column_add(7, 11) == ["7+1=8", "0+1=1"]  # the shorter number padded with a zero


def test_column_subtraction_worked_by_hand() -> None:
    # 52 - 38: 2 < 8 borrows: 12-8 = 4; the tens pay it back: 5-1-3 = 1 -> 14
    assert column_subtract(52, 38) == ["12-8=4", "5-1-3=1"]
    # 302 - 158: borrows twice, the middle column 0-1-5 becomes 10-1-5 = 4 -> 144
    assert column_subtract(302, 158) == ["12-8=4", "10-1-5=4", "3-1-1=1"]
    assert column_subtract(13, 7) == ["13-7=6", "1-1-0=0"]  # a leading zero column is still written
    with pytest.raises(ValueError, match="a >= b >= 0"):
        column_subtract(3, 5)


@pytest.mark.parametrize("seed", range(3))
def test_columns_are_true_and_read_back_to_the_answer(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        added, subtracted = column_add(a, b), column_subtract(max(a, b), min(a, b))
        _check(added)
        _check(subtracted)
        assert _read_back(added) == a + b
        assert _read_back(subtracted) == abs(a - b)


def test_signed_sums_rewrite_only_when_needed() -> None:
    assert signed_sum(13, -7) == ["13-7=6", "1-1-0=0"]  # 13-7 as written: no rewrite
    assert signed_sum(-13, 15)[0] == "15-13"  # operands swapped
    assert signed_sum(7, -13)[0] == "-(13-7)"  # the larger magnitude is negative
    assert signed_sum(-4, -9) == ["-(4+9)", "4+9=13"]
    assert signed_sum(-5, 5) == ["5-5", "5-5=0"]  # zero has no sign


@pytest.mark.parametrize("seed", range(3))
def test_signed_sums_read_back_to_the_answer(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        a, b = rng.randint(-999, 999), rng.randint(-999, 999)
        steps = signed_sum(a, b)
        _check(steps)
        sign = -1 if steps[0].startswith("-(") else 1
        assert sign * _read_back(steps) == a + b, (a, b, steps)


def test_solution_ends_in_the_boxed_answer() -> None:
    assert solution(["7+8=15", "4+3+1=8"], "85") == "7+8=15,4+3+1=8,\\boxed{85}"
    assert solution([], "4") == "\\boxed{4}"
