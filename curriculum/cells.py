"""One step's sums per (domain, level) cell, and the ``step_stats`` rows they are stored as.

The one place these are computed: the scheduler learns from ``cell_counts`` and hands the rows
of ``stat_rows`` to the store, and a store asked to write a step without them
(``StatsStore.write_step(..., step_stats=None)``) builds them with ``aggregate_outcomes``, the
same two functions over a table of the outcomes' own cells, so both views agree exactly.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np

from curriculum.difficulty import LevelTable
from curriculum.signals import StepCounts
from curriculum.types import GroupArrays, spread_is_zero

if TYPE_CHECKING:
    from curriculum.types import Outcome

# One step's sums per (domain, level) cell are the same six arrays as Signals' per-domain sums,
# only [n_cells] long (in LevelTable order) instead of [D]: one record type serves both.
CellCounts = StepCounts


def cell_counts(outcomes: "list[Outcome] | GroupArrays", table: LevelTable) -> CellCounts:
    """Per-cell sums of one step's outcomes; a group is the outcomes sharing ``group``, counted in
    the cell of its first completion, and has zero variance when its rewards all agree. Outcomes a
    lead wrote (``Outcome.led``) are left out: they say what the domain does when led, not alone."""
    if isinstance(outcomes, GroupArrays):
        return _group_cell_counts(outcomes, table) if len(outcomes) else CellCounts.zeros(table.n_cells)
    outcomes = [o for o in outcomes if not o.led]
    n_cells, n = table.n_cells, len(outcomes)
    if n == 0:
        return CellCounts.zeros(n_cells)
    cell = np.fromiter((cell_of(table, o) for o in outcomes), np.int64, n)
    reward = np.fromiter((o.reward for o in outcomes), float, n)
    correct = np.fromiter((o.correct for o in outcomes), float, n)
    abs_adv = np.abs(np.fromiter((o.advantage for o in outcomes), float, n))
    group = np.fromiter((o.group for o in outcomes), np.int64, n)
    _, first, member = np.unique(group, return_index=True, return_inverse=True)
    lo = np.full(len(first), np.inf)
    hi = np.full(len(first), -np.inf)
    np.minimum.at(lo, member, reward)
    np.maximum.at(hi, member, reward)
    group_cell = cell[first]  # a group belongs to the cell of its first completion
    return _cell_sums(n_cells, cell, group_cell, correct, reward, abs_adv, spread_is_zero(lo, hi).astype(float))


def _group_cell_counts(groups: GroupArrays, table: LevelTable) -> CellCounts:
    """``cell_counts`` of outcomes given group by group: the same sums, added in the same order
    (group by group, completion by completion), without a Python step per completion."""
    try:
        group_cell = np.array([table.cell[key] for key in zip(groups.domains, groups.levels.tolist())], np.int64)
    except KeyError as exc:
        raise ValueError(f"outcome for unknown domain/level {exc.args[0]!r}") from None
    size = groups.reward.shape[1]
    cell = np.repeat(group_cell, size)
    reward = groups.reward.astype(float)
    correct, abs_adv = groups.correct.astype(float), np.abs(groups.advantage.astype(float))
    if groups.led is None:
        agree = spread_is_zero(reward.min(axis=1), reward.max(axis=1)).astype(float)
        return _cell_sums(table.n_cells, cell, group_cell, correct.ravel(), reward.ravel(), abs_adv.ravel(), agree)
    own = np.arange(size)[None, :] >= np.asarray(groups.led)[:, None]  # [P, G] the members no lead wrote
    agree = spread_is_zero(np.where(own, reward, np.inf).min(axis=1), np.where(own, reward, -np.inf).max(axis=1))
    return _cell_sums(table.n_cells, cell[own.ravel()], group_cell, correct[own], reward[own], abs_adv[own],
                      agree.astype(float))


def _cell_sums(n_cells: int, cell: np.ndarray, group_cell: np.ndarray, correct: np.ndarray, reward: np.ndarray,
               abs_adv: np.ndarray, agree: np.ndarray) -> CellCounts:
    """The six sums from per-completion values (indexed by ``cell``) and per-group ones (``group_cell``)."""
    def count(idx: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(idx, weights=w, minlength=n_cells).astype(float)
    return CellCounts(count(cell), count(cell, correct), count(cell, reward), count(cell, abs_adv),
                      count(group_cell, agree), count(group_cell))


def cell_of(table: LevelTable, o: "Outcome") -> int:
    try:
        return table.cell[(o.domain, int(o.level))]
    except KeyError:
        domains = table.domains
        raise ValueError(f"outcome for unknown domain/level ({o.domain!r}, {o.level}); "
                         f"the scheduler knows {domains[:5]}{'...' if len(domains) > 5 else ''}") from None


def stat_rows(cells: CellCounts, table: LevelTable) -> list[dict]:
    """The ``step_stats`` rows (without run and step) of the cells that had attempts, in table order."""
    rows = []
    for c in np.nonzero(cells.attempts)[0]:
        d = table.domain_of[c]
        attempts = int(cells.attempts[c])
        rows.append(dict(domain=table.domains[d], level=int(table.values[c]), attempts=attempts,
                         successes=int(cells.successes[c]), reward_sum=float(cells.reward_sum[c]),
                         abs_adv_sum=float(cells.abs_adv_sum[c]),
                         mean_abs_adv=float(cells.abs_adv_sum[c]) / attempts,
                         zero_var_groups=int(cells.zero_var_groups[c]), groups=int(cells.groups[c])))
    return rows


def aggregate_outcomes(outcomes: "Iterable[Outcome]") -> list[dict]:
    """The ``step_stats`` rows of one step's outcomes, over the cells the outcomes themselves name."""
    outcomes = list(outcomes)
    levels: dict[str, set[int]] = {}
    for o in outcomes:
        levels.setdefault(o.domain, set()).add(int(o.level))
    table = LevelTable({d: tuple(sorted(lv)) for d, lv in levels.items()})
    return stat_rows(cell_counts(outcomes, table), table)
