"""Per-domain signals, computed once per step and shared by every mixing policy.

Everything is an array over the D domains, updated with numpy in O(D) per step: windows are ring
buffers of per-step sums with running window totals (the slot that falls out of the window is
subtracted, the new one added), so no update ever walks the window or loops over domains.

Quantities (NaN where a domain has no attempts in the window):

- ``attempts``, ``successes``, ``groups`` — totals since the start of the run;
- ``success`` — windowed success rate (successes / attempts over the last ``window`` steps);
- ``ema_success`` — exponential moving average of each step's success rate (steps with attempts);
- ``mean_abs_adv`` — windowed mean |advantage| (a learnability signal);
- ``zero_var_share`` — windowed share of groups whose rewards all agree;
- ``success_slope`` / ``reward_slope`` — least-squares slope, per step, of the per-step success
  rate / mean reward over the steps in the window where the domain had attempts;
- ``success_slope_se`` — the standard error of ``success_slope`` if each step's rate were a binomial
  draw at the window's success rate: how much of a slope sampling noise alone would explain.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass
class StepCounts:
    """One step's per-domain sums (arrays [D]); what ``Signals.update`` consumes."""

    attempts: np.ndarray
    successes: np.ndarray
    reward_sum: np.ndarray
    abs_adv_sum: np.ndarray
    zero_var_groups: np.ndarray
    groups: np.ndarray

    @classmethod
    def zeros(cls, n: int) -> "StepCounts":
        return cls(*(np.zeros(n) for _ in fields(cls)))


