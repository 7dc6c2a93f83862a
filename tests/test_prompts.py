"""PromptSelector: streak skipping, Beta-posterior selection, retirement with replay, determinism,
state round trip, and per-prompt statistics in the store that a re-recorded step never counts twice.

Store tests run on SQLite in tmp_path, and on PostgreSQL too when PALESTRA_TEST_PG_URL is set (tests/databases.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from pydantic import ValidationError

from curriculum.config import SelectionConfig
from curriculum.prompts import PromptSelector, step_deltas
from curriculum.store import StatsStore
from curriculum.types import Outcome
from domains.api import Task
from databases import DATABASES, empty_database

CONF = Path(__file__).resolve().parents[1] / "conf" / "selection"
G = 8  # completions per group


def _task(i: int, domain: str = "ds", level: int = 0) -> Task:
    return Task(domain=domain, level=level, prompt=[{"role": "user", "content": f"q{i}"}], payload={"a": i},
                id=f"{domain}-{i}")


def _outcomes(groups: list[tuple[Task, list[float]]]) -> list[Outcome]:
    """One group per (task, rewards) entry, group index = position in the list."""
    return [Outcome(domain=t.domain, level=t.level, task_id=t.id, group=g, reward=r, correct=r >= 1.0, status="ok")
            for g, (t, rewards) in enumerate(groups) for r in rewards]


def _selector(*modes: str, seed: int = 0, **knobs) -> PromptSelector:
    return PromptSelector(SelectionConfig(mode=list(modes), **knobs), seed=seed)


ALL_RIGHT, ALL_WRONG, HALF = [1.0] * G, [0.0] * G, [1.0, 0.0] * (G // 2)


# -- per-step summaries ---------------------------------------------------------------------------
def test_step_deltas_count_groups_and_trailing_runs():
    a, b = _task(0), _task(1)
    # a: all-wrong, then mixed, then all-correct twice -> tail_correct 2, tail_wrong 0
    # b: one group of equal partial rewards: neither all-correct nor all-wrong
    deltas = {d["task_id"]: d for d in step_deltas(_outcomes(
        [(a, ALL_WRONG), (a, HALF), (a, ALL_RIGHT), (a, ALL_RIGHT), (b, [0.5] * G)]))}
    assert deltas[a.id] == dict(domain="ds", task_id=a.id, attempts=4 * G, successes=2 * G + G // 2, groups=4,
                                tail_correct=2, tail_wrong=0)
    assert (deltas[b.id]["successes"], deltas[b.id]["tail_correct"], deltas[b.id]["tail_wrong"]) == (0, 0, 0)


def test_streaks_carry_across_steps_and_reset():
    sel, a = _selector("streak"), _task(0)
    sel.record(1, _outcomes([(a, ALL_RIGHT), (a, ALL_RIGHT)]))
    sel.record(2, _outcomes([(a, ALL_RIGHT)]))
    s = sel.stats(a.id)
    assert (s.all_correct_streak, s.all_wrong_streak, s.groups, s.last_step) == (3, 0, 3, 2)
    sel.record(3, _outcomes([(a, ALL_WRONG)]))
    assert (s.all_correct_streak, s.all_wrong_streak) == (0, 1)
    sel.record(4, _outcomes([(a, HALF)]))
    assert (s.all_correct_streak, s.all_wrong_streak, s.attempts, s.successes) == (0, 0, 5 * G, 3 * G + G // 2)


# -- streak -----------------------------------------------------------------------------------------
def test_skip_probability_by_hand():
    sel, a = _selector("streak", streak_threshold=2, skip_prob=0.5, skip_decay=0.9), _task(0)
    assert sel.skip_probability(None, 5) == 0.0  # unseen: always eligible
    sel.record(1, _outcomes([(a, ALL_WRONG)]))
    assert sel.skip_probability(sel.stats(a.id), 2) == 0.0  # streak 1 < threshold 2
    sel.record(2, _outcomes([(a, ALL_WRONG)]))
    assert sel.skip_probability(sel.stats(a.id), 3) == pytest.approx(0.5)  # 1 - 0.5^1
    sel.record(3, _outcomes([(a, ALL_WRONG)]))
    assert sel.skip_probability(sel.stats(a.id), 4) == pytest.approx(0.75)  # 1 - 0.5^2
    assert sel.skip_probability(sel.stats(a.id), 14) == pytest.approx(0.75 * 0.9 ** 10)  # 10 idle steps


def test_streak_skips_long_streaks_and_lets_them_back_in_over_time():
    sel = _selector("streak", streak_threshold=2, skip_prob=0.5, skip_decay=0.99)
    stale, fresh = _task(0), [_task(i) for i in range(1, 4)]
    sel.record(1, _outcomes([(stale, ALL_RIGHT)] * 6))  # 6 all-correct groups: skip chance 1 - 0.5^5
    candidates = [stale, *fresh]

    def share_chosen(step: int) -> float:
        hits = [stale in _chooser(sel, k).choose("ds", 0, candidates, 2, step) for k in range(300)]
        return float(np.mean(hits))

    assert _selector().choose("ds", 0, candidates, 2, 2)[0] is stale  # no rule: the first n
    assert share_chosen(2) < 0.08  # skipped ~97% of the time right after the streak
    assert share_chosen(400) > 0.9  # 399 idle steps: 0.97 * 0.99^399 ~ 0.02 skip chance


def _chooser(sel: PromptSelector, seed: int) -> PromptSelector:
    other = PromptSelector(sel.cfg, seed=seed)
    other.load_state_dict(sel.state_dict())
    return other


# -- beta -----------------------------------------------------------------------------------------
def test_beta_prefers_prompts_near_one_half():
    sel = _selector("beta")
    mastered, hopeless, middle = _task(0), _task(1), _task(2)
    for step in range(1, 6):
        sel.record(step, _outcomes([(mastered, ALL_RIGHT), (hopeless, ALL_WRONG), (middle, HALF)]))
    picks = [sel.choose("ds", 0, [mastered, hopeless, middle], 1, step)[0] for step in range(6, 206)]
    assert sum(p is middle for p in picks) / len(picks) > 0.95


def test_beta_trains_on_fewer_zero_variance_groups_than_no_selection():
    """A pool where a third of the prompts is solved, a third hopeless, a third 50/50: the Beta
    rule learns which is which and spends fewer groups on the uninformative ones."""
    true_p = {i: (0.0, 0.5, 1.0)[i % 3] for i in range(60)}
    tasks = [_task(i) for i in true_p]

    def zero_variance_share(sel: PromptSelector) -> float:
        rng, flat = np.random.default_rng(0), []
        for step in range(1, 41):
            offer = [tasks[i] for i in rng.choice(len(tasks), 16, replace=False)]
            chosen = sel.choose("ds", 0, offer, 4, step)
            groups = [(t, list((rng.random(G) < true_p[int(t.id.split("-")[1])]).astype(float))) for t in chosen]
            flat += [len(set(r)) == 1 for _, r in groups]
            sel.record(step, _outcomes(groups))
        return float(np.mean(flat[-80:]))  # the last 20 steps

    beta, plain = zero_variance_share(_selector("beta")), zero_variance_share(_selector())
    assert plain > 0.55 and beta < plain - 0.2


# -- retire ---------------------------------------------------------------------------------------
def test_retirement_threshold_and_minimum_attempts():
    sel = _selector("retire", retire_threshold=0.9, retire_min_attempts=16)
    a, b, c = _task(0), _task(1), _task(2)
    sel.record(1, _outcomes([(a, ALL_RIGHT), (a, [1.0] * 7 + [0.0]),  # 15/16 = 0.94: retired
                             (b, ALL_RIGHT), (b, [1.0] * 6 + [0.0] * 2),  # 14/16 = 0.875: active
                             (c, ALL_RIGHT)]))  # 8/8 but under 16 attempts: active
    assert sel._retired([sel.stats(t.id) for t in (a, b, c)]).tolist() == [True, False, False]


def test_retirement_keeps_mastered_prompts_out_but_replays_a_share():
    mastered, learning = [_task(i) for i in range(4)], [_task(i) for i in range(4, 12)]
    history = _outcomes([(t, ALL_RIGHT) for t in mastered for _ in range(2)] + [(t, HALF) for t in learning])

    def mastered_share(replay_share: float) -> float:
        sel = _selector("retire", replay_share=replay_share, retire_min_attempts=16)
        sel.record(1, history)
        picks = [t for step in range(2, 202) for t in sel.choose("ds", 0, mastered + learning, 4, step)]
        return sum(t in mastered for t in picks) / len(picks)

    assert mastered_share(0.0) == 0.0
    assert _selector().choose("ds", 0, mastered + learning, 4, 2) == mastered  # no rule: all mastered
    assert 0.15 < mastered_share(0.25) < 0.35  # 0.25 of the picks on average, not more


def test_a_replayed_prompt_that_fails_comes_back():
    sel, a = _selector("retire", replay_share=0.0, retire_min_attempts=16), _task(0)
    sel.record(1, _outcomes([(a, ALL_RIGHT), (a, ALL_RIGHT)]))
    assert sel._retired([sel.stats(a.id)]).tolist() == [True]
    sel.record(2, _outcomes([(a, ALL_WRONG)]))  # 16/24 < 0.9
    assert sel._retired([sel.stats(a.id)]).tolist() == [False]


def test_choose_fills_from_filtered_prompts_when_nothing_else_is_left():
    sel = _selector("retire", "streak", replay_share=0.0, retire_min_attempts=8)
    tasks = [_task(i) for i in range(3)]
    sel.record(1, _outcomes([(t, ALL_RIGHT) for t in tasks]))
    assert sel.choose("ds", 0, tasks, 2, 2) == tasks[:2]
    assert len(sel.choose("ds", 0, [tasks[0]] * 3, 2, 2)) == 2  # duplicates pad a short offer


# -- modes, domains, config -----------------------------------------------------------------------
def test_no_rule_takes_the_first_n_and_records_nothing():
    sel = _selector()
    tasks = [_task(i) for i in range(8)]
    assert sel.choose("ds", 0, tasks, 3, 1) == tasks[:3] and sel.candidates("ds", 3) == 3
    sel.record(1, _outcomes([(tasks[0], ALL_RIGHT)]))
    assert sel.stats(tasks[0].id) is None


def test_untracked_domains_are_left_alone():
    sel = _selector("beta", domains=["ds"])
    other = [_task(i, domain="gen") for i in range(8)]
    assert sel.candidates("gen", 3) == 3 and sel.candidates("ds", 3) == 12
    assert sel.choose("gen", 0, other, 3, 1) == other[:3]
    sel.record(1, _outcomes([(other[0], ALL_RIGHT), (_task(0), HALF)]))
    assert sel.stats(other[0].id) is None and sel.stats("ds-0").attempts == G


def test_selection_config_modes_and_files():
    assert SelectionConfig(mode="none").mode == () and not SelectionConfig().active
    assert SelectionConfig(mode="beta").mode == ("beta",)
    assert SelectionConfig(mode=["streak", "retire"]).mode == ("streak", "retire")
    for bad in ({"mode": "greso"}, {"mode": ["beta", "beta"]}, {"skip_probability": 0.5}, {"replay_share": 1.0}):
        with pytest.raises(ValidationError):
            SelectionConfig(**bad)
    for path in sorted(CONF.glob("*.yaml")):
        cfg = SelectionConfig.model_validate(OmegaConf.to_container(OmegaConf.load(path)))
        assert cfg.mode == (() if path.stem == "none" else (path.stem,))
    assert {p.stem for p in CONF.glob("*.yaml")} == {"none", "streak", "beta", "retire"}


# -- determinism and state ------------------------------------------------------------------------
def _history(sel: PromptSelector, steps: range, seed: int = 0) -> list[list[str]]:
    """Run ``sel`` on a small synthetic pool; returns the ids chosen each step."""
    rng = np.random.default_rng(seed)
    tasks = [_task(i) for i in range(20)]
    p = np.linspace(0, 1, 20)
    chosen_ids = []
    for step in steps:
        offer = [tasks[i] for i in rng.choice(20, 12, replace=False)]
        chosen = sel.choose("ds", 0, offer, 3, step)
        chosen_ids.append([t.id for t in chosen])
        groups = [(t, list((rng.random(G) < p[int(t.id.split("-")[1])]).astype(float))) for t in chosen]
        sel.record(step, _outcomes(groups))
    return chosen_ids


@pytest.mark.parametrize("modes", [("streak",), ("beta",), ("retire",), ("streak", "beta", "retire")])
def test_same_seed_same_choices(modes):
    knobs = dict(retire_min_attempts=8, replay_share=0.2)
    first = _history(_selector(*modes, seed=3, **knobs), range(1, 31))
    assert first == _history(_selector(*modes, seed=3, **knobs), range(1, 31))
    if "beta" in modes:
        assert first != _history(_selector(*modes, seed=4, **knobs), range(1, 31))


def test_state_round_trip_continues_identically():
    sel = _selector("streak", "beta", "retire", seed=1, retire_min_attempts=8, discount=0.8)
    _history(sel, range(1, 16))
    state = json.loads(json.dumps(sel.state_dict()))  # checkpoints may store it as JSON
    copy = _selector("streak", "beta", "retire", seed=1, retire_min_attempts=8, discount=0.8)
    copy.load_state_dict(state)
    assert copy.state_dict() == sel.state_dict()
    assert _history(copy, range(16, 31), seed=9) == _history(sel, range(16, 31), seed=9)
    with pytest.raises(ValueError, match="not after"):
        sel.record(30, [])


# -- the store ------------------------------------------------------------------------------------
@pytest.fixture(params=DATABASES)
def store(request, tmp_path):
    s = StatsStore(empty_database(request.param, tmp_path))
    yield s
    s.close()


def _stored(store: StatsStore, run_id: str) -> dict[str, dict]:
    return {r["task_id"]: {k: v for k, v in r.items() if k != "run_id"} for r in store.prompt_stats(run_id)}


def _memory(sel: PromptSelector) -> dict[str, dict]:
    keys = ("attempts", "successes", "groups", "all_correct_streak", "all_wrong_streak", "last_step")
    return {i: {"domain": s.domain, "task_id": i, **{k: getattr(s, k) for k in keys}} for i, s in sel.prompts.items()}


def test_store_totals_match_memory_and_hand_counts(store):
    run_id = store.start_run("demo", {}, seed=0)
    sel = PromptSelector(SelectionConfig(mode="streak"), store=store, run_id=run_id)
    a, b = _task(0), _task(1)
    sel.record(1, _outcomes([(a, ALL_RIGHT), (b, HALF)]))
    sel.record(2, _outcomes([(a, ALL_RIGHT), (a, ALL_RIGHT)]))
    sel.record(3, _outcomes([(b, ALL_WRONG)]))
    stored = _stored(store, run_id)
    assert stored == _memory(sel)
    assert stored[a.id] == dict(domain="ds", task_id=a.id, attempts=3 * G, successes=3 * G, groups=3,
                                all_correct_streak=3, all_wrong_streak=0, last_step=2)
    assert stored[b.id] == dict(domain="ds", task_id=b.id, attempts=2 * G, successes=G // 2, groups=2,
                                all_correct_streak=0, all_wrong_streak=1, last_step=3)
    assert store.prompt_stats(run_id, domain="other") == []


def test_rerecording_a_step_replaces_it(store):
    run_id = store.start_run("demo", {}, seed=0)
    a, b = _task(0), _task(1)
    store.write_prompt_step(run_id, 1, step_deltas(_outcomes([(a, ALL_RIGHT)])))
    once = _stored(store, run_id)
    store.write_prompt_step(run_id, 1, step_deltas(_outcomes([(a, ALL_RIGHT)])))
    assert _stored(store, run_id) == once
    store.write_prompt_step(run_id, 1, step_deltas(_outcomes([(b, HALF)])))  # the redo drew another prompt
    assert set(_stored(store, run_id)) == {b.id} and _stored(store, run_id)[b.id]["attempts"] == G


def test_resume_never_double_counts(store):
    """Steps 1-5 recorded, checkpoint at 2, crash; the resumed run redoes 3-4 differently. The
    store must hold exactly what a run that did 1, 2, 3', 4' straight through would hold."""
    mk = lambda run_id: PromptSelector(SelectionConfig(mode=["streak", "beta"]), seed=0, store=store, run_id=run_id)  # noqa: E731
    tasks = [_task(i) for i in range(6)]
    first = {s: _outcomes([(tasks[s % 3], ALL_RIGHT), (tasks[3], HALF)]) for s in range(1, 6)}
    first[5] = _outcomes([(tasks[5], ALL_WRONG), (tasks[3], HALF)])
    redo = {s: _outcomes([(tasks[4], ALL_WRONG), (tasks[3], ALL_RIGHT)]) for s in (3, 4)}

    crashed = store.start_run("crashed", {}, seed=0)
    sel = mk(crashed)
    for step in range(1, 6):
        sel.record(step, first[step])
        if step == 2:
            checkpoint = json.loads(json.dumps(sel.state_dict()))
    resumed = mk(crashed)
    resumed.load_state_dict(checkpoint)
    for step in (3, 4):
        resumed.record(step, redo[step])

    straight = store.start_run("straight", {}, seed=0)
    ref = mk(straight)
    for step, outcomes in ((1, first[1]), (2, first[2]), (3, redo[3]), (4, redo[4])):
        ref.record(step, outcomes)
    assert _stored(store, crashed) == _stored(store, straight) == _memory(ref) == _memory(resumed)
    assert tasks[5].id not in _stored(store, crashed)  # seen only in the crashed tail (step 5)


def test_rebuild_from_store_matches_memory(store):
    run_id = store.start_run("demo", {}, seed=0)
    cfg = SelectionConfig(mode=["streak", "beta", "retire"], retire_min_attempts=8, discount=0.9)
    sel = PromptSelector(cfg, seed=5, store=store, run_id=run_id)
    _history(sel, range(1, 21))
    rebuilt = PromptSelector(cfg, seed=5, store=store, run_id=run_id)
    rebuilt.rebuild_from_store(store, run_id)
    assert _close(rebuilt.state_dict(), sel.state_dict())
    partial = PromptSelector(cfg, seed=5)
    partial.rebuild_from_store(store, run_id, until_step=10)
    again = PromptSelector(cfg, seed=5)
    _history(again, range(1, 11))
    assert _close(partial.state_dict(), again.state_dict())


def _close(a: dict, b: dict) -> bool:
    """Equal states whatever the order of the prompts; the discounted Beta parameters up to rounding."""
    def by_id(columns: dict) -> dict:
        keys = [k for k in columns if k != "ids"]
        return {i: [columns[k][n] for k in keys] for n, i in enumerate(columns["ids"])}

    x, y = by_id(a["prompts"]), by_id(b["prompts"])
    same = all(x[i][:-2] == y[i][:-2] and np.allclose(x[i][-2:], y[i][-2:]) for i in x)
    return {**a, "prompts": None} == {**b, "prompts": None} and x.keys() == y.keys() and same


def test_selection_counts_stay_with_the_step_they_were_drawn_for():
    """The async pipeline draws step t+1 before recording step t: t's counts must not take t+1's."""
    sel = _selector("beta")
    sel.choose("ds", 0, [_task(i) for i in range(6)], 2, step=2)
    sel.choose("ds", 0, [_task(i) for i in range(10, 13)], 1, step=3)  # drawn ahead
    assert sel.metrics(2)["selection/ds/considered"] == 6
    assert sel.metrics(3)["selection/ds/considered"] == 3
    assert sel.metrics(3) == {}  # each count is handed out once
    sel.choose("ds", 0, [_task(i) for i in range(4)], 1, step=4)
    assert sel.metrics() == {"selection/ds/considered": 4, "selection/ds/unseen": 4, "selection/ds/skipped": 0,
                             "selection/ds/retired": 0, "selection/ds/replayed": 0}
