"""curriculum.cells: the one computation of a step's per-(domain, level) sums and step_stats rows.

The store builds the rows itself (``write_step`` without ``step_stats``) with the same functions
the scheduler uses; here they are checked against a plain loop over the outcomes (the store's
own version before the two were unified).
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from curriculum.cells import aggregate_outcomes, cell_counts, stat_rows
from curriculum.difficulty import LevelTable
from curriculum.types import GroupArrays, Outcome


def _loop_rows(outcomes: list[Outcome]) -> list[dict]:
    cells: dict[tuple[str, int], dict] = {}
    groups: dict[int, list] = {}
    for o in outcomes:
        cell = cells.setdefault((o.domain, int(o.level)), dict(
            domain=o.domain, level=int(o.level), attempts=0, successes=0, reward_sum=0.0,
            abs_adv_sum=0.0, zero_var_groups=0, groups=0))
        cell["attempts"] += 1
        cell["successes"] += int(bool(o.correct))
        cell["reward_sum"] += float(o.reward)
        cell["abs_adv_sum"] += abs(float(o.advantage))
        groups.setdefault(o.group, []).append(o)
    for members in groups.values():
        cell = cells[(members[0].domain, int(members[0].level))]
        cell["groups"] += 1
        cell["zero_var_groups"] += int(len({m.reward for m in members}) == 1)
    for cell in cells.values():
        cell["mean_abs_adv"] = cell["abs_adv_sum"] / cell["attempts"]
    return list(cells.values())


def _random_step(rng: random.Random) -> list[Outcome]:
    outcomes = []
    for g in rng.sample(range(20), rng.randint(0, 8)):
        domain, level = rng.choice(["a", "b", "zz"]), rng.choice([0, 1, 3])
        for _ in range(rng.randint(1, 5)):
            if rng.random() < 0.1:  # now and then a group whose completions sit in two cells
                domain, level = rng.choice(["a", "b"]), rng.choice([0, 2])
            reward = rng.choice([0.0, 1.0, 0.5, rng.random()])
            outcomes.append(Outcome(domain, level, f"t{g}", g, reward, reward > 0.5, "ok", rng.uniform(-2, 2)))
    rng.shuffle(outcomes)
    return outcomes


def test_rows_match_a_plain_loop_exactly():
    rng = random.Random(0)
    by_cell = lambda rows: sorted(rows, key=lambda r: (r["domain"], r["level"]))  # noqa: E731
    for _ in range(500):
        outcomes = _random_step(rng)
        assert by_cell(aggregate_outcomes(outcomes)) == by_cell(_loop_rows(outcomes))  # float sums bit-equal


def test_rows_follow_the_table_and_skip_cells_without_attempts():
    table = LevelTable({"math": (1, 2), "code": (0, 5)})
    outcomes = [Outcome("code", 5, "c", 0, 1.0, True, "ok", 0.5), Outcome("code", 5, "c", 0, 1.0, True, "ok", -0.5),
                Outcome("math", 2, "m", 1, 0.0, False, "wrong", 0.0)]
    counts = cell_counts(outcomes, table)
    np.testing.assert_array_equal(counts.attempts, [0, 1, 0, 2])
    np.testing.assert_array_equal(counts.zero_var_groups, [0, 1, 0, 1])
    assert [(r["domain"], r["level"], r["attempts"], r["mean_abs_adv"]) for r in stat_rows(counts, table)] == [
        ("math", 2, 1, 0.0), ("code", 5, 2, 0.5)]
    assert aggregate_outcomes([]) == [] and stat_rows(cell_counts([], table), table) == []


def test_an_outcome_outside_the_table_is_refused():
    with pytest.raises(ValueError, match="unknown domain/level"):
        cell_counts([Outcome("math", 9, "m", 0, 1.0, True, "ok")], LevelTable({"math": (1, 2)}))


def test_group_arrays_sum_exactly_like_their_outcomes():
    rng = np.random.default_rng(0)
    table = LevelTable({"a": (1, 2), "b": (0,), "c": (3, 5, 7)})
    keys = [("a", 1), ("a", 2), ("b", 0), ("c", 5), ("c", 7)]
    picked = [keys[i] for i in rng.integers(0, len(keys), 40)]
    reward = rng.choice([0.0, 0.3, 1.0], size=(40, 6))
    reward[:5] = 1.0  # some groups agree
    centred = reward - reward.mean(axis=1, keepdims=True)
    groups = GroupArrays(domains=[d for d, _ in picked], levels=np.array([lv for _, lv in picked]),
                         task_ids=[f"t{g}" for g in range(40)], reward=reward, correct=reward > 0.5,
                         advantage=centred / (reward.std(axis=1, keepdims=True) + 1e-4))
    outcomes = list(groups)
    assert len(outcomes) == len(groups) == 240 and outcomes[7].group == 1 and outcomes[7].task_id == "t1"
    arrays, rows = cell_counts(groups, table), cell_counts(outcomes, table)
    for name in ("attempts", "successes", "reward_sum", "abs_adv_sum", "zero_var_groups", "groups"):
        np.testing.assert_array_equal(getattr(arrays, name), getattr(rows, name))  # bit for bit
    with pytest.raises(ValueError, match="unknown domain/level"):
        cell_counts(GroupArrays(["z"], np.array([1]), ["t"], reward[:1], reward[:1] > 0.5, centred[:1]), table)


def test_members_a_lead_wrote_are_left_out_of_group_arrays_as_of_outcomes():
    rng = np.random.default_rng(1)
    table = LevelTable({"a": (1, 2), "b": (0,)})
    reward = rng.choice([0.0, 1.0], size=(30, 4))
    reward[:4, 2:] = 0.0  # led rows whose own members all fail: they agree once the lead's are left out
    reward[:4, :2] = 1.0
    led = np.where(np.arange(30) < 10, 2, 0)
    centred = reward - reward.mean(axis=1, keepdims=True)
    groups = GroupArrays(domains=["a" if g % 3 else "b" for g in range(30)], levels=np.array([1 if g % 3 else 0 for g in range(30)]),
                         task_ids=[f"t{g}" for g in range(30)], reward=reward, correct=reward > 0.5,
                         advantage=centred, led=led)
    outcomes = list(groups)
    assert sum(o.led for o in outcomes) == 20 and outcomes[0].led and outcomes[1].led and not outcomes[2].led
    arrays, rows = cell_counts(groups, table), cell_counts(outcomes, table)
    for name in ("attempts", "successes", "reward_sum", "abs_adv_sum", "zero_var_groups", "groups"):
        np.testing.assert_array_equal(getattr(arrays, name), getattr(rows, name))
    assert arrays.attempts.sum() == 120 - 20 and arrays.groups.sum() == 30
    unled = GroupArrays(groups.domains, groups.levels, groups.task_ids, reward, reward > 0.5, centred)
    assert cell_counts(unled, table).zero_var_groups.sum() < arrays.zero_var_groups.sum()  # the 4 rows above
