"""Cold start: what the scheduler does for domains with no success yet, under every policy.

A domain is *cold* while its signals window holds no success (and also when the window holds no
attempts at all: a domain the policy dropped is cold again once its window empties). Three helps,
each off by default (``ColdStartConfig``):

- **A probe budget.** Seeing one success at rate p takes about 3/p rollouts (the chance of none in
  3/p tries is e^-3, 5%). A cold domain's share of each plan is raised to that many rollouts per
  window, spread over the window's steps, for ``probe_patience`` windows; a domain that stays cold
  that long is given up on and probed again for one window every ``reprobe_every`` steps. All
  probes together take at most ``probe_max_share`` of a batch. Once a domain succeeds, its policy's
  own signal decides its share again.
- **A fall to the easiest level.** A cold domain with ``fall_after`` failed attempts in its window
  goes to its easiest level at once, instead of one level per controller window.
- **Hints.** A share of a cold or weak domain's training tasks is drawn in its hinted form (the
  domain plugin's ``hint``), falling linearly from ``hint_share`` at zero success to nothing at
  ``hint_below``: the hint is withdrawn as the domain learns. Held-out tasks never carry hints.

Everything here is a function of the recorded signals, so plans stay pure and a rebuilt scheduler
reaches the same state.
"""
from __future__ import annotations

import math

import numpy as np

from curriculum.config import ColdStartConfig
from curriculum.signals import Signals


class ColdStart:
    def __init__(self, cfg: ColdStartConfig, n_domains: int, window: int, prompts_per_step: int,
                 group_size: int) -> None:
        self.cfg, self.window = cfg, int(window)
        # about 3/p rollouts a window, as a share of the window's prompts
        probe_prompts = probes_per_window(cfg.probe_rate) / group_size if cfg.probe_rate > 0 else 0.0
        # at most an equal share: probing a cold domain never costs more than uniform mixing would
        self.probe_share = min(1.0 / n_domains, probe_prompts / (self.window * prompts_per_step))
        self.cold_since = np.full(n_domains, -1, dtype=np.int64)  # first recorded step of the cold spell

    # -- the plan ----------------------------------------------------------------------------------
    def probe_floors(self, signals: Signals, step: int) -> np.ndarray:
        """[D] the share each domain's plan must at least have at ``step``."""
        floors = np.zeros(len(self.cold_since))
        if self.probe_share <= 0:
            return floors
        since = step - np.where(self.cold_since >= 0, self.cold_since, step)
        patient = since < self.cfg.probe_patience * self.window
        reprobe = (since % self.cfg.reprobe_every) < self.window
        probing = signals.cold & (patient | reprobe)
        floors[probing] = self.probe_share
        total = floors.sum()
        return floors * min(1.0, self.cfg.probe_max_share / total) if total > 0 else floors

    def hint_shares(self, signals: Signals) -> np.ndarray:
        """[D] the share of each domain's training tasks to draw hinted."""
        if self.cfg.hint_below <= 0:
            return np.zeros(len(self.cold_since))
        success = np.nan_to_num(signals.success, nan=0.0)
        return self.cfg.hint_share * np.clip(1.0 - success / self.cfg.hint_below, 0.0, 1.0)

    # -- learning ----------------------------------------------------------------------------------
    def update(self, signals: Signals, step: int) -> np.ndarray:
        """Fold in the step just recorded; returns [D] bool, the domains to drop to their easiest level."""
        cold = signals.cold
        self.cold_since = np.where(cold, np.where(self.cold_since >= 0, self.cold_since, step), -1)
        if not self.cfg.fall_to_easiest:
            return np.zeros(len(cold), dtype=bool)
        return cold & (signals.window_attempts >= self.cfg.fall_after)

    def state_dict(self) -> dict:
        return {"cold_since": self.cold_since.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.cold_since = np.asarray(state["cold_since"], dtype=np.int64)


def lift(weights: np.ndarray, floors: np.ndarray) -> np.ndarray:
    """Weights raised to ``floors`` (summing to at most 1), the others scaled down in proportion.

    Scaling the others down can push one of them under its own floor, so this repeats (at most
    once per domain) until every domain below its floor is held at it.
    """
    w = np.asarray(weights, dtype=float)
    held = w < floors
    if not held.any():
        return w  # unchanged to the last bit: no cold start, the plans of before
    for _ in range(len(w)):
        free = 1.0 - floors[held].sum()
        rest = w[~held].sum()
        out = np.where(held, floors, w * (free / rest if rest > 0 else 0.0))
        if rest <= 0:  # every domain held: what is left goes to them evenly
            return out + (1.0 - out.sum()) / len(w)
        newly = ~held & (out < floors - 1e-15)
        if not newly.any():
            return out
        held |= newly
    return out


def probes_per_window(rate: float) -> int:
    """Rollouts that see at least one success at ``rate`` with 95% chance: about 3/rate."""
    return math.ceil(-math.log(0.05) / rate)
