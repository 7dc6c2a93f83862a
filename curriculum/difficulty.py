"""Difficulty controllers: which level of each domain to draw from (docs/configuration.md).

A controller holds one current level per domain, as an index into that domain's ordered levels,
and updates all domains at once with numpy. The scheduler hands it one step's per-(domain, level)
counts as flat arrays (``LevelTable`` says where each domain's levels start), so reading "the
counts at each domain's current level" is one fancy-indexing operation.

Every controller says how a domain's prompts spread over its levels (``shares``, one number per
cell, summing to 1 within each domain). The level-walking controllers put them on the current level,
with ``replay_share`` of them on the level just below (where there is one) — a guard against
forgetting the easier levels. ``LearnabilityDifficulty`` spreads them over every level at once.
"""
from __future__ import annotations

import numpy as np


class LevelTable:
    """Flat layout of all (domain, level) cells: domain d's levels sit at offset[d] + 0..n_levels[d]-1."""

    def __init__(self, domain_levels: dict[str, tuple[int, ...]]) -> None:
        self.domains = list(domain_levels)
        self.domains_index = {d: i for i, d in enumerate(self.domains)}
        for name, levels in domain_levels.items():
            if not levels:
                raise ValueError(f"domain {name!r} has no levels")
            if list(levels) != sorted(set(levels)):
                raise ValueError(f"levels of domain {name!r} must be increasing and distinct: {levels}")
        self.n_levels = np.array([len(domain_levels[d]) for d in self.domains], dtype=np.int64)
        self.offset = np.concatenate([[0], np.cumsum(self.n_levels)[:-1]]).astype(np.int64)
        self.values = np.array([lv for d in self.domains for lv in domain_levels[d]], dtype=np.int64)
        self.domain_of = np.repeat(np.arange(len(self.domains)), self.n_levels)  # [cells] -> domain
        self.cell = {(d, int(lv)): int(off + i) for d, off in zip(self.domains, self.offset)
                     for i, lv in enumerate(domain_levels[d])}

    @property
    def n_cells(self) -> int:
        return int(self.n_levels.sum())

    def level_values(self, idx: np.ndarray) -> np.ndarray:
        return self.values[self.offset + idx]

    def index_of(self, domain: int, level: int) -> int:
        """Index of ``level`` among domain ``domain``'s levels (ValueError when absent)."""
        lo, n = self.offset[domain], self.n_levels[domain]
        hits = np.nonzero(self.values[lo:lo + n] == level)[0]
        if not len(hits):
            raise ValueError(f"domain {self.domains[domain]!r} has no level {level}")
        return int(hits[0])


