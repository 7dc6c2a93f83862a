"""Typed configuration of the simulator: the scenario (``sim``) and the whole sim app.

Hydra composes ``conf/sim_config.yaml`` (groups ``policy``, ``difficulty``, ``store``, ``sim``);
the plain container is validated here with the same strictness as the trainer's config, so a typo
fails in one line naming the key.
"""
from __future__ import annotations

from typing import Literal


from pydantic import Field, ValidationError, model_validator

from curriculum.compare import DEFAULT_MASTERY
from curriculum.config import ColdStartConfig, DifficultyConfig, PolicyConfig, StoreConfig, describe_error
from curriculum.schema import is_in_memory_sqlite
from domains.config import StrictModel as _Strict


class FittedDomain(_Strict):
    """One domain whose learner is set, not drawn: a scenario fitted to a real run (``fit.py``)."""

    name: str
    theta0: float = Field(description="starting skill")
    lr: float = Field(ge=0, description="theta gain per group at mean |A| = 1")
    slope: float = Field(gt=0, description="a_d")
    lead_success: float = Field(0.0, ge=0, le=1, description="success of a member the trainer's lead wrote "
                                "(0: the domain has no lead)")
    levels: int | None = Field(None, ge=1, description="its difficulty levels, the easiest of the scenario's "
                               "(None: all of them; a reasoning-gym dataset at max_level 1 has one)")


class ScenarioConfig(_Strict):
    """A synthetic world of domains and the learner that trains on it (see ``learner.py``).

    Shares (``*_share``) are fractions of the domains that carry an effect; the rest are plain
    learnable domains. Every draw comes from the run's seed, so paired seeds share one world.
    """

    name: str = "custom"
    domains: int = Field(10, ge=1)
    levels: int = Field(5, ge=1, description="difficulty levels per domain, b_l = level_step * l")
    level_step: float = Field(1.0, gt=0)
    steps: int = Field(500, ge=1)
    prompts_per_step: int = Field(64, ge=1)
    group_size: int = Field(8, ge=2)
    # the learner
    theta0_mean: float = 0.0
    theta0_std: float = Field(0.5, ge=0)
    slope_min: float = Field(1.0, gt=0, description="a_d is drawn uniformly in [slope_min, slope_max]")
    slope_max: float = Field(2.5, gt=0)
    lr: float = Field(0.01, ge=0, description="median theta gain per group at mean |A| = 1")
    lr_spread: float = Field(0.5, ge=0, description="std of log lr across domains")
    # effects
    cluster_size: int = Field(10, ge=2, description="domains per transfer cluster: a plain foundation and the "
                                                    "domains that may depend on it")
    transfer_pos: float = Field(0.15, ge=0, description="largest positive transfer inside a cluster")
    transfer_pos_density: float = Field(0.5, ge=0, le=1, description="share of in-cluster pairs that transfer")
    transfer_neg: float = Field(0.0, ge=0, description="largest negative transfer between clusters")
    negative_pairs: int = Field(0, ge=0, description="negatively coupled partners per domain")
    forgetting_share: float = Field(0.0, ge=0, le=1)
    forgetting_rate: float = Field(0.002, ge=0, lt=1, description="largest per-step decay toward theta0")
    unlearnable_share: float = Field(0.0, ge=0, le=1)
    noisy_share: float = Field(0.0, ge=0, le=1)
    prerequisite_share: float = Field(0.0, ge=0, le=1, description="domains locked behind another domain")
    unlock_theta: float = Field(2.0, description="prerequisite theta at which learning is half unlocked")
    size_min: int = Field(0, ge=0, description="prompts per domain (log-uniform); 0: unlimited")
    size_max: int = Field(0, ge=0)
    # the trainer's dynamic sampling (DAPO): groups whose rewards all agree are left out and
    # replaced by groups drawn in the step's proportions of (domain, level), in up to this many rounds
    refill_rounds: int = Field(0, ge=0, description="dynamic sampling rounds (the trainer's default is 2)")
    refill_from: Literal["plan", "dropped"] = Field("plan", description="refills in the plan's proportions, or "
                                                    "from the (domain, level) of each group left out")
    # cold_start.hint_form=lead: the first half of a led group succeeds at least this often (every
    # drawn domain; a fitted domain has its own). 0: no leads. Hints in words are not modelled
    lead_success: float = Field(0.0, ge=0, le=1, description="success of a member the trainer's lead wrote")
    # domains fitted to a real run: their names, starting skills, rates and slopes replace the drawn
    # ones (the effects above are still drawn, so leave them off); `domains` must count them
    fitted: list[FittedDomain] = Field(default_factory=list)
    # logging
    domains_every: int = Field(10, ge=1, description="log the per-domain held-out vector every k steps")
    mastery: float = Field(DEFAULT_MASTERY, gt=0, le=1, description="held-out success that counts as mastered")

    @model_validator(mode="after")
    def _check(self) -> "ScenarioConfig":
        if self.slope_max < self.slope_min:
            raise ValueError("slope_max must be >= slope_min")
        if self.size_max < self.size_min:
            raise ValueError("size_max must be >= size_min")
        if self.unlearnable_share + self.noisy_share + self.prerequisite_share > 1.0:
            raise ValueError("unlearnable_share + noisy_share + prerequisite_share must be <= 1")
        if self.fitted and len(self.fitted) != self.domains:
            raise ValueError(f"domains is {self.domains} but {len(self.fitted)} domains are fitted")
        deeper = [d.name for d in self.fitted if d.levels is not None and d.levels > self.levels]
        if deeper:
            raise ValueError(f"fitted domain {deeper[0]!r} has more levels than the scenario's {self.levels}")
        return self


class SimAppConfig(_Strict):
    """The composed config of ``palestra-sim``."""

    name: str = "sim"
    seed: int = 0
    sweep_id: str | None = None
    output_dir: str = "outputs/sim"
    write_behind: bool = False
    store_results: bool = Field(False, description="also write one results row per completion (slow, large)")
    sim: ScenarioConfig
    policy: PolicyConfig
    difficulty: DifficultyConfig
    cold_start: ColdStartConfig = ColdStartConfig()
    store: StoreConfig = StoreConfig()

    @model_validator(mode="after")
    def _writable_from_a_thread(self) -> "SimAppConfig":
        if self.write_behind and self.store.url and is_in_memory_sqlite(self.store.url):
            raise ValueError("write_behind needs a file or server database, and store.url is in-memory SQLite "
                             "(which each thread sees apart)")
        return self

    @model_validator(mode="after")
    def _leads_have_somewhere_to_go(self) -> "SimAppConfig":
        cs, sc = self.cold_start, self.sim
        has_lead = any(d.lead_success > 0 for d in sc.fitted) if sc.fitted else sc.lead_success > 0
        if cs.hint_form == "lead" and cs.hint_below > 0 and not has_lead:
            raise ValueError("cold_start.hint_form=lead leads nothing in this scenario: set sim.lead_success "
                             "(or a fitted domain's lead_success)")
        return self


class SimConfigError(ValueError):
    """An invalid sim configuration, described in one line."""


def validate_sim_config(raw: dict) -> SimAppConfig:
    try:
        return SimAppConfig.model_validate(raw)
    except ValidationError as exc:
        raise SimConfigError(describe_error(exc)) from None
