"""Typed configuration of the curriculum: mixing policy, difficulty, prompt selection, store (docs/configuration.md).

Hydra composes ``conf/policy/<type>.yaml``, ``conf/difficulty/<type>.yaml``,
``conf/selection/<mode>.yaml`` and ``conf/store/*.yaml`` under the keys ``policy``, ``difficulty``,
``selection`` and ``store``; the plain container is validated here. Every model forbids unknown
keys and the unions are discriminated by ``type``, so a typo fails in one line naming the field.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union, get_args

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from curriculum.difficulty import CONTROLLERS, DifficultyController, LevelTable
from curriculum.policies import POLICIES, MixingPolicy, Wrapped
from curriculum.store_urls import default_store_url
from domains.config import StrictModel as _Strict
from domains.config import describe_error as describe_validation_error


# -- mixing policies --------------------------------------------------------------------------------
class _PolicyBase(_Strict):
    """Options every policy takes: the signals it reads and the wrapper around its weights."""

    window: int = Field(10, ge=2, description="steps in the signals window (success, |A|, slopes)")
    ema_alpha: float = Field(0.1, gt=0, le=1, description="rate of the EMA of per-step success")
    warmup_steps: int = Field(0, ge=0, description="uniform weights for this many first steps")
    floor: float = Field(0.0, ge=0, le=1, description="minimum share per domain, as a fraction of 1/D")
    cap: float | None = Field(None, gt=0, le=1, description="maximum share of any one domain")
    smoothing: float = Field(0.0, ge=0, lt=1, description="share of the previous step's weights kept")
    pinned: dict[str, float] = Field(default_factory=dict, description="domain -> fixed share")


class UniformConfig(_PolicyBase):
    type: Literal["uniform"] = "uniform"


class FixedConfig(_PolicyBase):
    type: Literal["fixed"] = "fixed"
    weights: dict[str, float] = Field(default_factory=dict)
    default: float = Field(1.0, ge=0, description="weight of domains not named in `weights`")


class PrioritizedConfig(_PolicyBase):
    type: Literal["prioritized"] = "prioritized"
    unseen_success: float = Field(0.0, ge=0, le=1)
    eps: float = Field(1e-3, ge=0)


class LearnabilityConfig(_PolicyBase):
    type: Literal["learnability"] = "learnability"
    unseen_success: float = Field(0.5, ge=0, le=1)
    eps: float = Field(1e-6, ge=0)
    # p(1-p) gives mastered domains nothing, so forgetting would go unseen: keep 10% of the batch
    # as floors (each domain >= 0.1/D; at 3 domains and 64 prompts, ~2 prompts a step each).
    floor: float = Field(0.1, ge=0, le=1)


class DumpConfig(_PolicyBase):
    type: Literal["dump"] = "dump"
    c: float = Field(1.0, ge=0, description="weight of the UCB exploration bonus")
    temperature: float = Field(0.1, gt=0)


class SecConfig(_PolicyBase):
    type: Literal["sec"] = "sec"
    alpha: float = Field(0.5, gt=0, le=1)
    temperature: float = Field(0.5, gt=0)
    initial_q: float = 0.0


class ThompsonConfig(_PolicyBase):
    type: Literal["thompson"] = "thompson"
    prior_mean: float = 0.5
    prior_var: float = Field(0.25, gt=0)
    obs_var: float = Field(0.05, gt=0)
    inflation: float = Field(0.01, ge=0, description="variance added per step an arm is not observed")
    draws: int = Field(32, ge=1, description="posterior samples per step to estimate P(best)")
    # Weights are argmax frequencies over a few draws, so most domains get exactly 0 without one.
    floor: float = Field(0.1, ge=0, le=1)


class TsclConfig(_PolicyBase):
    type: Literal["tscl"] = "tscl"
    mode: Literal["boltzmann", "egreedy"] = "boltzmann"
    temperature: float = Field(0.2, gt=0)
    epsilon: float = Field(0.1, ge=0, le=1)


class Exp3Config(_PolicyBase):
    type: Literal["exp3"] = "exp3"


class HeadroomConfig(_PolicyBase):
    type: Literal["headroom"] = "headroom"
    target: float = Field(0.9, gt=0, le=1, description="success a domain's room is measured up to")
    gain: float = Field(10.0, ge=0, description="weight of measured progress (success gained over the window)")
    cold_trust: float = Field(0.2, ge=0, le=1, description="how much of a domain's room counts before its first success")
    max_ratio: float = Field(4.0, ge=1, description="largest share over smallest")
    progress_z: float = Field(0.0, ge=0, description="standard errors of sampling noise taken off the measured progress")


PolicyConfig = Annotated[
    Union[UniformConfig, FixedConfig, PrioritizedConfig, LearnabilityConfig, DumpConfig, SecConfig,
          ThompsonConfig, TsclConfig, Exp3Config, HeadroomConfig],
    Field(discriminator="type"),
]

_WRAPPER_KEYS = {"warmup_steps", "floor", "cap", "smoothing", "pinned"}
_SIGNAL_KEYS = {"window", "ema_alpha"}


def build_policy(cfg: PolicyConfig, domain_names: list[str], seed: int = 0) -> MixingPolicy:
    """The policy of ``cfg`` over ``domain_names``, inside its wrapper (warm-up, pins, floor, cap, smoothing)."""
    params = cfg.model_dump(exclude=_WRAPPER_KEYS | _SIGNAL_KEYS | {"type"})
    inner = POLICIES[cfg.type](list(domain_names), seed, **params)
    return Wrapped(inner, warmup_steps=cfg.warmup_steps, floor=cfg.floor, cap=cfg.cap,
                   smoothing=cfg.smoothing, pinned=cfg.pinned)


# -- difficulty -------------------------------------------------------------------------------------
class _DifficultyBase(_Strict):
    replay_share: float = Field(0.0, ge=0, lt=1, description="share of prompts from the level below")
    start_levels: dict[str, int] = Field(default_factory=dict, description="domain -> starting level")


class FixedDifficultyConfig(_DifficultyBase):
    type: Literal["fixed"] = "fixed"
    level: int | None = Field(None, description="level for every domain; None: each domain's easiest")


class ThresholdDifficultyConfig(_DifficultyBase):
    type: Literal["threshold"] = "threshold"
    raise_above: float = Field(0.7, ge=0, le=1)
    lower_below: float = Field(0.2, ge=0, le=1)
    window: int = Field(32, ge=1, description="attempts at the current level before deciding")

    @model_validator(mode="after")
    def _lower_below_raise(self) -> "ThresholdDifficultyConfig":
        if self.lower_below >= self.raise_above:
            raise ValueError(f"lower_below ({self.lower_below}) must be below raise_above ({self.raise_above})")
        return self


class TargetDifficultyConfig(_DifficultyBase):
    type: Literal["target"] = "target"
    target: float = Field(0.5, ge=0, le=1)
    eta: float = Field(0.5, gt=0, description="largest move per step, in levels")
    alpha: float = Field(2.0, gt=0)


class LearnabilityDifficultyConfig(_Strict):
    type: Literal["learnability"] = "learnability"
    floor: float = Field(0.2, ge=0, le=1, description="share of each domain's prompts spread evenly over its levels")
    window: int = Field(32, ge=1, description="recent attempts per level behind its success estimate")


DifficultyConfig = Annotated[
    Union[FixedDifficultyConfig, ThresholdDifficultyConfig, TargetDifficultyConfig, LearnabilityDifficultyConfig],
    Field(discriminator="type"),
]


def build_difficulty(cfg: DifficultyConfig, domain_levels: dict[str, tuple[int, ...]]) -> DifficultyController:
    params = cfg.model_dump(exclude={"type"})
    return CONTROLLERS[cfg.type](LevelTable(domain_levels), **params)


def check_against_domains(policy: PolicyConfig, difficulty: DifficultyConfig,
                          domain_levels: dict[str, tuple[int, ...]]) -> None:
    """Settings that name domains or levels (pinned shares, fixed weights, start levels) must fit
    the run's domains; a ValueError names the section, so a run can refuse them before any work."""
    try:
        build_policy(policy, list(domain_levels))
    except ValueError as exc:
        raise ValueError(f"policy: {exc}") from None
    try:
        build_difficulty(difficulty, domain_levels)
    except ValueError as exc:
        raise ValueError(f"difficulty: {exc}") from None


