"""Headroom: weight each domain by the success it has left to gain, trusting the ones that move.

What the policy is for: held-out macro success, the mean over domains, rises most when the batch
goes where a domain is both far from solved and measurably improving. Two signals per domain,
both from the shared signals window:

- **room** = max(target − p, 0), p the windowed success (how far below its target a domain sits);
- **progress** = max(slope − z · se, 0) · window, the rise in success across the window that
  sampling noise does not explain: se is the slope's binomial standard error
  (``Signals.success_slope_se``) and z = ``progress_z``. With a few completions per domain a step,
  a slope read raw is mostly noise, and a gain on it turns the noise into swings of the weights.

score_d = room_d · (trust_d + gain · progress_d), where trust_d is 1 for a domain with successes in
its window and ``cold_trust`` for one without: a domain that has never succeeded has the most room
of all, and trusting that room fully would pour the batch into domains that cannot be learned. A
cold domain is found by the scheduler's probe budget (``cold_start.probe_rate``) instead; once it
succeeds, its room counts in full. The weights are then held within ``max_ratio`` of each other,
so a solved domain keeps a share that shows forgetting and no domain can take the whole batch.

Ideas it draws on, in our words: weighting a domain by its distance below a target success rate,
so the domain furthest behind gets the most (the domain-aware dynamic sampling of RuleReasoner,
arXiv 2506.08672); favouring what is measurably being learned (learning progress, as in the
teacher-student curricula of Matiisen et al., arXiv 1707.00183, which Palestra's ``tscl`` follows);
and a bounded ratio between the largest and smallest share, so exploration never stops.
Departures: the two are multiplied rather than used apart, and domains without a success are
not scored by their room until the scheduler's probe has found one.
"""
from __future__ import annotations

import numpy as np

from curriculum.policies.base import MixingPolicy, normalise
from curriculum.signals import Signals


class HeadroomPolicy(MixingPolicy):
    name = "headroom"

    def __init__(self, domains: list[str], seed: int = 0, target: float = 0.9, gain: float = 10.0,
                 cold_trust: float = 0.2, max_ratio: float = 4.0, progress_z: float = 0.0) -> None:
        super().__init__(domains, seed)
        if max_ratio < 1:
            raise ValueError(f"max_ratio must be >= 1, got {max_ratio}")
        if progress_z < 0:
            raise ValueError(f"progress_z must be >= 0, got {progress_z}")
        self.target, self.gain, self.cold_trust, self.max_ratio = target, gain, cold_trust, max_ratio
        self.progress_z = progress_z

    def scores(self, signals: Signals) -> np.ndarray:
        p = np.nan_to_num(signals.success, nan=0.0)
        room = np.clip(self.target - p, 0.0, None)
        slope = np.nan_to_num(signals.success_slope)
        if self.progress_z > 0:  # an inf se (no trend yet) leaves no progress to read
            slope = slope - self.progress_z * signals.success_slope_se
        progress = np.clip(slope, 0.0, None) * signals.window
        trust = np.where(signals.cold, self.cold_trust, 1.0)
        return room * (trust + self.gain * progress)

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        return bounded_ratio(normalise(self.scores(signals) + 1e-12), self.max_ratio)


def bounded_ratio(w: np.ndarray, max_ratio: float) -> np.ndarray:
    """``w`` with every share at least the largest over ``max_ratio``, renormalised.

    Raising the small shares lowers the largest, so the bound is found by bisection on the lower
    limit m: the weights max(w, m), renormalised, whose smallest is exactly their largest / ratio.
    """
    if len(w) < 2 or w.max() <= w.min() * max_ratio:
        return w
    lo, hi = 0.0, float(w.max())
    for _ in range(60):
        m = 0.5 * (lo + hi)
        v = np.maximum(w, m)
        if v.max() > v.min() * max_ratio:
            lo = m
        else:
            hi = m
    v = np.maximum(w, hi)
    return v / v.sum()
