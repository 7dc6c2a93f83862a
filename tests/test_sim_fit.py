"""A simulator scenario fitted to a run: fitted domains, starting skills, rates found by bisection."""
import math

import numpy as np
import pytest

from curriculum.config import parse_difficulty, parse_policy
from curriculum.sim.config import FittedDomain, ScenarioConfig, SimAppConfig, SimConfigError, validate_sim_config
from curriculum.sim.fit import SLOPE, RealRun, early_success, fit_scenario, skill_at
from curriculum.sim.learner import Learner, build_world, sigmoid
from curriculum.sim.runner import run_sim


def test_a_fitted_world_takes_its_domains_as_given_and_a_miscount_is_one_line():
    fitted = [FittedDomain(name="math", theta0=-1.0, lr=0.05, slope=2.0),
              FittedDomain(name="tools", theta0=0.5, lr=0.0, slope=1.0)]
    world = build_world(ScenarioConfig(domains=2, fitted=fitted), seed=3)
    assert world.names == ["math", "tools"]
    assert world.theta0.tolist() == [-1.0, 0.5] and world.lr.tolist() == [0.05, 0.0]
    assert world.slope.tolist() == [2.0, 1.0]
    with pytest.raises(SimConfigError, match="domains is 3 but 2 domains are fitted") as err:
        validate_sim_config({"sim": {"domains": 3, "fitted": [d.model_dump() for d in fitted]},
                             "policy": {"type": "uniform"}, "difficulty": {"type": "threshold"}})
    assert "\n" not in str(err.value)


def test_skill_at_inverts_the_learners_held_out_success():
    offsets = np.arange(5, dtype=float)
    for success in (0.01, 0.2, 0.5, 0.93):
        theta = skill_at(success, SLOPE, offsets)
        assert sigmoid(SLOPE * (theta - offsets)).mean() == pytest.approx(success, abs=1e-9)


def test_the_start_is_the_easiest_levels_success_in_the_first_steps():
    rows = [{"step": 1, "domain": "a", "level": 1, "attempts": 8, "successes": 2},
            {"step": 1, "domain": "a", "level": 2, "attempts": 4, "successes": 4},  # not the easiest level
            {"step": 5, "domain": "a", "level": 1, "attempts": 4, "successes": 1},
            {"step": 6, "domain": "a", "level": 1, "attempts": 4, "successes": 4},  # too late
            {"step": 9, "domain": "b", "level": 3, "attempts": 4, "successes": 4}]  # trained only late
    successes, attempts = early_success(rows, ("a", "b", "c"))
    assert successes.tolist() == [3, 0, 0] and attempts.tolist() == [12, 0, 0]


def test_the_fit_recovers_a_known_learner():
    # a "real" run made by the simulator itself from known rates: the fit must find rates that
    # give back its gains, and leave a domain that gained nothing at rate 0
    policy, difficulty = parse_policy({"type": "uniform"}), parse_difficulty({"type": "threshold"})
    base = ScenarioConfig(domains=3, levels=3, steps=30, prompts_per_step=6, group_size=4, refill_rounds=2,
                          transfer_pos=0.0)
    true_theta0, true_lr = np.array([0.5, -0.8, 1.0]), np.array([0.03, 0.08, 0.0])
    truth = base.model_copy(update={"fitted": [
        FittedDomain(name=n, theta0=t, lr=r, slope=SLOPE) for n, t, r in zip("xyz", true_theta0, true_lr)]})
    offsets = np.arange(3, dtype=float)
    before = sigmoid(SLOPE * (true_theta0[:, None] - offsets)).mean(axis=1)
    after = np.mean([run_sim(SimAppConfig(sim=truth, policy=policy, difficulty=difficulty, seed=s)).heldout
                     for s in range(8)], axis=0)
    p0 = sigmoid(SLOPE * true_theta0)  # the easiest level's success, as 1,000 attempts would show it
    real = RealRun(("x", "y", "z"), before, after, np.full(3, 1000), np.round(p0 * 1000), np.full(3, 1000.0), base,
                   policy, difficulty, np.full(3, 3))
    scenario, start, simulated = fit_scenario(real, seeds=8, rounds=14)
    theta0 = np.array([d.theta0 for d in scenario.fitted])
    lr = np.array([d.lr for d in scenario.fitted])
    assert theta0 == pytest.approx(true_theta0, abs=0.01)
    assert start == pytest.approx(before, abs=0.005)
    assert lr[2] == 0.0 and lr[:2] == pytest.approx(true_lr[:2], rel=0.1)
    assert simulated - start == pytest.approx(after - before, abs=0.01)
    assert math.isclose(scenario.fitted[0].slope, SLOPE)


