"""A simulator scenario fitted to a real training run, so that the simulator can be held against it.

    python -m curriculum.sim.fit --db URL --run RUN_ID --out conf/sim/NAME.yaml [--seeds 8]

Every domain of the run becomes a fitted domain (``sim.fitted``) of a scenario with the run's steps,
prompts per step, group size and dynamic-sampling rounds, and with the domain's own number of levels
(counted from its held-out results):

- its starting skill θ0 is the one at which the learner solves the easiest level as often as the
  real model did in its first ``EARLY_STEPS`` training steps — what a mixing policy sees at the
  start, which held-out success over all levels hides (a tool domain at 0 of 20 held-out tasks
  and one at 2 of 20 training attempts are different starts); a domain the run never trained on
  then falls back to the skill at which the learner's held-out success (the mean over levels of
  σ(a(θ − b_ℓ)), one slope a for all) equals the domain's held-out success before training;
- its learning rate is found by bisection, in rounds of simulated runs with the run's own policy
  and difficulty controller, as the one whose simulated gain of held-out success, averaged over
  seeds, matches the real gain.

A success rate measured on n attempts is clamped into [0.5/n, 1 − 0.5/n] (0 of 20 is not a skill
of minus infinity), and a domain that gained nothing gets a learning rate of 0: the learner cannot
unlearn, and one real run cannot tell noise from loss. The fit is to one run of one policy; what
the scenario then predicts for another policy is the test of the simulator.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import brentq

from curriculum.compare import load_run
from curriculum.config import DifficultyConfig, PolicyConfig, parse_difficulty, parse_policy
from curriculum.sim.config import FittedDomain, ScenarioConfig, SimAppConfig
from curriculum.sim.learner import mean_success, sigmoid
from curriculum.sim.runner import run_sim
from curriculum.tasks import heldout_per_level

SLOPE = 1.75  # the middle of the plain scenarios' slopes [1.0, 2.5]
LR_RANGE = (1e-4, 1.0)  # the rates searched: from barely moving in a run to a level per group
EARLY_STEPS = 5  # training steps whose success at the easiest level sets a domain's start


@dataclass
class RealRun:
    """What the fit reads from a trained run: held-out success per domain before and after, and
    the settings a simulated run needs to train the same way."""

    names: tuple[str, ...]
    before: np.ndarray  # [D]
    after: np.ndarray  # [D]
    tasks_per_domain: np.ndarray  # [D] held-out tasks
    early_successes: np.ndarray  # [D] at the easiest level in the first EARLY_STEPS steps
    early_attempts: np.ndarray  # [D]
    scenario: ScenarioConfig  # the run's batch and steps; no domains fitted yet
    policy: PolicyConfig
    difficulty: DifficultyConfig
    levels: np.ndarray  # [D] a domain's own level count (the scenario has the most of them)


def read_run(store, run_id: str) -> RealRun:
    run = store.run(run_id)
    curves = load_run(store, run)
    if curves is None or len(curves.domain_steps) < 2 or not curves.domain_names:
        raise ValueError(f"run {run_id} has no per-domain held-out success before and after training")
    config = run["config"]
    trainer, names = config["trainer"], curves.domain_names
    last = next(r for r in reversed(store.metrics(run_id)) if r.get("heldout/macro") is not None)
    levels = np.array([max(1, sum(key.startswith(f"heldout/{name}/") for key in last)) for name in names])
    scenario = ScenarioConfig(
        name=f"fitted to {run['name']} ({run_id[:8]})", domains=len(names), levels=int(levels.max()),
        steps=int(trainer["steps"]), prompts_per_step=int(trainer["prompts_per_step"]),
        group_size=int(trainer["group_size"]), refill_rounds=int(trainer["sampling"]["max_refill_rounds"]),
        transfer_pos=0.0, fitted=[])
    successes, attempts = early_success(store.step_stats(run_id), names)
    per_level = [heldout_per_level(int(config["eval"]["tasks_per_level"]),
                                   int(config["eval"].get("min_tasks_per_domain", 0)), int(k)) for k in levels]
    return RealRun(names, curves.domains[0], curves.domains[-1], np.array(per_level) * levels, successes, attempts,
                   scenario, parse_policy(config["policy"]), parse_difficulty(config["difficulty"]), levels)


def early_success(step_stats: list[dict], names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Successes and attempts of each domain at its easiest trained level in the first EARLY_STEPS steps."""
    easiest = {name: min((r["level"] for r in step_stats if r["domain"] == name), default=None) for name in names}
    early = [r for r in step_stats if r["step"] <= EARLY_STEPS and r["level"] == easiest.get(r["domain"])]
    successes = np.array([sum(r["successes"] for r in early if r["domain"] == n) for n in names], dtype=float)
    attempts = np.array([sum(r["attempts"] for r in early if r["domain"] == n) for n in names], dtype=float)
    return successes, attempts


def skill_at(success: float, slope: float, offsets: np.ndarray) -> float:
    """θ at which the mean over levels of σ(slope·(θ − b)) is ``success`` (it rises with θ: one root)."""
    return brentq(lambda theta: sigmoid(slope * (theta - offsets)).mean() - success,
                  -30.0, 30.0 + float(offsets.max()), xtol=1e-12)


