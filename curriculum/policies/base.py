"""The MixingPolicy contract, shared helpers, and the wrapper every policy can take.

A policy maps per-domain ``Signals`` to mixture weights over the D domains. Two calls:

- ``weights(signals, step)`` is pure: it reads the policy's state and never changes it. Policies
  that draw random numbers (Thompson, epsilon-greedy) draw from a generator seeded by
  (seed, step), so asking twice for the same step gives the same answer.
- ``update(signals, step, used)`` runs after a step's results are folded into ``signals``;
  ``used`` holds the weights the step was actually planned with. All learning happens here.

Keeping all state changes in ``update`` makes a policy a function of the recorded history, so the
scheduler can rebuild it from the store, whatever order the trainer called plan and record in.
"""
from __future__ import annotations

import difflib

import numpy as np

from curriculum.signals import Signals


def softmax(scores: np.ndarray, temperature: float) -> np.ndarray:
    z = np.asarray(scores, dtype=float) / max(temperature, 1e-12)
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def normalise(w: np.ndarray) -> np.ndarray:
    """Weights that sum to 1; uniform when there is nothing to normalise (all zero)."""
    w = np.clip(np.nan_to_num(np.asarray(w, dtype=float)), 0.0, None)
    total = w.sum()
    return w / total if total > 0 else np.full(w.shape, 1.0 / max(len(w), 1))


def domain_index(domains: list[str], names: dict[str, float], what: str) -> dict[int, float]:
    """Map {domain name: value} to {index: value}; an unknown name fails with a suggestion."""
    index = {d: i for i, d in enumerate(domains)}
    out = {}
    for name, value in names.items():
        if name not in index:
            close = difflib.get_close_matches(name, domains, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{what}: unknown domain {name!r}{hint}")
        out[index[name]] = float(value)
    return out


class MixingPolicy:
    """Base class: uniform weights, no state. Subclasses override ``weights`` and maybe ``update``."""

    name = "base"

    def __init__(self, domains: list[str], seed: int = 0) -> None:
        self.domains = list(domains)
        self.seed = int(seed)

    @property
    def n(self) -> int:
        return len(self.domains)

    def rng(self, step: int, salt: int = 0) -> np.random.Generator:
        """A generator that depends only on (seed, step, salt): pure draws, reproducible plans."""
        return np.random.default_rng([self.seed, int(step), salt])

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        return np.full(self.n, 1.0 / self.n)

    def update(self, signals: Signals, step: int, used: np.ndarray) -> None:
        """Learn from the step just folded into ``signals``; stateless policies do nothing."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Wrapped(MixingPolicy):
    """Any policy plus warm-up, pinned shares, a floor, a cap and smoothing.

    Order: the inner weights (uniform until ``warmup_steps`` steps have been recorded) → pinned domains
    get exactly their share and the rest is renormalised to what remains → every other domain
    gets at least ``floor / D`` → no domain gets more than ``cap`` (the excess is spread over the
    others in proportion to their weights) → an EMA with the previous step's weights
    (``smoothing`` is the weight kept from the previous step). Each constraint is convex, so the
    smoothed weights still satisfy the floor, the cap and the pins.
    """

    def __init__(self, inner: MixingPolicy, warmup_steps: int = 0, floor: float = 0.0,
                 cap: float | None = None, smoothing: float = 0.0,
                 pinned: dict[str, float] | None = None) -> None:
        super().__init__(inner.domains, inner.seed)
        self.inner = inner
        self.name = inner.name
        self.warmup_steps, self.smoothing = int(warmup_steps), float(smoothing)
        self.pinned = domain_index(self.domains, pinned or {}, "pinned share")
        self.free = np.ones(self.n, dtype=bool)
        self.free[list(self.pinned)] = False
        self.free_mass = 1.0 - sum(self.pinned.values())
        self.floor_share = float(floor) / self.n
        self.cap = cap
        self._check_feasible()
        self.prev: np.ndarray | None = None

    def _check_feasible(self) -> None:
        n_free = int(self.free.sum())
        if self.free_mass < -1e-9 or (n_free == 0 and abs(self.free_mass) > 1e-9):
            raise ValueError(f"pinned shares sum to {1 - self.free_mass:.3f}; they must leave the rest of 1")
        if self.floor_share * n_free > self.free_mass + 1e-9:
            raise ValueError("floor is larger than the share left after pinned domains")
        if self.cap is not None and n_free and self.cap * n_free < self.free_mass - 1e-9:
            raise ValueError(f"cap {self.cap} is below the share each of {n_free} domains must take")

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        # Warm-up counts recorded steps, not step numbers, so it does not depend on where they start.
        warm = signals.steps_seen >= self.warmup_steps
        raw = self.inner.weights(signals, step) if warm else np.ones(self.n)
        w = self.constrain(raw)
        if self.prev is not None and self.smoothing > 0:
            w = self.smoothing * self.prev + (1.0 - self.smoothing) * w
        return w

    def constrain(self, raw: np.ndarray) -> np.ndarray:
        w = np.zeros(self.n)
        for i, share in self.pinned.items():
            w[i] = share
        if self.free.any():
            free = normalise(raw[self.free]) * self.free_mass
            spare = self.free_mass - self.floor_share * len(free)
            free = self.floor_share + spare * (free / self.free_mass if self.free_mass > 0 else free)
            if self.cap is not None:
                free = _water_fill(free, self.cap)
            w[self.free] = free
        return w

    def update(self, signals: Signals, step: int, used: np.ndarray) -> None:
        self.inner.update(signals, step, used)
        self.prev = np.asarray(used, dtype=float).copy()

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(),
                "prev": None if self.prev is None else self.prev.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self.prev = None if state["prev"] is None else np.asarray(state["prev"], dtype=float)


def _water_fill(w: np.ndarray, cap: float) -> np.ndarray:
    """Clip at ``cap`` and hand the excess to the uncapped entries in proportion to their weight.

    Scaling the uncapped entries up keeps every floor; each round caps at least one more entry,
    so this ends within len(w) rounds (in practice two or three).
    """
    w = w.copy()
    for _ in range(len(w)):
        over = w > cap + 1e-12
        if not over.any():
            break
        excess = float((w[over] - cap).sum())
        w[over] = cap
        room = w < cap - 1e-12
        base = w[room].sum()
        w[room] += excess * (w[room] / base if base > 0 else 1.0 / room.sum())
    return w
