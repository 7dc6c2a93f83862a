"""One simulated training run: the production Curriculum and StatsStore around a synthetic learner.

Per step: ``Curriculum.plan`` → the learner rolls out G outcomes per planned prompt → the outcomes
(``GroupArrays``: a row of G per prompt, real group advantages) go through ``Curriculum.record_outcomes``
with the held-out metrics, as a trainer's step is recorded → the learner learns from the same
groups (with ``sim.refill_rounds``, the trainer's dynamic sampling, from those whose rewards differ,
agreeing ones replaced by refills). The simulator draws no tasks: its learner needs only the plan's (domain, level) counts.

By default the store gets each step's aggregates, plan and metrics but not one ``results`` row per
completion (``AggregatedWrites``; ``store_results=true`` writes those too).

Metrics written per step (``store.metrics(run_id)``):

- ``heldout/macro`` — mean over domains of held-out success (from the model, not sampled);
- ``heldout/worst_decile`` — mean of the worst 10% of domains;
- ``heldout/mastered`` — domains at or above ``sim.mastery``;
- ``sim/rollouts`` — completions generated so far (the rollout budget, discarded ones included);
- ``sim/zero_var_share`` — share of this step's groups whose rewards all agree;
- ``domain/<name>/trained`` — the groups of the domain the learner learned from this step (with
  ``sim.refill_rounds``, refills that varied in, agreeing groups out), only for domains with any;
- ``heldout/domains`` — every ``sim.domains_every`` steps and at the last step: per-domain
  held-out success in thousandths (ints keep a thousand domains to a few KB a row).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from curriculum.compare import heldout_metrics
from curriculum.curriculum import Curriculum
from curriculum.scheduler import StepWriteFailed
from curriculum.types import rewards_agree
from curriculum.sim.config import SimAppConfig
from curriculum.sim.learner import KINDS, Learner, StepOutcome, build_world
from curriculum.steps import trained_metrics
from curriculum.store import StatsStore
from curriculum.types import GroupArrays, Plan


@dataclass
class SimResult:
    run_id: str | None
    steps: int
    final_macro: float
    auc: float  # mean of heldout/macro over the steps (the normalised area under the curve)
    seconds: float
    heldout: np.ndarray  # [D] each domain's held-out success at the end


def plan_arrays(plan: Plan, index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Domain index and level of every prompt of the plan, [P] each."""
    domain = np.fromiter((index[d] for (d, _lv), n in plan.counts.items() for _ in range(n)), np.int64)
    level = np.fromiter((lv for (_d, lv), n in plan.counts.items() for _ in range(n)), np.int64)
    return domain, level


def rollout_with_refills(learner: Learner, domain: np.ndarray, level: np.ndarray, rounds: int,
                         rng: np.random.Generator, refill_from: str = "plan",
                         led: np.ndarray | None = None) -> tuple[StepOutcome, StepOutcome]:
    """The step's rollouts, and the groups it trains on. With ``rounds`` > 0 (the trainer's dynamic
    sampling) groups whose rewards all agree are left out and replaced, in up to ``rounds`` rounds,
    by groups drawn in the plan's proportions of (domain, level) (``refill_from="plan"``) or from
    the (domain, level) of each group left out (``"dropped"``, so the trained shares keep the
    plan's); every group generated is recorded. ``led`` [P] bool: the planned prompts drawn led (a
    refill of a slot is led when the slot was)."""
    def play(rows: np.ndarray | slice) -> StepOutcome:
        return learner.rollout(domain[rows], level[rows], None if led is None else led[rows])

    generated = [play(slice(None))]
    if rounds == 0:
        return generated[0], generated[0]
    agree = rewards_agree(generated[0].reward)
    kept = [generated[0].select(np.nonzero(~agree)[0])]
    dropped = np.nonzero(agree)[0]  # planned slots still without a trained group
    for _ in range(rounds):
        missing = len(domain) - sum(len(k.domain) for k in kept)
        if missing <= 0:
            break
        if refill_from == "dropped":
            pick = dropped
        else:
            pick = rng.integers(0, len(domain), missing)  # the plan's proportions
        refill = play(pick)
        generated.append(refill)
        agree = rewards_agree(refill.reward)
        varied = np.nonzero(~agree)[0]
        kept.append(refill.select(np.sort(rng.permutation(varied)[:missing])))
        dropped = pick[agree]
    return StepOutcome.concat(generated), StepOutcome.concat(kept)


def led_prompts(plan: Plan, domain: np.ndarray, index: dict[str, int], cfg: SimAppConfig) -> np.ndarray:
    """[P] bool: the planned prompts drawn led, each with its domain's hint share (``plan.hints``)
    as its chance, from a stream of the step's own (the trainer rounds ``share * n`` per domain)."""
    share = np.zeros(len(index))
    if plan.hints is not None:
        share[[index[name] for name in plan.domains]] = plan.hints
    rng = np.random.default_rng([cfg.seed, plan.step, 0x4C454144])  # "LEAD"
    return rng.random(len(domain)) < share[domain]


