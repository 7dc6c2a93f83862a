"""Adaptive policies that learn across steps: DUMP, SEC, Thompson, TSCL, EXP3.

Each treats a domain as an arm. The reward of an arm is a learnability signal — the mean
|advantage| of its completions (with 0/1 rewards and std-normalised groups this is 2·sqrt(p(1−p)),
zero for all-correct or all-wrong groups; tests/test_losses.py checks it) — or, for TSCL, the success trend.
"""
from __future__ import annotations

import numpy as np

from curriculum.policies.base import MixingPolicy, normalise, softmax
from curriculum.signals import Signals


def _last_mean_abs_adv(signals: Signals) -> tuple[np.ndarray, np.ndarray]:
    """(mask of domains with attempts in the latest step, their mean |A| in that step)."""
    seen = signals.last.attempts > 0
    r = np.zeros(signals.n_domains)
    r[seen] = signals.last.abs_adv_sum[seen] / signals.last.attempts[seen]
    return seen, r


class DumpPolicy(MixingPolicy):
    """UCB on windowed mean |A|: score_d = mean|A|_d + c·sqrt(2 ln(N + 1) / (n_d + 1)); softmax(score/τ).

    Source: DUMP (arXiv 2504.09710), window 300, τ = 0.1. n_d counts the groups (prompts) drawn
    from domain d so far and N their total. Departures: the window is in steps (the shared signals
    window), not the last 300 advantages of a domain; a domain with nothing in the window scores
    mean|A| = 0 plus its bonus, which is largest for domains never tried — so they come first.
    """

    name = "dump"

    def __init__(self, domains: list[str], seed: int = 0, c: float = 1.0, temperature: float = 0.1) -> None:
        super().__init__(domains, seed)
        self.c, self.temperature = c, temperature

    def scores(self, signals: Signals) -> np.ndarray:
        n_d = signals.groups
        bonus = self.c * np.sqrt(2.0 * np.log(n_d.sum() + 1.0) / (n_d + 1.0))
        return np.nan_to_num(signals.mean_abs_adv) + bonus

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        return softmax(self.scores(signals), self.temperature)


