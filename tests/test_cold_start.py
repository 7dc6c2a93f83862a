"""Cold start (curriculum/cold_start.py) and the headroom policy: probe budget, fall to the
easiest level, shares held within a ratio, and plans that a rebuilt scheduler reproduces."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from curriculum.cold_start import lift, probes_per_window
from curriculum.config import ColdStartConfig, parse_difficulty, parse_policy
from curriculum.policies.headroom import HeadroomPolicy, bounded_ratio
from curriculum.scheduler import Scheduler
from curriculum.signals import Signals, StepCounts
from curriculum.store import StatsStore
from curriculum.types import Outcome

DOMAINS = {"easy": (1, 2, 3), "middle": (1, 2, 3), "cold": (1, 2, 3), "impossible": (1,)}
SKILL = {"easy": 0.9, "middle": 0.5, "cold": 0.0, "impossible": 0.0}
GROUP, PROMPTS, WINDOW = 4, 16, 5


def scheduler(policy="learnability", store=None, run_id=None, **cold):
    return Scheduler(DOMAINS, parse_policy({"type": policy, "window": WINDOW}),
                     parse_difficulty({"type": "threshold", "window": 8, "lower_below": 0.05, "raise_above": 0.7}),
                     prompts_per_step=PROMPTS, seed=0, store=store, run_id=run_id,
                     cold_start=ColdStartConfig(**cold), group_size=GROUP)


def record(sched: Scheduler, step: int, rng: random.Random, skill=SKILL) -> None:
    plan, outs, group = sched.plan(step), [], 0
    for (domain, level), n in sorted(plan.counts.items()):
        for _ in range(n):
            rewards = [float(rng.random() < skill[domain] / level) for _ in range(GROUP)]
            outs += [Outcome(domain, level, f"{domain}-{group}", group, r, r > 0.5, "ok", 0.0) for r in rewards]
            group += 1
    sched.record(step, outs)


def shares(sched: Scheduler, step: int) -> dict[str, float]:
    return dict(zip(sched.domains, sched.plan(step).weights.tolist()))


def test_lift_holds_floors_and_keeps_weights_without_them():
    w = np.array([0.7, 0.25, 0.04, 0.01])
    assert lift(w, np.zeros(4)) is w  # bit for bit: a run without cold start plans as before
    out = lift(w, np.array([0.0, 0.0, 0.2, 0.2]))
    assert out.sum() == pytest.approx(1.0) and out[2:] == pytest.approx([0.2, 0.2])
    assert out[0] / out[1] == pytest.approx(0.7 / 0.25)  # the others keep their proportions
    # scaling the others down pushes one under its own floor: it is held too
    out = lift(np.array([0.9, 0.1, 0.0]), np.array([0.0, 0.09, 0.3]))
    assert out[2] == pytest.approx(0.3) and out[1] >= 0.09 - 1e-12 and out.sum() == pytest.approx(1.0)


def test_probe_gives_a_cold_domain_its_rollouts_then_lets_go_then_reprobes():
    assert probes_per_window(0.05) == 60  # about 3/p
    sched = scheduler(probe_rate=0.1, probe_patience=2, reprobe_every=20)
    # 30 rollouts a window = 7.5 prompts over 5 steps of 16: a share of 0.09375 (under an equal 0.25)
    probe = 30 / GROUP / (WINDOW * PROMPTS)
    rng = random.Random(0)
    seen = []
    for step in range(40):
        seen.append(shares(sched, step)["impossible"])
        record(sched, step, rng)
    # learnability alone would leave a never-succeeding domain at its floor (0.1 / 4 = 0.025)
    assert min(seen[1:10]) >= probe - 1e-9          # probed for probe_patience windows
    assert max(seen[11:20]) < probe                  # then given up on
    assert min(seen[21:25]) >= probe - 1e-9          # and probed again for a window every 20 steps
    plain = scheduler()
    rng = random.Random(0)
    for step in range(6):
        record(plain, step, rng)
    assert shares(plain, 6)["impossible"] < probe


def test_probe_never_exceeds_an_equal_share_nor_the_total_cap():
    sched = scheduler(probe_rate=0.01, probe_max_share=0.3)  # 300 rollouts a window: more than an equal share
    floors = sched.cold.probe_floors(sched.signals, 0)  # at the start every domain is cold
    assert floors.max() <= 0.25 + 1e-12 and floors.sum() == pytest.approx(0.3)


def test_a_domain_that_succeeds_leaves_the_probe():
    sched = scheduler(probe_rate=0.1)
    rng = random.Random(1)
    for step in range(6):
        record(sched, step, rng, skill={**SKILL, "cold": 0.6})
    assert not sched.signals.cold[sched.domains.index("cold")]
    assert sched.cold.probe_floors(sched.signals, 6)[sched.domains.index("cold")] == 0.0


def test_fall_to_easiest_at_once_only_when_asked():
    rng = random.Random(0)
    for fall, expected in ((True, 1), (False, 3)):
        sched = Scheduler(DOMAINS, parse_policy({"type": "uniform", "window": WINDOW}),
                          parse_difficulty({"type": "threshold", "window": 64, "start_levels": {"cold": 3}}),
                          prompts_per_step=PROMPTS, cold_start=ColdStartConfig(fall_to_easiest=fall, fall_after=8),
                          group_size=GROUP)
        for step in range(3):
            record(sched, step, rng)
        assert int(sched.plan(3).levels[sched.domains.index("cold")]) == expected


@pytest.mark.parametrize("policy", ["headroom", "learnability", "uniform"])
def test_rebuilt_scheduler_with_cold_start_plans_the_same(tmp_path, policy):
    store = StatsStore(f"sqlite:///{tmp_path / 'c.db'}")
    cold = dict(probe_rate=0.1, probe_patience=1, reprobe_every=7, fall_to_easiest=True, hint_below=0.3)
    live = scheduler(policy, store=store, **cold)
    rng = random.Random(2)
    for step in range(25):
        record(live, step, rng)
    rebuilt = scheduler(policy, store=store, run_id=live.run_id, **cold)
    rebuilt.rebuild_from_store()
    assert json.dumps(rebuilt.state_dict(), sort_keys=True) == json.dumps(live.state_dict(), sort_keys=True)
    a, b = live.plan(25), rebuilt.plan(25)
    assert a.counts == b.counts and np.array_equal(a.weights, b.weights) and np.array_equal(a.hints, b.hints)
    restored = scheduler(policy, **cold)
    restored.load_state_dict(json.loads(json.dumps(live.state_dict())))
    assert np.array_equal(restored.plan(25).weights, a.weights)
    store.close()


def signals_with(success: list[float], attempts: list[float], slope_steps: list[list[float]] | None = None) -> Signals:
    """Signals over len(success) domains after a few steps at the given per-step success rates."""
    n = len(success)
    s = Signals([f"d{i}" for i in range(n)], window=WINDOW)
    rates = slope_steps or [success] * 3
    for step, rate in enumerate(rates):
        att = np.asarray(attempts, dtype=float)
        suc = att * np.asarray(rate)
        s.update(step, StepCounts(att, suc, suc.copy(), np.zeros(n), np.zeros(n), att / GROUP))
    return s


def test_headroom_favours_room_and_progress_and_bounds_the_ratio():
    names = [f"d{i}" for i in range(4)]
    # d0 solved, d1 halfway and flat, d2 halfway and rising, d3 never solved
    rising = [[0.95, 0.5, 0.3, 0.0], [0.95, 0.5, 0.5, 0.0], [0.95, 0.5, 0.7, 0.0]]
    s = signals_with([0.95, 0.5, 0.5, 0.0], [16, 16, 16, 16], rising)
    w = HeadroomPolicy(names, max_ratio=1000.0).weights(s, 3)
    assert w.sum() == pytest.approx(1.0)
    assert w[2] > w[1] > w[0]            # progress counts, then room
    assert w[3] < w[1]                   # a never-solved domain's room is not trusted
    bounded = HeadroomPolicy(names, max_ratio=4.0).weights(s, 3)
    assert bounded.max() / bounded.min() == pytest.approx(4.0)  # every domain keeps a quarter of the top
    assert bounded.argmax() == 2


def test_bounded_ratio_leaves_weights_already_inside_alone():
    w = np.array([0.4, 0.3, 0.3])
    assert bounded_ratio(w, 2.0) is w
    out = bounded_ratio(np.array([0.97, 0.02, 0.01]), 3.0)
    assert out.sum() == pytest.approx(1.0) and out.max() / out.min() == pytest.approx(3.0, rel=1e-6)
    with pytest.raises(ValueError, match="max_ratio"):
        HeadroomPolicy(["a", "b"], max_ratio=0.5)


def test_slope_standard_error_is_binomial_noise_over_the_step_spread():
    # three steps at 16 attempts each: rates 0.25, 0.5, 0.75 -> window success 0.5, Sxx = 2
    s = signals_with([0.5, 0.5], [16, 16], [[0.25, 0.5], [0.5, 0.5], [0.75, 0.5]])
    expected = np.sqrt(0.5 * 0.5 / 16 / 2.0)
    assert s.success_slope_se == pytest.approx([expected, expected])
    one_step = signals_with([0.5], [16], [[0.5]])
    assert np.isinf(one_step.success_slope_se[0])  # no trend can be read from one step


def test_headroom_progress_z_ignores_a_rise_that_noise_explains():
    names = ["flat", "noisy_rise"]
    # a rise of 0.25 a step read from 4 completions a step: within one standard error (0.18)
    s = signals_with([0.5, 0.5], [4, 4], [[0.5, 0.25], [0.5, 0.5], [0.5, 0.75]])
    raw = HeadroomPolicy(names, max_ratio=1000.0).weights(s, 3)
    assert raw[1] > 2 * raw[0]  # read raw, the noisy rise takes the batch
    shrunk = HeadroomPolicy(names, max_ratio=1000.0, progress_z=2.0).weights(s, 3)
    assert shrunk == pytest.approx([0.5, 0.5])  # two standard errors off: no progress is read
    with pytest.raises(ValueError, match="progress_z"):
        HeadroomPolicy(names, progress_z=-1.0)