def to_outcomes(out: StepOutcome, names: list[str], step: int) -> GroupArrays:
    """The step's outcomes, a group per prompt, as the scheduler takes them without one Python
    object per completion. Verdicts follow the reward, as the verifier's words would."""
    # out.correct (the true outcome) stays inside the simulator: a trainer only sees the reward
    domains, levels = [names[d] for d in out.domain.tolist()], out.level.tolist()
    return GroupArrays(domains=domains, levels=out.level, reward=out.reward, correct=out.reward > 0.5,
                       advantage=out.advantage, led=out.led if out.led.any() else None,
                       task_ids=[f"{name}/{lv}/{step}.{g}" for g, (name, lv) in enumerate(zip(domains, levels))])


def describe_world(cfg: SimAppConfig, names: list[str], kinds: np.ndarray) -> dict:
    """The run's stored config: the validated app config plus which domain carries which effect."""
    return {**cfg.model_dump(mode="json"), "world": {"kinds": {
        kind: [names[i] for i in np.nonzero(kinds == k)[0]] for k, kind in enumerate(KINDS) if kind != "plain"}}}


class AggregatedWrites:
    """The store as the scheduler sees it, minus the per-completion rows of the ``results`` table.

    The scheduler still gets every Outcome, aggregates it and writes the step in one
    transaction — step statistics, plan, plan vectors, metrics — which is all that ``compare``,
    ``report`` and ``rebuild_from_store`` read. Only the one-row-per-completion audit trail is
    left out: a 2,000-step ``hundreds`` run would write a million rows (about 200 MB of SQLite)
    that describe coin flips of a synthetic learner, and inserting them is most of a run's time.
    """

    def __init__(self, store: StatsStore) -> None:
        self._store = store

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def write_step(self, run_id, step, plan, outcomes, metrics=None, step_stats=None, **extra) -> None:
        if step_stats is None:  # the scheduler always passes them; without them nothing would be counted
            raise ValueError("AggregatedWrites needs the scheduler's step_stats")
        self._store.write_step(run_id, step, plan, [], metrics, step_stats=step_stats, **extra)


def run_sim(cfg: SimAppConfig, store: StatsStore | None = None, progress_every: int = 0) -> SimResult:
    """Run ``cfg.sim.steps`` steps; with a store, the run is recorded under a new run id."""
    sc = cfg.sim
    world = build_world(sc, cfg.seed)
    learner = Learner(world, cfg.seed, sc.group_size)
    run_id = None
    if store is not None:
        run_id = store.start_run(cfg.name, describe_world(cfg, world.names, world.kind), cfg.seed,
                                 sweep_id=cfg.sweep_id)
    writes = store if (store is None or cfg.store_results) else AggregatedWrites(store)
    levels = {name: tuple(range(count)) for name, count in zip(world.names, world.levels.tolist())}
    curriculum = Curriculum(levels=levels, policy=cfg.policy,
                            difficulty=cfg.difficulty, prompts_per_step=sc.prompts_per_step, seed=cfg.seed,
                            store=writes, run_id=run_id, write_behind=cfg.write_behind and store is not None,
                            cold_start=cfg.cold_start, group_size=sc.group_size)
    index = {name: i for i, name in enumerate(world.names)}
    leads = cfg.cold_start.hint_form == "lead" and cfg.cold_start.hint_below > 0
    start, status, rollouts, macro_sum = time.perf_counter(), "failed", 0, 0.0
    try:
        for step in range(1, sc.steps + 1):
            plan = curriculum.plan(step)
            domain, level = plan_arrays(plan, index)
            out, kept = rollout_with_refills(learner, domain, level, sc.refill_rounds,
                                             np.random.default_rng([cfg.seed, step, 0x52454649]), sc.refill_from,
                                             led=led_prompts(plan, domain, index, cfg) if leads else None)
            learner.learn(kept)
            rollouts += out.reward.size
            metrics = heldout_metrics(learner.heldout(), sc.mastery,
                                      step % sc.domains_every == 0 or step == sc.steps or step == 1)
            zero_var = rewards_agree(out.reward).mean() if len(domain) else 0.0
            metrics.update({"sim/rollouts": rollouts, "sim/zero_var_share": float(zero_var)})
            metrics.update(trained_metrics(world.names[d] for d in kept.domain.tolist()))
            macro_sum += metrics["heldout/macro"]
            curriculum.record_outcomes(step, to_outcomes(out, world.names, step), metrics)
            if progress_every and step % progress_every == 0:
                print(f"step {step}: macro {metrics['heldout/macro']:.4f}", flush=True)
        curriculum.flush()
        status = "finished"
    finally:
        with contextlib.suppress(StepWriteFailed):  # already raised in the loop; the run is marked failed
            curriculum.finish(status)
    heldout = learner.heldout()
    return SimResult(run_id, sc.steps, float(heldout.mean()), macro_sum / sc.steps, time.perf_counter() - start,
                     heldout)