class DifficultyController:
    """Base: holds ``idx`` (current level index per domain) and the replay option; never moves."""

    name = "base"

    def __init__(self, table: LevelTable, replay_share: float = 0.0,
                 start_levels: dict[str, int] | None = None) -> None:
        if not 0.0 <= replay_share < 1.0:
            raise ValueError(f"replay_share must be in [0, 1), got {replay_share}")
        self.table, self.replay_share = table, float(replay_share)
        self.idx = np.zeros(len(table.domains), dtype=np.int64)  # start at each domain's easiest level
        for name, level in (start_levels or {}).items():
            if name not in table.domains:
                raise ValueError(f"start level given for unknown domain {name!r}")
            d = table.domains.index(name)
            self.idx[d] = table.index_of(d, level)

    def levels(self) -> np.ndarray:
        """Current level value per domain [D]."""
        return self.table.level_values(self.idx)

    def replay(self) -> np.ndarray:
        """Share of each domain's prompts to draw from the level below [D] (0 at the lowest level)."""
        return np.where(self.idx > 0, self.replay_share, 0.0)

    def shares(self) -> np.ndarray:
        """Share of each domain's prompts per (domain, level) cell [n_cells]; sums to 1 per domain."""
        out = np.zeros(self.table.n_cells)
        replay = self.replay()
        here = self.table.offset + self.idx
        out[here] = 1.0 - replay
        below = self.idx > 0
        out[here[below] - 1] = replay[below]
        return out

    def current(self, cells: np.ndarray) -> np.ndarray:
        """Pick each domain's current-level entry out of a flat per-cell array."""
        return cells[self.table.offset + self.idx]

    def update(self, step: int, attempts: np.ndarray, successes: np.ndarray, reward_sum: np.ndarray) -> None:
        """Fold in one step's per-cell counts (flat arrays over all (domain, level) cells)."""

    def fall_to_easiest(self, domains: np.ndarray) -> None:
        """Send the domains of the [D] bool mask to their easiest level (cold start)."""
        self.idx[domains] = 0

    def state_dict(self) -> dict:
        return {"idx": self.idx.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.idx = np.asarray(state["idx"], dtype=np.int64)


class _WindowedCounts:
    """Recent attempts and successes, scaled back to ``window`` attempts whenever they exceed it:
    an O(1) state per entry that weighs recent attempts most, close to a sliding window."""

    def _init_window(self, size: int, window: int) -> None:
        self.window = int(window)
        self.win_attempts = np.zeros(size)
        self.win_successes = np.zeros(size)

    def _add_to_window(self, attempts: np.ndarray, successes: np.ndarray) -> None:
        self.win_attempts += attempts
        self.win_successes += successes
        scale = np.where(self.win_attempts > self.window, self.window / np.maximum(self.win_attempts, 1.0), 1.0)
        self.win_attempts *= scale
        self.win_successes *= scale

    def _window_state(self) -> dict:
        return {"win_attempts": self.win_attempts.tolist(), "win_successes": self.win_successes.tolist()}

    def _load_window(self, state: dict) -> None:
        self.win_attempts = np.asarray(state["win_attempts"], dtype=float)
        self.win_successes = np.asarray(state["win_successes"], dtype=float)


class FixedDifficulty(DifficultyController):
    """Each domain stays at one level: ``level`` for all (None: the easiest), or per-domain ``start_levels``."""

    name = "fixed"

    def __init__(self, table: LevelTable, level: int | None = None, replay_share: float = 0.0,
                 start_levels: dict[str, int] | None = None) -> None:
        every = {d: level for d in table.domains} if level is not None else {}
        super().__init__(table, replay_share, {**every, **(start_levels or {})})


class ThresholdDifficulty(_WindowedCounts, DifficultyController):
    """Raise a domain's level when its success at the current level exceeds ``raise_above``, lower
    it below ``lower_below``, once ``window`` attempts at that level have been seen; the evidence is
    cleared whenever the level changes. Bounded by the domain's own levels.

    Source: reasoning-gym's curricula (raise > 0.7, lower below ~0.1–0.3 over the last k attempts).
    Departure: instead of a list of the last k outcomes per domain, each domain keeps a count of
    attempts and successes that is scaled back to ``window`` whenever it exceeds it — an O(1)
    state per domain that weighs recent attempts most, close to a sliding window of k.
    """

    name = "threshold"

    def __init__(self, table: LevelTable, raise_above: float = 0.7, lower_below: float = 0.2,
                 window: int = 32, replay_share: float = 0.0, start_levels: dict[str, int] | None = None) -> None:
        super().__init__(table, replay_share, start_levels)
        if not 0.0 <= lower_below < raise_above <= 1.0:
            raise ValueError("threshold needs 0 <= lower_below < raise_above <= 1")
        self.raise_above, self.lower_below = raise_above, lower_below
        self._init_window(len(table.domains), window)

    def update(self, step: int, attempts: np.ndarray, successes: np.ndarray, reward_sum: np.ndarray) -> None:
        self._add_to_window(self.current(attempts), self.current(successes))
        ready = self.win_attempts >= self.window - 1e-9
        rate = self.win_successes / np.maximum(self.win_attempts, 1e-12)
        up = ready & (rate > self.raise_above) & (self.idx < self.table.n_levels - 1)
        down = ready & (rate < self.lower_below) & (self.idx > 0)
        self.idx += up.astype(np.int64) - down.astype(np.int64)
        changed = up | down
        self.win_attempts[changed] = 0.0  # evidence from the old level says nothing about the new one
        self.win_successes[changed] = 0.0

    def fall_to_easiest(self, domains: np.ndarray) -> None:
        moved = domains & (self.idx > 0)
        super().fall_to_easiest(domains)
        self.win_attempts[moved] = 0.0
        self.win_successes[moved] = 0.0

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self._window_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._load_window(state)


class TargetDifficulty(DifficultyController):
    """Track a target success rate: T ← clip(T + η·tanh(α·(R − target)), 0, L − 1); level = round(T).

    Source: AdaRFT (adaptive curriculum reinforcement finetuning), which moves a continuous
    difficulty target by η·tanh(α(R − β)) after each batch, β = 0.5. Departures: T lives on the
    domain's level indices (0 … L − 1) instead of a 0–100 difficulty score, so η is in levels per
    step; R is the step's mean reward at the current level, and a domain without attempts at its
    current level keeps its T.
    """

    name = "target"

    def __init__(self, table: LevelTable, target: float = 0.5, eta: float = 0.5, alpha: float = 2.0,
                 replay_share: float = 0.0, start_levels: dict[str, int] | None = None) -> None:
        super().__init__(table, replay_share, start_levels)
        self.target, self.eta, self.alpha = target, eta, alpha
        self.position = self.idx.astype(float)  # the continuous difficulty T, in level indices

    def update(self, step: int, attempts: np.ndarray, successes: np.ndarray, reward_sum: np.ndarray) -> None:
        att = self.current(attempts)
        seen = att > 0
        reward = np.zeros(len(att))
        reward[seen] = self.current(reward_sum)[seen] / att[seen]
        move = self.eta * np.tanh(self.alpha * (reward - self.target))
        top = (self.table.n_levels - 1).astype(float)
        self.position = np.where(seen, np.clip(self.position + move, 0.0, top), self.position)
        self.idx = np.rint(self.position).astype(np.int64)

    def fall_to_easiest(self, domains: np.ndarray) -> None:
        super().fall_to_easiest(domains)
        self.position[domains] = 0.0

    def state_dict(self) -> dict:
        return {**super().state_dict(), "position": self.position.tolist()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.position = np.asarray(state["position"], dtype=float)


class LearnabilityDifficulty(_WindowedCounts, DifficultyController):
    """Spread each domain's prompts over all its levels, in proportion to each level's learnability
    p(1 − p), where p is the recent success rate at that level; a ``floor`` share is spread evenly
    over the levels so that none is ever dropped.

    Source: LILO's learnability weighting (weight ∝ p(1 − p), arXiv 2502.12272), applied to the
    levels of a domain instead of across domains. Why: a small model's levels are not always
    ordered by how hard they are for *it*, and the walking controllers train one level at a time,
    so the levels they leave behind are forgotten. Here every level keeps being trained, the most
    learnable ones most. p is a Laplace estimate (s + 1) / (n + 2) over a window of recent attempts
    scaled back as in ``ThresholdDifficulty``, so an unseen level starts at p = 0.5, the most
    learnable, and is tried early. ``levels()`` reports the level with the largest share.
    """

    name = "learnability"

    def __init__(self, table: LevelTable, floor: float = 0.2, window: int = 32) -> None:
        super().__init__(table)
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"floor must be in [0, 1], got {floor}")
        self.floor = float(floor)
        self._init_window(table.n_cells, window)

    def shares(self) -> np.ndarray:
        t = self.table
        p = (self.win_successes + 1.0) / (self.win_attempts + 2.0)
        score = p * (1.0 - p)
        total = np.bincount(t.domain_of, weights=score, minlength=len(t.domains))[t.domain_of]
        even = 1.0 / t.n_levels[t.domain_of]
        return (1.0 - self.floor) * score / total + self.floor * even

    def update(self, step: int, attempts: np.ndarray, successes: np.ndarray, reward_sum: np.ndarray) -> None:
        self._add_to_window(attempts, successes)
        shares = self.shares()
        for d in range(len(self.table.domains)):  # the level with the largest share, for reports
            lo, n = self.table.offset[d], self.table.n_levels[d]
            self.idx[d] = int(np.argmax(shares[lo:lo + n]))

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self._window_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._load_window(state)


CONTROLLERS: dict[str, type[DifficultyController]] = {
    cls.name: cls for cls in (FixedDifficulty, ThresholdDifficulty, TargetDifficulty, LearnabilityDifficulty)
}
