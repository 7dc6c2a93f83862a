"""Scheduler: exact prompt counts, determinism, state round trip, rebuild from the store."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from curriculum.config import parse_difficulty, parse_policy
from curriculum.policies import POLICIES
from curriculum.scheduler import Scheduler, allocate, next_credit
from curriculum.signals import Signals
from curriculum.store import StatsStore
from curriculum.types import Outcome, Plan
from databases import DATABASES, empty_database

DOMAINS = {"arithmetic": (1, 2, 3), "fractions": (1, 2, 3), "code": (1, 2), "tools": (1,)}
SKILL = {"arithmetic": 0.9, "fractions": 0.5, "code": 0.2, "tools": 0.0}
GROUP = 4


def scheduler(kind="learnability", store=None, run_id=None, seed=0, prompts=12, difficulty=None, **options):
    return Scheduler(DOMAINS, parse_policy({"type": kind, **options}),
                     parse_difficulty(difficulty or {"type": "threshold", "window": 8, "replay_share": 0.2}),
                     prompts_per_step=prompts, seed=seed, store=store, run_id=run_id)


def rollouts(plan: Plan, rng: random.Random) -> list[Outcome]:
    """A synthetic learner: GROUP completions per prompt, success falls with level, std-normalised advantages."""
    outcomes, group = [], 0
    for (domain, level), n in sorted(plan.counts.items()):
        for _ in range(n):
            p = SKILL[domain] / level
            rewards = [float(rng.random() < p) for _ in range(GROUP)]
            mean, std = np.mean(rewards), np.std(rewards)
            outcomes += [Outcome(domain, level, f"{domain}-{group}", group, r, r > 0.5, "ok",
                                 (r - mean) / (std + 1e-4), completion=f"c{group}") for r in rewards]
            group += 1
    return outcomes


def drive(sched: Scheduler, steps, seed=0) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for step in steps:
        plan = sched.plan(step)
        sched.record(step, rollouts(plan, rng), {"loss": 0.1 * step})
        plans.append(plan)
    return plans


def same_plan(a: Plan, b: Plan) -> bool:
    return (a.step == b.step and a.counts == b.counts and np.array_equal(a.weights, b.weights)
            and np.array_equal(a.levels, b.levels))


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_counts_sum_exactly_and_follow_levels(kind):
    sched = scheduler(kind)
    for plan in drive(sched, range(25)):
        assert plan.total == 12 and all(n > 0 for n in plan.counts.values())
        assert plan.weights.sum() == pytest.approx(1.0)
        for (domain, level), _n in plan.counts.items():
            current = plan.levels[plan.domains.index(domain)]
            assert level in (current, DOMAINS[domain][max(DOMAINS[domain].index(current) - 1, 0)])


def test_small_weights_still_get_visits():
    sched = scheduler("fixed", weights={"arithmetic": 1.0, "tools": 0.01}, default=0.0, prompts=10)
    plans = drive(sched, range(30))
    tools = sum(n for p in plans for (d, _), n in p.counts.items() if d == "tools")
    assert tools == 3  # 0.0099 share * 10 prompts * 30 steps, delivered as whole prompts
    assert all(p.total == 10 for p in plans)


def test_allocate_is_largest_remainder_with_carry():
    w = np.array([0.5, 0.3, 0.2])
    counts = allocate(w, np.zeros(3), 4)
    # ideal 2.0, 1.2, 0.8 -> floors 2, 1, 0 and one left for the largest remainder (0.8)
    assert counts.tolist() == [2, 1, 1]
    credit = next_credit(w, np.zeros(3), counts, 4)
    assert np.allclose(credit, [0.0, 0.2, -0.2])
    assert allocate(w, credit, 4).tolist() == [2, 1, 1]  # 2.0, 1.4, 0.6
    assert allocate(w, next_credit(w, credit, counts, 4), 4).tolist() == [2, 2, 0]  # 2.0, 1.6, 0.4


@pytest.mark.parametrize("kind", ["learnability", "thompson", "tscl", "exp3"])
def test_same_seed_same_plans(kind):
    a = drive(scheduler(kind, seed=5), range(20))
    b = drive(scheduler(kind, seed=5), range(20))
    assert all(same_plan(x, y) for x, y in zip(a, b))


def test_plan_is_stable_until_recorded():
    sched = scheduler("thompson")
    drive(sched, range(3))
    assert same_plan(sched.plan(3), sched.plan(3))
    ahead = sched.plan(4)  # generation of step 4 may start before step 3 is verified
    sched.record(3, rollouts(sched.plan(3), random.Random(0)))
    sched.record(4, rollouts(ahead, random.Random(1)))
    with pytest.raises(ValueError, match="not after"):
        sched.record(4, [])


@pytest.mark.parametrize("kind", ["learnability", "sec", "thompson", "exp3"])
def test_state_round_trip_continues_identically(kind):
    live = scheduler(kind, seed=2, smoothing=0.2)
    drive(live, range(10), seed=1)
    restored = scheduler(kind, seed=2, smoothing=0.2)
    restored.load_state_dict(json.loads(json.dumps(live.state_dict())))
    assert restored.state_dict() == live.state_dict()
    assert all(same_plan(x, y) for x, y in zip(drive(live, range(10, 20), seed=9),
                                               drive(restored, range(10, 20), seed=9)))


def test_plans_handed_out_before_a_checkpoint_are_reissued_as_they_were():
    """A trainer that reads ahead asked for steps 6 and 7 before step 5 was recorded; the checkpoint
    after step 5 carries them, and the restored scheduler hands out those plans, not new ones."""
    live = scheduler("learnability", seed=3)
    drive(live, range(5), seed=1)
    ahead = [live.plan(6), live.plan(7)]  # read ahead, before step 5 is recorded
    live.record(5, rollouts(live.plan(5), random.Random(2)))
    assert [p.step for p in live.handed_out()] == [6, 7]

    fresh = scheduler("learnability", seed=3)
    fresh.load_state_dict(json.loads(json.dumps(live.state_dict())))
    replanned = fresh.plan(6)  # planned from the state after step 5: it learned from step 5
    assert not same_plan(replanned, ahead[0])  # so planning again is not a resume

    restored = scheduler("learnability", seed=3)
    restored.load_state_dict(json.loads(json.dumps(live.state_dict())))
    restored.reissue(live.handed_out())
    assert all(same_plan(restored.plan(p.step), p) for p in ahead)
    rng_live, rng_restored = random.Random(4), random.Random(4)
    for step in (6, 7):  # and both go on alike
        live.record(step, rollouts(live.plan(step), rng_live))
        restored.record(step, rollouts(restored.plan(step), rng_restored))
    assert same_plan(restored.plan(8), live.plan(8)) and [p.step for p in restored.handed_out()] == [8]
    with pytest.raises(ValueError, match="plan step 7 is not after the last recorded step 7"):
        restored.reissue([ahead[1]])


@pytest.fixture(params=DATABASES)
def store_url(request, tmp_path) -> str:
    return empty_database(request.param, tmp_path, "p.db")


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_rebuild_from_store_equals_live_state(kind, store_url):
    store = StatsStore(store_url)
    live = scheduler(kind, store=store, seed=4, smoothing=0.1)
    drive(live, range(15), seed=3)
    rebuilt = scheduler(kind, store=store, run_id=live.run_id, seed=4, smoothing=0.1)
    rebuilt.rebuild_from_store()
    assert json.dumps(rebuilt.state_dict(), sort_keys=True) == json.dumps(live.state_dict(), sort_keys=True)
    assert same_plan(rebuilt.plan(15), live.plan(15))
    store.close()


def test_rebuild_matches_a_run_that_planned_ahead(tmp_path):
    store = StatsStore(f"sqlite:///{tmp_path / 'p.db'}")
    live = scheduler("exp3", store=store, smoothing=0.2)
    rng = random.Random(0)
    ahead = live.plan(0)
    for step in range(10):  # plan(step + 1) is asked for before step is recorded
        nxt = live.plan(step + 1)
        live.record(step, rollouts(ahead, rng))
        ahead = nxt
    rebuilt = scheduler("exp3", store=store, run_id=live.run_id, smoothing=0.2)
    rebuilt.rebuild_from_store()
    assert json.dumps(rebuilt.state_dict(), sort_keys=True) == json.dumps(live.state_dict(), sort_keys=True)
    store.close()


def test_signals_alone_rebuild_from_step_stats(tmp_path):
    store = StatsStore(f"sqlite:///{tmp_path / 'p.db'}")
    live = scheduler("uniform", store=store)
    drive(live, range(12))
    rebuilt = Signals.from_step_stats(live.domains, store.step_stats(live.run_id), window=10, ema_alpha=0.1,
                                      steps=list(range(12)))
    assert json.dumps(rebuilt.state_dict()) == json.dumps(live.signals.state_dict())
    store.close()


def test_resume_rewrites_steps_without_double_counting(tmp_path):
    store = StatsStore(f"sqlite:///{tmp_path / 'p.db'}")
    first = scheduler(store=store)
    drive(first, range(8))
    checkpoint = json.loads(json.dumps(first.state_dict()))
    drive(first, range(8, 12))  # steps 8-11 are written, then the run dies before checkpointing
    n_before = store.count_results(first.run_id)
    resumed = scheduler(store=store, run_id=first.run_id)
    resumed.load_state_dict(checkpoint)
    drive(resumed, range(8, 12))  # replays the same steps from the checkpoint
    assert store.count_results(first.run_id) == n_before
    assert json.dumps(resumed.state_dict(), sort_keys=True) == json.dumps(first.state_dict(), sort_keys=True)
    store.close()


def test_record_writes_one_row_per_outcome(tmp_path):
    store = StatsStore(f"sqlite:///{tmp_path / 'p.db'}")
    sched = scheduler(store=store)
    plan = sched.plan(0)
    outcomes = rollouts(plan, random.Random(0))
    sched.record(0, outcomes, {"loss": 1.0})
    assert store.count_results(sched.run_id) == len(outcomes) == 12 * GROUP
    stats = store.step_stats(sched.run_id)
    assert sum(r["attempts"] for r in stats) == 48 and sum(r["groups"] for r in stats) == 12
    assert store.runs()[0]["last_step"] == 0
    store.close()


def test_group_statistics_reach_the_signals():
    sched = scheduler("uniform", difficulty={"type": "fixed"})
    # one arithmetic group of 4 (2 right, advantages +-1), one all-wrong fractions group
    outs = [Outcome("arithmetic", 1, "t", 0, r, r > 0.5, "ok", a) for r, a in
            [(1.0, 1.0), (0.0, -1.0), (1.0, 1.0), (0.0, -1.0)]]
    outs += [Outcome("fractions", 1, "u", 1, 0.0, False, "wrong", 0.0) for _ in range(4)]
    sched.record(0, outs)
    s = sched.signals
    assert s.success[:2].tolist() == [0.5, 0.0] and s.mean_abs_adv[:2].tolist() == [1.0, 0.0]
    assert s.zero_var_share[:2].tolist() == [0.0, 1.0] and np.isnan(s.success[2])


def test_unknown_domain_or_level_is_a_clear_error():
    sched = scheduler()
    with pytest.raises(ValueError, match="unknown domain/level"):
        sched.record(0, [Outcome("tools", 2, "t", 0, 1.0, True, "ok")])


def test_write_behind_stores_the_same_rows(tmp_path):
    store = StatsStore(f"sqlite:///{tmp_path / 'p.db'}")
    sync = scheduler("sec", store=store, seed=1)
    behind = Scheduler(DOMAINS, sync.policy_cfg, sync.difficulty_cfg, prompts_per_step=12, seed=1,
                       store=store, write_behind=True)
    drive(sync, range(6))
    drive(behind, range(6))
    behind.flush()
    assert store.count_results(behind.run_id) == store.count_results(sync.run_id) > 0
    strip = lambda rows: [{k: v for k, v in r.items() if k != "run_id"} for r in rows]  # noqa: E731
    assert strip(store.step_stats(behind.run_id)) == strip(store.step_stats(sync.run_id))
    assert json.dumps(behind.state_dict()) == json.dumps(sync.state_dict())
    behind.close()
    store.close()


def test_write_behind_stores_the_metrics_as_they_were_at_record_time(tmp_path):
    """The trainer adds timings to its metrics dict after record returns; the background writer
    must store the dict as handed over, not race the later additions (a dict that grows while it
    is serialised fails the write)."""
    store = StatsStore(f"sqlite:///{tmp_path / 'p.db'}")
    sched = Scheduler(DOMAINS, parse_policy({"type": "uniform"}), parse_difficulty({"type": "fixed"}),
                      prompts_per_step=4, store=store, write_behind=True)
    rng = random.Random(0)
    for step in range(20):
        metrics = {"loss": float(step)}
        sched.record(step, rollouts(sched.plan(step), rng), metrics)
        metrics.update({f"late/{i}": i for i in range(200)})
    sched.flush()
    assert store.metrics(sched.run_id) == [{"step": s, "loss": float(s)} for s in range(20)]
    sched.close()
    store.close()


def test_write_behind_failure_reaches_the_trainer(tmp_path):
    store = StatsStore(f"sqlite:///{tmp_path / 'p.db'}")
    sched = Scheduler(DOMAINS, parse_policy({"type": "uniform"}), parse_difficulty({"type": "fixed"}),
                      prompts_per_step=4, store=store, run_id="no-such-run", write_behind=True)
    # the foreign key on run_id rejects the write on the writer thread; the trainer hears of it at
    # its next call into the scheduler or at the flush, whichever comes after the writer failed
    with pytest.raises(RuntimeError, match="failed"):
        drive(sched, range(1))
        sched.flush()
    store.close()