class SecPolicy(MixingPolicy):
    """Q_d ← α·r_d + (1 − α)·Q_d with r_d the step's mean |A| of domain d; weights softmax(Q/τ).

    Source: Self-Evolving Curriculum (arXiv 2505.14970), α = 0.5, τ in 0.2–1.0. Departures: SEC
    picks one arm per batch and updates that arm; here every domain with completions in the step
    is updated with its own mean |A|. Q starts at ``initial_q`` (0, as in SEC).
    """

    name = "sec"

    def __init__(self, domains: list[str], seed: int = 0, alpha: float = 0.5, temperature: float = 0.5,
                 initial_q: float = 0.0) -> None:
        super().__init__(domains, seed)
        self.alpha, self.temperature = alpha, temperature
        self.q = np.full(self.n, float(initial_q))

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        return softmax(self.q, self.temperature)

    def update(self, signals: Signals, step: int, used: np.ndarray) -> None:
        seen, r = _last_mean_abs_adv(signals)
        self.q[seen] += self.alpha * (r[seen] - self.q[seen])

    def state_dict(self) -> dict:
        return {"q": self.q.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.q = np.asarray(state["q"], dtype=float)


class ThompsonPolicy(MixingPolicy):
    """Thompson sampling on utility u_d = (1 + normalised reward slope_d)·mean|A|_d.

    Source: the PAC-style Thompson mixer (Alibaba, 2026), which beat DUMP, SEC and
    random on math + code + logic. Each arm keeps a Gaussian posterior (mean, variance) updated
    by a Kalman step with observation noise ``obs_var`` whenever the arm has completions; an arm
    that is not observed has its variance inflated by ``inflation`` per step (up to
    ``prior_var``), so a stale arm's draws spread out until it wins one and is revisited. The
    slope is normalised by the largest |slope| across domains, so 1 + slope lies in [0, 2].
    Weights are the probability of being the argmax, estimated from ``draws`` posterior samples
    (departure: the paper samples one arm per batch; a batch here mixes many).
    """

    name = "thompson"

    def __init__(self, domains: list[str], seed: int = 0, prior_mean: float = 0.5, prior_var: float = 0.25,
                 obs_var: float = 0.05, inflation: float = 0.01, draws: int = 32) -> None:
        super().__init__(domains, seed)
        self.prior_var, self.obs_var, self.inflation, self.draws = prior_var, obs_var, inflation, draws
        self.mean = np.full(self.n, float(prior_mean))
        self.var = np.full(self.n, float(prior_var))

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        # Only arms whose 6-sigma upper bound reaches the best 6-sigma lower bound can win a draw
        # (any other wins with probability < 1e-9), so with thousands of domains most draws are
        # skipped. float32 draws: half the cost, and ties are as unlikely as they need to be.
        sd = np.sqrt(self.var)
        contenders = np.nonzero(self.mean + 6 * sd >= (self.mean - 6 * sd).max())[0]
        samples = self.rng(step).standard_normal((self.draws, len(contenders)), dtype=np.float32)
        samples *= sd[contenders].astype(np.float32)  # in place: mean + sd * noise, no temporaries
        samples += self.mean[contenders].astype(np.float32)
        wins = np.bincount(contenders[samples.argmax(axis=1)], minlength=self.n)
        return wins / self.draws

    def utility(self, signals: Signals) -> tuple[np.ndarray, np.ndarray]:
        seen, abs_adv = _last_mean_abs_adv(signals)
        slope = signals.reward_slope
        scale = np.abs(slope).max()
        norm = slope / scale if scale > 0 else np.zeros(self.n)
        return seen, (1.0 + norm) * abs_adv

    def update(self, signals: Signals, step: int, used: np.ndarray) -> None:
        seen, u = self.utility(signals)
        gain = self.var[seen] / (self.var[seen] + self.obs_var)
        self.mean[seen] += gain * (u[seen] - self.mean[seen])
        self.var[seen] *= 1.0 - gain
        stale = ~seen
        self.var[stale] = np.minimum(self.var[stale] + self.inflation, self.prior_var)

    def state_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "var": self.var.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.mean = np.asarray(state["mean"], dtype=float)
        self.var = np.asarray(state["var"], dtype=float)


class TsclPolicy(MixingPolicy):
    """Learning progress: weight by |slope| of windowed success (a drop counts as much as a gain).

    Source: Teacher-Student Curriculum Learning (arXiv 1707.00183), "window" variant: the slope of
    recent scores, in absolute value so that forgetting pulls a domain back in. ``mode`` is
    ``boltzmann`` (softmax(|slope| / τ)) or ``egreedy`` (1 − ε on the steepest domain, ε spread
    evenly). Departure: |slope| is divided by its largest value across domains, so τ does not
    depend on how fast success moves per step; with no trend anywhere the weights are uniform.
    """

    name = "tscl"

    def __init__(self, domains: list[str], seed: int = 0, mode: str = "boltzmann", temperature: float = 0.2,
                 epsilon: float = 0.1) -> None:
        super().__init__(domains, seed)
        if mode not in ("boltzmann", "egreedy"):
            raise ValueError(f"tscl mode must be 'boltzmann' or 'egreedy', got {mode!r}")
        self.mode, self.temperature, self.epsilon = mode, temperature, epsilon

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        progress = np.abs(signals.success_slope)
        top = progress.max()
        if top <= 0:
            return np.full(self.n, 1.0 / self.n)
        progress = progress / top
        if self.mode == "boltzmann":
            return softmax(progress, self.temperature)
        best = progress >= 1.0 - 1e-12  # ties share the greedy mass
        return (1.0 - self.epsilon) * best / best.sum() + self.epsilon / self.n


class Exp3Policy(MixingPolicy):
    """Exponential weights with decaying exploration ε_t = min(1/K, sqrt(ln K / (K·t))).

    Source: Online Data Mixing (arXiv 2312.02406): π = (1 − K·ε_t)·softmax(log w) + ε_t, and
    log w_d += ε_t · r̂_d with the importance-weighted reward r̂_d = r_d / P(d observed). ODM's
    reward is the training loss of the sampled domain; here it is the step's mean |A|.
    Departure: ODM samples one domain per batch, so P(d observed) = π_d; a batch here holds P
    prompts, so P(d observed) = 1 − (1 − π_d)^P, which is π_d when P = 1 and keeps domains that
    appear in every batch from being inflated as if they were rare.
    """

    name = "exp3"

    def __init__(self, domains: list[str], seed: int = 0) -> None:
        super().__init__(domains, seed)
        self.log_w = np.zeros(self.n)
        self.t = 1  # rounds so far, counting the one being planned

    def exploration(self, t: int | None = None) -> float:
        k, t = self.n, self.t if t is None else t
        return min(1.0 / k, float(np.sqrt(np.log(k) / (k * t)))) if k > 1 else 0.0

    def weights(self, signals: Signals, step: int) -> np.ndarray:
        eps = self.exploration()
        return (1.0 - self.n * eps) * softmax(self.log_w, 1.0) + eps

    def update(self, signals: Signals, step: int, used: np.ndarray) -> None:
        seen, r = _last_mean_abs_adv(signals)
        prompts = max(float(signals.last.groups.sum()), 1.0)
        pi = normalise(used)
        observed = 1.0 - (1.0 - pi) ** prompts
        gain = np.zeros(self.n)
        gain[seen] = r[seen] / np.maximum(observed[seen], 1e-12)
        self.log_w += self.exploration() * gain
        self.log_w -= self.log_w.max()  # only differences matter; keeps exp() in range
        self.t += 1

    def state_dict(self) -> dict:
        return {"log_w": self.log_w.tolist(), "t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.log_w = np.asarray(state["log_w"], dtype=float)
        self.t = int(state["t"])