def starting_skills(real: RealRun, offsets: np.ndarray) -> np.ndarray:
    """[D] θ0: from the early training success at the easiest level, else from held-out success."""
    floors = 0.5 / real.tasks_per_domain
    theta0 = [skill_at(float(np.clip(b, floor, 1.0 - floor)), SLOPE, offsets[:levels])
              for b, floor, levels in zip(real.before, floors, real.levels)]
    for d, (wins, n) in enumerate(zip(real.early_successes, real.early_attempts)):
        if n > 0:
            p = float(np.clip(wins / n, 0.5 / n, 1.0 - 0.5 / n))
            theta0[d] = offsets[0] + math.log(p / (1.0 - p)) / SLOPE
    return np.array(theta0)


def with_rates(real: RealRun, theta0: np.ndarray, lr: np.ndarray) -> ScenarioConfig:
    levels = [None if k == real.scenario.levels else int(k) for k in real.levels]  # None: all
    fitted = [FittedDomain(name=n, theta0=round(float(t), 4), lr=float(f"{r:.4g}"), slope=SLOPE, levels=k)
              for n, t, r, k in zip(real.names, theta0, lr, levels)]
    return real.scenario.model_copy(update={"fitted": fitted})


def simulated_after(scenario: ScenarioConfig, real: RealRun, seeds: int) -> np.ndarray:
    """[D] held-out success at the end, averaged over ``seeds`` simulated runs of the real run's policy."""
    ends = [run_sim(SimAppConfig(sim=scenario, policy=real.policy, difficulty=real.difficulty, seed=seed)).heldout
            for seed in range(seeds)]
    return np.mean(ends, axis=0)


def fit_scenario(real: RealRun, seeds: int = 8, rounds: int = 14) -> tuple[ScenarioConfig, np.ndarray, np.ndarray]:
    """The fitted scenario, and its held-out success before and after training ([D] each; after:
    the mean over seeds of simulated runs of the real run's policy)."""
    offsets = real.scenario.level_step * np.arange(real.scenario.levels, dtype=float)
    theta0 = starting_skills(real, offsets)
    start = mean_success(np.full(len(theta0), SLOPE), theta0, offsets, real.levels)  # the learner's held-out
    wanted = real.after - real.before
    # bisection on log lr, every domain at once: a domain's gain rises with its own rate, and with
    # no transfer in the scenario the others' rates touch it only through the policy's mix
    lo, hi = np.full(len(wanted), math.log(LR_RANGE[0])), np.full(len(wanted), math.log(LR_RANGE[1]))
    for _ in range(rounds):
        mid = (lo + hi) / 2
        got = simulated_after(with_rates(real, theta0, np.exp(mid)), real, seeds) - start
        lo, hi = np.where(got < wanted, mid, lo), np.where(got < wanted, hi, mid)
    lr = np.where(wanted > 0, np.exp((lo + hi) / 2), 0.0)
    scenario = with_rates(real, theta0, lr)
    return scenario, start, simulated_after(scenario, real, seeds)


def scenario_yaml(scenario: ScenarioConfig, real: RealRun, start: np.ndarray, simulated: np.ndarray) -> str:
    rows = "\n".join(f"#   {n:<18} {w:>3.0f}/{k:<3.0f} {b:.3f} -> {a:.3f}    {s0:.3f} -> {s1:.3f}"
                     for n, w, k, b, a, s0, s1 in zip(real.names, real.early_successes, real.early_attempts,
                                                      real.before, real.after, start, simulated))
    header = (f"# {real.scenario.name}, written by python -m curriculum.sim.fit. Per domain: successes/attempts\n"
              f"# at the easiest level in the first {EARLY_STEPS} steps and held-out success before -> after in the real\n"
              f"# run ({real.policy.type}); then the learner's held-out success before -> after under that policy:\n"
              f"{rows}\n")
    body = scenario.model_dump(mode="json", exclude_defaults=False)
    for domain in body["fitted"]:  # a domain with all the scenario's levels says nothing of them
        if domain["levels"] is None:
            del domain["levels"]
    return header + yaml.safe_dump(body, sort_keys=False, width=110)


def main(argv: list[str] | None = None) -> None:
    from curriculum.store import StatsStore, StoreUnavailable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the store URL of the real run")
    parser.add_argument("--run", required=True, help="the real run's id")
    parser.add_argument("--out", required=True, type=Path, help="where to write the scenario (conf/sim/NAME.yaml)")
    parser.add_argument("--seeds", type=int, default=8, help="simulated runs averaged per round")
    args = parser.parse_args(argv)
    try:
        with StatsStore(args.db, create=False) as store:
            real = read_run(store, args.run)
    except (KeyError, ValueError, StoreUnavailable) as exc:
        raise SystemExit(f"error: {exc.args[0] if exc.args else exc}") from None
    scenario, start, simulated = fit_scenario(real, seeds=args.seeds)
    scenario = scenario.model_copy(update={"name": args.out.stem})
    args.out.write_text(scenario_yaml(scenario, real, start, simulated))
    worst = float(np.max(np.abs((simulated - start) - (real.after - real.before))))
    print(f"wrote {args.out}: {len(real.names)} domains; the largest miss of a domain's held-out gain is {worst:.3f}")


if __name__ == "__main__":
    main()
