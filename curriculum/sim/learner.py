"""A synthetic learner over many domains: the part of training the simulator replaces.

Model. Domain d has a skill θ_d; a prompt of level ℓ is solved with probability
σ(a_d·(θ_d − b_ℓ)), b_ℓ = level_step·ℓ. A step draws G Bernoulli outcomes per planned prompt,
computes group advantages exactly as the trainer does ((r − mean) / (std + 1e-4), population std),
and moves θ by a learning signal that grows with the group's learnability:

    direct_d = Σ_groups lr_d · reuse_d · unlock_d · mean|A_g|      (mean|A| = 2·sqrt(p̂(1 − p̂)))
    θ ← θ + direct + T·direct                                      (T: off-diagonal transfer)

so an all-correct or all-wrong group teaches nothing, as in GRPO. Effects, each on a share of the
domains (``ScenarioConfig``):

- transfer: positive inside clusters of related domains, negative to a few unrelated partners;
- forgetting: a domain not practised in a step decays toward its starting skill;
- unlearnable: θ never moves, yet the group outcomes look learnable (p ≈ 0.5);
- noisy rewards: the verifier's reward is a coin flip, unrelated to the (true) outcome, so the
  trainer sees high |A| and learns nothing from it;
- prerequisites: learning is gated by σ(3·(θ_q − unlock_theta)) of a foundation domain q;
- uneven sizes: a domain has n_d distinct prompts; reusing them yields less,
  reuse_d = 1 / sqrt(1 + groups drawn / n_d);
- leads (``cold_start.hint_form=lead``): in a led group the first G//2 members, whose opening the
  trainer wrote, succeed with probability max(p, lead_success_d). The group learns from all G
  (the update trains on the written tokens), so the contrast between the halves moves θ even at
  p ≈ 0; the scheduler is told only the other half, as the trainer tells it.

A fitted scenario (``sim.fitted``, written by ``fit.py`` from a real run) sets each domain's name,
θ0, lr and slope instead of drawing them, and may give a domain fewer levels than the scenario's
(its easiest ones), as a reasoning-gym dataset held to one level has.

Held-out success per domain is the model's own mean over its levels of σ(a_d(θ_d − b_ℓ)) — no
sampling noise — which is what a fixed, large held-out set would measure.

Departures from real training, on purpose: domains do not compete for model capacity except
through negative transfer, and a step's learning does not depend on the level beyond what the
level does to p̂ (a hard group at p̂ = 0.5 teaches as much as an easy one).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from curriculum.sim.config import ScenarioConfig
from domains.api import led_share

ADV_EPS = 1e-4  # the trainer's group_advantages epsilon
KINDS = ("plain", "unlearnable", "noisy", "locked")


@dataclass
class World:
    """The fixed parameters of one scenario draw (arrays over D domains)."""

    names: list[str]
    kind: np.ndarray  # [D] index into KINDS
    slope: np.ndarray  # [D] a_d
    theta0: np.ndarray  # [D] starting skill
    lr: np.ndarray  # [D] learning rate (0 for unlearnable and noisy domains)
    forget: np.ndarray  # [D] per-step decay toward theta0 when not practised
    prereq: np.ndarray  # [D] index of the prerequisite domain, -1 for none
    size: np.ndarray  # [D] distinct prompts (inf: unlimited)
    transfer: np.ndarray  # [D, D] float32, transfer[i, j]: gain of i per unit direct gain of j
    b: np.ndarray  # [L] level offsets
    levels: np.ndarray  # [D] how many of them a domain has (its easiest ones)
    lead_success: np.ndarray  # [D] success of a led member (0: the domain has no lead)
    unlock_theta: float = 2.0  # prerequisite skill at which a locked domain learns at half speed

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def noisy(self) -> np.ndarray:
        return self.kind == KINDS.index("noisy")

    @property
    def frozen(self) -> np.ndarray:
        return self.kind == KINDS.index("unlearnable")


def build_world(cfg: ScenarioConfig, seed: int) -> World:
    """Draw a world from the scenario; the same (scenario, seed) always gives the same world."""
    rng = np.random.default_rng([seed, 0x5157])  # "SIW": a stream of its own, apart from outcomes
    n = cfg.domains
    width = len(str(n - 1))
    names = [f"d{i:0{width}d}" for i in range(n)]
    kind = _draw_kinds(cfg, rng)
    theta0 = rng.normal(cfg.theta0_mean, cfg.theta0_std, n)
    theta0[kind == KINDS.index("locked")] -= 1.5  # locked domains start below their first level
    lr = cfg.lr * np.exp(rng.normal(0.0, cfg.lr_spread, n))
    lr[(kind == KINDS.index("unlearnable")) | (kind == KINDS.index("noisy"))] = 0.0
    forget = np.zeros(n)
    forgets = rng.random(n) < cfg.forgetting_share
    forget[forgets] = rng.uniform(0.2, 1.0, forgets.sum()) * cfg.forgetting_rate
    slope = rng.uniform(cfg.slope_min, cfg.slope_max, n)
    lead_success = np.full(n, cfg.lead_success)
    levels = np.full(n, cfg.levels)
    if cfg.fitted:  # drawn above all the same, so the other draws stay those of an unfitted world
        names = [d.name for d in cfg.fitted]
        theta0, lr, slope, lead_success = (np.array([getattr(d, key) for d in cfg.fitted], dtype=float)
                                           for key in ("theta0", "lr", "slope", "lead_success"))
        levels = np.array([d.levels or cfg.levels for d in cfg.fitted])
    return World(names=names, kind=kind, slope=slope, theta0=theta0, lr=lr, forget=forget,
                 prereq=_prerequisites(cfg, kind), size=_sizes(cfg, rng), transfer=_transfer(cfg, rng),
                 b=cfg.level_step * np.arange(cfg.levels, dtype=float), levels=levels, lead_success=lead_success,
                 unlock_theta=cfg.unlock_theta)


def _draw_kinds(cfg: ScenarioConfig, rng: np.random.Generator) -> np.ndarray:
    """Assign effects to domains; the first domain of each cluster stays plain (a foundation)."""
    n = cfg.domains
    kind = np.zeros(n, dtype=np.int64)
    candidates = np.array([i for i in range(n) if i % cfg.cluster_size != 0], dtype=np.int64)
    order = rng.permutation(candidates)
    start = 0
    for name, share in (("unlearnable", cfg.unlearnable_share), ("noisy", cfg.noisy_share),
                        ("locked", cfg.prerequisite_share)):
        count = min(int(round(share * n)), len(order) - start)
        kind[order[start:start + count]] = KINDS.index(name)
        start += count
    return kind


def _prerequisites(cfg: ScenarioConfig, kind: np.ndarray) -> np.ndarray:
    # a locked domain depends on the foundation (first) domain of its cluster
    idx = np.arange(len(kind))
    return np.where(kind == KINDS.index("locked"), idx - idx % cfg.cluster_size, -1)


def _sizes(cfg: ScenarioConfig, rng: np.random.Generator) -> np.ndarray:
    if cfg.size_min <= 0:
        return np.full(cfg.domains, np.inf)
    lo, hi = np.log(cfg.size_min), np.log(max(cfg.size_max, cfg.size_min))
    return np.round(np.exp(rng.uniform(lo, hi, cfg.domains)))


def _transfer(cfg: ScenarioConfig, rng: np.random.Generator) -> np.ndarray:
    """Off-diagonal transfer: positive within clusters, negative to ``negative_pairs`` outsiders."""
    n = cfg.domains
    t = np.zeros((n, n), dtype=np.float32)
    cluster = np.arange(n) // cfg.cluster_size
    same = (cluster[:, None] == cluster[None, :]) & ~np.eye(n, dtype=bool)
    linked = same & (rng.random((n, n)) < cfg.transfer_pos_density)
    t[linked] = rng.uniform(0.0, cfg.transfer_pos, int(linked.sum()))
    if cfg.negative_pairs and cfg.transfer_neg > 0 and n > cfg.cluster_size:
        for j in range(n):  # practising j hurts a few domains of other clusters
            others = np.nonzero(cluster != cluster[j])[0]
            hit = rng.choice(others, size=min(cfg.negative_pairs, len(others)), replace=False)
            t[hit, j] = -rng.uniform(0.0, cfg.transfer_neg, len(hit))
    return t


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def mean_success(slope: np.ndarray, theta: np.ndarray, b: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """[D] held-out success: per domain, the mean of σ(a(θ − b_ℓ)) over its own (easiest) levels."""
    p = sigmoid(slope[:, None] * (theta[:, None] - b[None, :]))
    own = np.arange(len(b))[None, :] < levels[:, None]
    return (p * own).sum(axis=1) / levels


@dataclass
class StepOutcome:
    """One step's rollouts, as arrays over the step's P prompts (groups)."""

    domain: np.ndarray  # [P] domain index
    level: np.ndarray  # [P] level value
    correct: np.ndarray  # [P, G] bool, the true outcome
    reward: np.ndarray  # [P, G] float, what the verifier reported (noise on noisy domains)
    advantage: np.ndarray  # [P, G] group advantages of the reported rewards
    led: np.ndarray  # [P] how many of the row's first members a lead wrote

    def select(self, rows: np.ndarray) -> "StepOutcome":
        return StepOutcome(self.domain[rows], self.level[rows], self.correct[rows], self.reward[rows],
                           self.advantage[rows], self.led[rows])

    @staticmethod
    def concat(parts: list["StepOutcome"]) -> "StepOutcome":
        return StepOutcome(*(np.concatenate([getattr(p, f) for p in parts])
                             for f in ("domain", "level", "correct", "reward", "advantage", "led")))


class Learner:
    """The skills θ of a world, moved by the groups each step trains on."""

    def __init__(self, world: World, seed: int, group_size: int) -> None:
        self.world, self.group_size = world, int(group_size)
        self.theta = world.theta0.copy()
        self.groups_drawn = np.zeros(world.n)
        self.rng = np.random.default_rng([seed, 0x5153])  # "SIS": outcome draws

    def success(self, domain: np.ndarray, level: np.ndarray) -> np.ndarray:
        w = self.world
        return sigmoid(w.slope[domain] * (self.theta[domain] - w.b[level]))

    def heldout(self) -> np.ndarray:
        """[D] held-out success: mean over a domain's levels of the model's success probability."""
        w = self.world
        return mean_success(w.slope, self.theta, w.b, w.levels)

    def rollout(self, domain: np.ndarray, level: np.ndarray, led: np.ndarray | None = None) -> StepOutcome:
        """G outcomes for each of P prompts (domain[i], level index[i]); ``led`` [P] bool marks the
        prompts drawn led, whose first G//2 members a lead opens (a domain without one plays plain)."""
        p = self.success(domain, level)
        shape = (len(domain), self.group_size)
        members = np.zeros(len(domain), dtype=np.int64)
        p = p[:, None]
        if led is not None:
            members = np.where(led & (self.world.lead_success[domain] > 0), led_share(self.group_size), 0)
            p = np.where(np.arange(self.group_size)[None, :] < members[:, None],
                         np.maximum(p, self.world.lead_success[domain][:, None]), p)
        correct = self.rng.random(shape) < p
        coin = self.rng.random(shape) < 0.5
        reward = np.where(self.world.noisy[domain][:, None], coin, correct).astype(float)
        centred = reward - reward.mean(axis=1, keepdims=True)
        advantage = centred / (reward.std(axis=1, keepdims=True) + ADV_EPS)
        return StepOutcome(domain, level, correct, reward, advantage, members)

    def learn(self, out: StepOutcome) -> None:
        """Move θ by the step's learning signal, then let unpractised domains forget."""
        w = self.world
        n = w.n
        abs_adv = np.abs(out.advantage).mean(axis=1)  # [P] the group's learnability
        reuse = 1.0 / np.sqrt(1.0 + self.groups_drawn[out.domain] / w.size[out.domain])
        gate = np.ones(len(out.domain))
        locked = w.prereq[out.domain] >= 0
        gate[locked] = sigmoid(3.0 * (self.theta[w.prereq[out.domain[locked]]] - w.unlock_theta))
        direct = np.bincount(out.domain, weights=w.lr[out.domain] * reuse * gate * abs_adv, minlength=n)
        practised = np.unique(out.domain)
        delta = direct + w.transfer[:, practised] @ direct[practised]  # only practised columns move θ
        delta[w.frozen] = 0.0
        self.theta += delta
        idle = np.ones(n, dtype=bool)
        idle[practised] = False
        self.theta[idle] -= w.forget[idle] * (self.theta[idle] - w.theta0[idle])
        np.add.at(self.groups_drawn, out.domain, 1.0)

    def state(self) -> dict:
        return {"theta": self.theta.tolist(), "groups_drawn": self.groups_drawn.tolist()}
