"""Stateless policies: uniform, fixed, prioritized, learnability."""
from __future__ import annotations

import numpy as np

from curriculum.policies.base import MixingPolicy, domain_index, normalise
from curriculum.signals import Signals


class UniformPolicy(MixingPolicy):
    """Equal weight for every domain: the baseline every adaptive policy must beat.

    DataFlex-RL found adaptive mixers within seed noise of uniform at 3 domains and 300 steps.
    """

    name = "uniform"


class FixedPolicy(MixingPolicy):
    """User-given weights by domain name; domains not named get ``default``. Normalised to 1."""

    name = "fixed"

    def __init__(self, domains: list[str], seed: int = 0, weights: dict[str, float] | None = None,
                 default: float = 0.0) -> None:
        super().__init__(domains, seed)
        given = domain_index(self.domains, weights or {}, "fixed weights")
        w = np.full(self.n, float(default))
        for i, value in given.items():
            w[i] = value
        if (w < 0).any() or w.sum() <= 0:
            raise ValueError("fixed weights must be >= 0 and not all zero (set `default` for unnamed domains)")
        self._w = w / w.sum()

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        return self._w.copy()


class PrioritizedPolicy(MixingPolicy):
    """Weight ∝ 1 − windowed success: more of what the model still fails.

    Source: Kimi k1.5 (arXiv 2501.12599), which prioritises problems by failure rate. Departures:
    applied to domains rather than single problems; a domain unseen in the window counts as
    success ``unseen_success`` (0 by default, i.e. top priority, so new domains get visited);
    ``eps`` keeps solved domains from dropping to exactly zero before the floor.
    """

    name = "prioritized"

    def __init__(self, domains: list[str], seed: int = 0, unseen_success: float = 0.0,
                 eps: float = 1e-3) -> None:
        super().__init__(domains, seed)
        self.unseen_success, self.eps = unseen_success, eps

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        p = np.where(np.isnan(signals.success), self.unseen_success, signals.success)
        return normalise(1.0 - p + self.eps)


class LearnabilityPolicy(MixingPolicy):
    """Weight ∝ p(1 − p) on windowed success p: most weight where outcomes are most uncertain.

    Source: LILO (arXiv 2502.12272), which scores each prompt by p(1 − p) and reports 1.5–3.3×
    fewer training steps. Departures: scored per domain over the signals window instead of per
    prompt; a domain unseen in the window counts as p = 0.5 (the highest score), so it is
    (re)visited; ``eps`` keeps fully solved / fully failed domains at a tiny, non-zero weight. Its
    default configuration adds a floor (see ``conf/policy/learnability.yaml``) because p(1 − p)
    alone never revisits a mastered domain and forgetting would go unnoticed.
    """

    name = "learnability"

    def __init__(self, domains: list[str], seed: int = 0, unseen_success: float = 0.5,
                 eps: float = 1e-6) -> None:
        super().__init__(domains, seed)
        self.unseen_success, self.eps = unseen_success, eps

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        p = np.where(np.isnan(signals.success), self.unseen_success, signals.success)
        return normalise(p * (1.0 - p) + self.eps)