def test_compare_names_a_fitted_worlds_domains(tmp_path, capsys):
    from curriculum.cli import main
    from curriculum.store import StatsStore

    fitted = [FittedDomain(name="algebra", theta0=0.0, lr=0.05, slope=SLOPE),
              FittedDomain(name="tool_calls", theta0=-2.0, lr=0.1, slope=SLOPE)]
    scenario = ScenarioConfig(domains=2, levels=3, steps=12, prompts_per_step=4, group_size=4, fitted=fitted)
    url = f"sqlite:///{tmp_path / 'fitted.db'}"
    with StatsStore(url) as store:
        for policy in ("uniform", "learnability"):
            for seed in range(3):
                run_sim(SimAppConfig(sim=scenario, policy=parse_policy({"type": policy}), seed=seed, sweep_id="fit",
                                     difficulty=parse_difficulty({"type": "threshold"})), store)
    capsys.readouterr()
    assert main(["compare", "--db", url, "--sweep", "fit", "--domains"]) == 0
    table = capsys.readouterr().out
    assert "domain (final held-out)" in table and "\nalgebra " in table and "\ntool_calls " in table


def test_fitting_to_a_run_the_store_lacks_is_one_line(tmp_path):
    from curriculum.sim.fit import main
    from curriculum.store import StatsStore

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    StatsStore(url).close()
    with pytest.raises(SystemExit) as exit_:
        main(["--db", url, "--run", "nope", "--out", str(tmp_path / "x.yaml")])
    assert str(exit_.value) == f"error: no run 'nope' in '{url}'"
    with pytest.raises(SystemExit, match="^error: .*missing.db") as exit_:
        main(["--db", f"sqlite:///{tmp_path / 'missing.db'}", "--run", "nope", "--out", str(tmp_path / "x.yaml")])
    assert not (tmp_path / "x.yaml").exists()


def test_a_fitted_domain_with_one_level_is_held_out_and_planned_at_that_level_alone(tmp_path):
    from curriculum.store import StatsStore

    fitted = [FittedDomain(name="built_in", theta0=0.5, lr=0.05, slope=SLOPE),
              FittedDomain(name="one_level", theta0=0.5, lr=0.05, slope=SLOPE, levels=1)]
    scenario = ScenarioConfig(domains=2, levels=4, steps=6, prompts_per_step=4, group_size=4, fitted=fitted)
    world = build_world(scenario, seed=0)
    assert world.levels.tolist() == [4, 1]
    held = Learner(world, 0, 4).heldout()
    assert held[1] == pytest.approx(sigmoid(SLOPE * 0.5))  # its one level, not the mean over four
    assert held[0] == pytest.approx(sigmoid(SLOPE * (0.5 - np.arange(4.0))).mean())
    url = f"sqlite:///{tmp_path / 'levels.db'}"
    with StatsStore(url) as store:
        result = run_sim(SimAppConfig(sim=scenario, policy=parse_policy({"type": "uniform"}), seed=0,
                                      difficulty=parse_difficulty({"type": "threshold", "raise_above": 0.05, "lower_below": 0.0, "window": 4})), store)
        levels = {(r["domain"], r["level"]) for r in store.step_stats(result.run_id)}
    assert {level for domain, level in levels if domain == "one_level"} == {0}
    assert max(level for domain, level in levels if domain == "built_in") > 0  # promoted past where one_level stays
    with pytest.raises(SimConfigError, match="fitted domain 'deep' has more levels than the scenario's 4"):
        validate_sim_config({"sim": {"domains": 1, "levels": 4, "fitted": [
            {"name": "deep", "theta0": 0.0, "lr": 0.0, "slope": 1.0, "levels": 5}]},
            "policy": {"type": "uniform"}, "difficulty": {"type": "threshold"}})


def test_the_fit_gives_each_domain_its_own_levels():
    # a run whose domain y has one level: its start is read on that level alone, and the scenario
    # gives it one level while x and z keep all three
    policy, difficulty = parse_policy({"type": "uniform"}), parse_difficulty({"type": "fixed"})
    base = ScenarioConfig(domains=3, levels=3, steps=5, prompts_per_step=6, group_size=4, transfer_pos=0.0)
    before, levels = np.array([0.3, 0.4, 0.2]), np.array([3, 1, 3])
    real = RealRun(("x", "y", "z"), before, before, np.array([12, 20, 12]), np.zeros(3), np.zeros(3), base,
                   policy, difficulty, levels)
    scenario, start, _ = fit_scenario(real, seeds=2, rounds=2)
    assert [d.levels for d in scenario.fitted] == [None, 1, None]
    assert start == pytest.approx(before, abs=1e-9)  # each domain's held-out success on its own levels
    assert scenario.fitted[1].theta0 == pytest.approx(math.log(0.4 / 0.6) / SLOPE, abs=1e-4)