class _Window:
    """Running sums over the last ``size`` steps of several per-domain series, O(D) per step.

    Each series has a ring of per-step values [size, D] and a running total [D]. Steps that were
    skipped (a gap in step numbers) are evicted too, so the window is in steps, not in updates.
    """

    def __init__(self, size: int, n: int, names: tuple[str, ...]) -> None:
        self.size, self.names = size, names
        self.ring = {k: np.zeros((size, n)) for k in names}
        self.total = {k: np.zeros(n) for k in names}
        self.last_step: int | None = None

    def push(self, step: int, values: dict[str, np.ndarray]) -> None:
        first = step - self.size + 1 if self.last_step is None else self.last_step + 1
        for s in range(max(first, step - self.size + 1), step + 1):  # at most `size` slots
            self._evict(s % self.size)
        slot = step % self.size
        for k in self.names:
            self.ring[k][slot] = values[k]
            self.total[k] += values[k]
        if slot == 0:  # once per lap, re-add from the ring so add/subtract rounding cannot drift
            for k in self.names:
                self.total[k] = self.ring[k].sum(axis=0)
        self.last_step = step

    def _evict(self, slot: int) -> None:
        for k in self.names:
            self.total[k] -= self.ring[k][slot]
            self.ring[k][slot] = 0.0

    def state_dict(self) -> dict:
        return {"last_step": self.last_step,
                "ring": {k: v.tolist() for k, v in self.ring.items()},
                "total": {k: v.tolist() for k, v in self.total.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = state["last_step"]
        self.ring = {k: np.asarray(state["ring"][k], dtype=float) for k in self.names}
        self.total = {k: np.asarray(state["total"][k], dtype=float) for k in self.names}


_COUNT_SERIES = ("attempts", "successes", "reward_sum", "abs_adv_sum", "zero_var_groups", "groups")
# Sums for the least-squares slope of y against x = step, over steps where the domain was seen:
# n = sum(m), sx = sum(m x), sxx = sum(m x^2), and sy, sxy for each of the two y series.
_SLOPE_SERIES = ("n", "sx", "sxx", "sy_succ", "sxy_succ", "sy_rew", "sxy_rew")


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


class Signals:
    """Per-domain statistics over D domains. See the module docstring for the quantities."""

    def __init__(self, domains: list[str], window: int = 10, ema_alpha: float = 0.1) -> None:
        if window < 2:
            raise ValueError(f"signals window must be >= 2 steps (a slope needs two points), got {window}")
        self.domains = list(domains)
        self.window, self.ema_alpha = window, ema_alpha
        n = len(self.domains)
        self.totals = StepCounts.zeros(n)
        self.last = StepCounts.zeros(n)  # the latest step's sums (SEC and EXP3 use per-step values)
        self.ema = np.full(n, np.nan)
        self.steps_seen = 0  # number of updates
        self.last_step: int | None = None
        self.last_seen = np.full(n, -1)  # step at which each domain last had attempts
        self._counts = _Window(window, n, _COUNT_SERIES)
        self._slope = _Window(window, n, _SLOPE_SERIES)

    @property
    def n_domains(self) -> int:
        return len(self.domains)

    # -- update -------------------------------------------------------------------------------
    def update(self, step: int, counts: StepCounts) -> None:
        """Fold one step's per-domain sums in. Steps must increase (a replayed step is the store's
        job to de-duplicate; the scheduler rebuilds its state rather than re-applying a step)."""
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"signals already hold step {self.last_step}; got step {step}")
        for f in fields(StepCounts):
            getattr(self.totals, f.name)[:] += getattr(counts, f.name)
        self.last = StepCounts(*(np.asarray(getattr(counts, f.name), dtype=float).copy()
                                 for f in fields(StepCounts)))
        self._counts.push(step, {k: getattr(counts, k) for k in _COUNT_SERIES})
        self._push_slope(step, counts)
        self._update_ema(counts)
        self.last_seen[counts.attempts > 0] = step
        self.steps_seen += 1
        self.last_step = step

    def _push_slope(self, step: int, counts: StepCounts) -> None:
        seen = (counts.attempts > 0).astype(float)
        succ = np.nan_to_num(_safe_div(counts.successes, counts.attempts))
        rew = np.nan_to_num(_safe_div(counts.reward_sum, counts.attempts))
        x = float(step)
        self._slope.push(step, {"n": seen, "sx": seen * x, "sxx": seen * x * x,
                                "sy_succ": succ, "sxy_succ": succ * x,
                                "sy_rew": rew, "sxy_rew": rew * x})

    def _update_ema(self, counts: StepCounts) -> None:
        seen = counts.attempts > 0
        rate = _safe_div(counts.successes, counts.attempts)
        fresh = seen & np.isnan(self.ema)
        old = seen & ~np.isnan(self.ema)
        self.ema[fresh] = rate[fresh]
        self.ema[old] += self.ema_alpha * (rate[old] - self.ema[old])

    # -- views --------------------------------------------------------------------------------
    @property
    def attempts(self) -> np.ndarray:
        return self.totals.attempts

    @property
    def successes(self) -> np.ndarray:
        return self.totals.successes

    @property
    def groups(self) -> np.ndarray:
        return self.totals.groups

    @property
    def window_attempts(self) -> np.ndarray:
        return self._counts.total["attempts"]

    @property
    def success(self) -> np.ndarray:
        return _safe_div(self._counts.total["successes"], self._counts.total["attempts"])

    @property
    def cold(self) -> np.ndarray:
        """[D] bool: no success in the window (an empty window counts as none): what every policy's
        signal is zero for, and what the scheduler's cold start helps (``curriculum/cold_start.py``)."""
        with np.errstate(invalid="ignore"):
            return ~(self.success > 0)

    @property
    def ema_success(self) -> np.ndarray:
        return self.ema

    @property
    def mean_reward(self) -> np.ndarray:
        return _safe_div(self._counts.total["reward_sum"], self._counts.total["attempts"])

    @property
    def mean_abs_adv(self) -> np.ndarray:
        return _safe_div(self._counts.total["abs_adv_sum"], self._counts.total["attempts"])

    @property
    def zero_var_share(self) -> np.ndarray:
        return _safe_div(self._counts.total["zero_var_groups"], self._counts.total["groups"])

    @property
    def success_slope(self) -> np.ndarray:
        return self._slope_of("sy_succ", "sxy_succ")

    @property
    def reward_slope(self) -> np.ndarray:
        return self._slope_of("sy_rew", "sxy_rew")

    @property
    def success_slope_se(self) -> np.ndarray:
        """Standard error of ``success_slope`` under binomial noise: each seen step's rate has
        variance p(1-p)/m, with p the windowed success and m the mean attempts per seen step, and an
        unweighted least-squares slope over steps spread by Sxx has variance that over Sxx. inf where
        fewer than two distinct steps were seen (no trend can be told from noise)."""
        t = self._slope.total
        n, sx, sxx = t["n"], t["sx"], t["sxx"]
        spread = sxx - _safe_div(sx * sx, n)  # Sxx = sum over seen steps of (x - mean x)^2
        per_step = _safe_div(self.window_attempts, n)  # mean attempts of a seen step
        p = np.nan_to_num(self.success)
        se = np.full(n.shape, np.inf)
        ok = (n >= 2) & (spread > 1e-9) & (per_step > 0)
        se[ok] = np.sqrt(p[ok] * (1 - p[ok]) / per_step[ok] / spread[ok])
        return se

    def _slope_of(self, sy_key: str, sxy_key: str) -> np.ndarray:
        """Least-squares slope; 0 where fewer than two distinct steps were seen (no trend known)."""
        t = self._slope.total
        n, sx, sxx = t["n"], t["sx"], t["sxx"]
        den = n * sxx - sx * sx
        slope = np.zeros(n.shape)
        ok = (n >= 2) & (den > 1e-9)
        slope[ok] = (n[ok] * t[sxy_key][ok] - sx[ok] * t[sy_key][ok]) / den[ok]
        return slope

    @classmethod
    def from_step_stats(cls, domains: list[str], rows: list[dict], window: int = 10,
                        ema_alpha: float = 0.1, steps: list[int] | None = None) -> "Signals":
        """Rebuild signals from ``StatsStore.step_stats`` rows (sorted by step, domain, level).

        ``steps`` lists every step to fold in (steps with no rows count as empty steps, as they
        did live); by default, the steps that have rows. Per-level rows are summed per domain in
        level order, the same order the scheduler uses, so the result equals the live state.
        """
        signals = cls(domains, window, ema_alpha)
        index = {d: i for i, d in enumerate(signals.domains)}
        by_step: dict[int, list[dict]] = {}
        for row in rows:
            by_step.setdefault(row["step"], []).append(row)
        for step in sorted(set(by_step) | set(steps or [])):
            counts = StepCounts.zeros(len(domains))
            for row in by_step.get(step, []):
                d = index[row["domain"]]
                for f in fields(StepCounts):
                    getattr(counts, f.name)[d] += row[f.name]
            signals.update(step, counts)
        return signals

    # -- persistence --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "domains": list(self.domains), "window": self.window, "ema_alpha": self.ema_alpha,
            "totals": {f.name: getattr(self.totals, f.name).tolist() for f in fields(StepCounts)},
            "last": {f.name: getattr(self.last, f.name).tolist() for f in fields(StepCounts)},
            "ema": [None if np.isnan(v) else v for v in self.ema.tolist()],
            "steps_seen": self.steps_seen, "last_step": self.last_step,
            "last_seen": self.last_seen.tolist(),
            "counts": self._counts.state_dict(), "slope": self._slope.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if list(state["domains"]) != self.domains or state["window"] != self.window:
            raise ValueError("signals state was saved for other domains or another window")
        self.totals = StepCounts(*(np.asarray(state["totals"][f.name], dtype=float) for f in fields(StepCounts)))
        self.last = StepCounts(*(np.asarray(state["last"][f.name], dtype=float) for f in fields(StepCounts)))
        self.ema = np.array([np.nan if v is None else v for v in state["ema"]], dtype=float)
        self.steps_seen, self.last_step = state["steps_seen"], state["last_step"]
        self.last_seen = np.asarray(state["last_seen"], dtype=int)
        self._counts.load_state_dict(state["counts"])
        self._slope.load_state_dict(state["slope"])