# -- cold start ------------------------------------------------------------------------------------
class ColdStartConfig(_Strict):
    """Help for domains with no success yet, whatever the policy (``curriculum/cold_start.py``).

    A domain with no success in the signals window is *cold*. Every policy reads signals that are
    zero there (p(1 - p), |A|, slopes), so without help a cold domain sinks to the floor and never
    earns the first successes that would make it learnable. Everything here is off by default.
    """

    probe_rate: float = Field(0.0, ge=0, lt=1, description="success rate a cold domain's probe must be able to see: "
                                                           "about 3/p rollouts a window; 0: no probe")
    probe_max_share: float = Field(0.5, gt=0, le=1, description="largest share of a batch all probes together take")
    probe_patience: int = Field(3, ge=1, description="windows a domain is probed in a row without a success")
    reprobe_every: int = Field(50, ge=1, description="after that, steps between probes (one window each)")
    fall_to_easiest: bool = Field(False, description="a domain at zero success drops to its easiest level at once")
    fall_after: int = Field(8, ge=1, description="attempts in the window, all failed, before it drops")
    hint_below: float = Field(0.0, ge=0, le=1, description="windowed success under which training tasks may carry "
                                                          "a hint; 0: no hints")
    hint_share: float = Field(0.5, ge=0, le=1, description="share of a domain's tasks hinted at zero success, "
                                                          "falling to 0 at hint_below")
    hint_form: Literal["words", "lead"] = Field("words", description="how a hint is shown: words after the "
                                                "question, or (tool episodes) the first call written as the "
                                                "assistant's first turn for half of each group, and trained on")


# -- store -----------------------------------------------------------------------------------------
class StoreConfig(_Strict):
    url: str | None = Field(None, description="SQLAlchemy URL; None: SQLite at <run dir>/palestra.db")


# -- prompt selection (within a domain) ---------------------------------------------------------------
SelectionMode = Literal["streak", "beta", "retire"]


class SelectionConfig(_Strict):
    """Prompt-level selection inside a domain (``curriculum.prompts.PromptSelector``).

    ``mode`` names the rules to combine: ``none`` (or ``[]``), one name, or a list such as
    ``[beta, retire]``. ``streak`` and ``retire`` filter the candidates, ``beta`` ranks them.
    """

    mode: tuple[SelectionMode, ...] = Field((), description="rules in use: streak, beta, retire; none: first n")
    candidates_factor: int = Field(4, ge=1, description="the trainer draws n * factor candidates per (domain, level)")
    domains: list[str] | None = Field(None, description="domains whose prompts repeat (dataset-backed); None: all")
    # streak (GRESO-style pre-rollout skipping)
    streak_threshold: int = Field(2, ge=1, description="all-correct/all-wrong groups in a row before skipping")
    skip_prob: float = Field(0.5, ge=0, lt=1, description="skip chance at the threshold; grows with the streak")
    skip_decay: float = Field(0.99, gt=0, le=1, description="skip chance x decay per step since the last attempt")
    # beta (MoPPS-style Thompson selection)
    target: float = Field(0.5, gt=0, lt=1, description="success rate the Thompson draws should be near")
    discount: float = Field(1.0, gt=0, le=1, description="old evidence kept per observed step (MoPPS lambda)")
    # retire (ScaleRL-style)
    retire_threshold: float = Field(0.9, gt=0, le=1, description="success rate at which a prompt retires")
    retire_min_attempts: int = Field(16, ge=1, description="attempts before a prompt may retire")
    replay_share: float = Field(0.05, ge=0, lt=1, description="share of the picks kept for retired prompts")

    @field_validator("mode", mode="before")
    @classmethod
    def _modes(cls, value):
        if value is None or value == "none":
            return ()
        if isinstance(value, str):
            return (value,)
        modes = tuple(v for v in value if v != "none")
        if len(set(modes)) != len(modes):
            raise ValueError(f"a mode is named twice in {list(value)}")
        return modes

    @property
    def active(self) -> bool:
        return bool(self.mode)


class CurriculumConfig(_Strict):
    """The three curriculum groups together, as they sit in the composed config."""

    policy: PolicyConfig = Field(default_factory=LearnabilityConfig)
    difficulty: DifficultyConfig = Field(default_factory=ThresholdDifficultyConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)


_POLICY_ADAPTER: TypeAdapter = TypeAdapter(PolicyConfig)
_DIFFICULTY_ADAPTER: TypeAdapter = TypeAdapter(DifficultyConfig)


def parse_policy(data: dict) -> PolicyConfig:
    return _POLICY_ADAPTER.validate_python(data)


def parse_difficulty(data: dict) -> DifficultyConfig:
    return _DIFFICULTY_ADAPTER.validate_python(data)


# -- shared by the Hydra apps (palestra-train, palestra-sim) -----------------------------------------
def describe_error(exc: ValidationError) -> str:
    """``domains.config.describe_error`` for a config that holds a policy or a difficulty section:
    pydantic puts the member's tag (e.g. "uniform") into the path of a union member's error."""
    return describe_validation_error(exc, hide=_UNION_TAGS)


def _type_tags(union: object) -> set[str]:
    members = get_args(get_args(union)[0])
    return {tag for member in members for tag in get_args(member.model_fields["type"].annotation)}


_UNION_TAGS = _type_tags(PolicyConfig) | _type_tags(DifficultyConfig)


def fill_run_defaults(raw: dict, hydra_cfg: object | None, default_name: str) -> dict:
    """In a Hydra multirun every job shares one sweep id (the ``sweep_id`` key, else the sweep
    folder's name) and, unless ``store.url`` is given, one SQLite file in the sweep folder. A
    single run keeps its store in its own ``output_dir`` (the apps' default)."""
    if hydra_cfg is None:
        return raw
    from hydra.types import RunMode

    if hydra_cfg.mode != RunMode.MULTIRUN:
        return raw
    sweep_dir = Path(hydra_cfg.sweep.dir)
    if not raw.get("sweep_id"):
        raw["sweep_id"] = f"{raw.get('name', default_name)}/{sweep_dir.name}"
    store = raw.setdefault("store", {})
    if not store.get("url"):
        sweep_dir.mkdir(parents=True, exist_ok=True)
        store["url"] = default_store_url(sweep_dir)
    return raw
