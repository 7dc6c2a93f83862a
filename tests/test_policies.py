"""Mixing policies: one behavioural test per policy, the wrapper's guarantees, state, configs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from curriculum.config import build_policy, parse_policy
from curriculum.policies import POLICIES, Exp3Policy, ThompsonPolicy
from curriculum.signals import Signals, StepCounts

CONF = Path(__file__).resolve().parents[1] / "conf"
ALL_TYPES = sorted(POLICIES)


def feed(signals: Signals, step: int, attempts, successes, abs_adv=None, groups=None) -> StepCounts:
    """Fold one synthetic step into ``signals``: per-domain attempts, successes and mean |A|."""
    att = np.asarray(attempts, dtype=float)
    suc = np.asarray(successes, dtype=float)
    adv = np.zeros_like(att) if abs_adv is None else np.asarray(abs_adv, dtype=float)
    grp = att / 8 if groups is None else np.asarray(groups, dtype=float)
    counts = StepCounts(attempts=att, successes=suc, reward_sum=suc.copy(), abs_adv_sum=adv * att,
                        zero_var_groups=np.zeros_like(att), groups=grp)
    signals.update(step, counts)
    return counts


def run(policy, signals: Signals, step: int) -> np.ndarray:
    """One plan/record cycle as the scheduler does it: weights, then update with what was used."""
    w = policy.weights(signals, step)
    policy.update(signals, step, w)
    return w


def make(kind: str, domains, **options):
    return build_policy(parse_policy({"type": kind, **options}), list(domains), seed=3)


def test_uniform_is_uniform():
    s = Signals(["a", "b", "c", "d"])
    feed(s, 0, [8, 8, 8, 8], [8, 0, 4, 2])
    assert np.allclose(make("uniform", s.domains).weights(s, 1), 0.25)


def test_fixed_uses_names_and_suggests_on_typos():
    s = Signals(["math", "code", "tools"])
    w = make("fixed", s.domains, weights={"math": 3.0, "code": 1.0}, default=0.0).weights(s, 0)
    assert np.allclose(w, [0.75, 0.25, 0.0])
    with pytest.raises(ValueError, match="did you mean 'math'"):
        make("fixed", s.domains, weights={"maths": 1.0})


def test_learnability_prefers_half_solved_over_solved_and_hopeless():
    s = Signals(["half", "never", "always", "unseen"])
    feed(s, 0, [16, 16, 16, 0], [8, 0, 16, 0])
    w = make("learnability", s.domains, floor=0.0).weights(s, 1)
    assert w[0] > 100 * w[1] and w[0] > 100 * w[2]
    assert w[3] == pytest.approx(w[0])  # unseen counts as p = 0.5


def test_learnability_default_keeps_a_floor():
    s = Signals(["half", "never", "always"])
    feed(s, 0, [16, 16, 16], [8, 0, 16])
    policy = make("learnability", s.domains)  # the config default floor, 0.1 of the uniform share
    w = policy.weights(s, 1)
    assert w.min() >= 0.1 / 3 - 1e-12 and w.sum() == pytest.approx(1.0)


def test_prioritized_prefers_failing_domains():
    s = Signals(["easy", "hard"])
    feed(s, 0, [10, 10], [9, 1])
    w = make("prioritized", s.domains).weights(s, 1)
    assert w[1] > 5 * w[0]


def test_dump_tries_unseen_domains_first():
    s = Signals(["a", "b", "new"])
    for step in range(5):
        feed(s, step, [64, 64, 0], [32, 32, 0], abs_adv=[0.9, 0.9, 0.0], groups=[8, 8, 0])
    w = make("dump", s.domains).weights(s, 5)
    assert w.argmax() == 2 and w[2] > 0.9


@pytest.mark.parametrize("kind", ["dump", "sec"])
def test_dump_and_sec_favour_high_abs_advantage(kind):
    s = Signals(["learnable", "flat"])
    policy = make(kind, s.domains)
    for step in range(6):
        feed(s, step, [32, 32], [16, 32], abs_adv=[0.9, 0.1], groups=[4, 4])
        w = run(policy, s, step + 1)
    assert w[0] > 2 * w[1]


def test_sec_q_is_an_ema_of_abs_advantage():
    s = Signals(["a", "b"])
    policy = make("sec", s.domains, alpha=0.5).inner
    feed(s, 0, [8, 0], [4, 0], abs_adv=[0.8, 0.0])
    policy.update(s, 0, np.array([0.5, 0.5]))
    feed(s, 1, [8, 0], [4, 0], abs_adv=[0.4, 0.0])
    policy.update(s, 1, np.array([0.5, 0.5]))
    # Q_a: 0 -> 0.5*0.8 = 0.4 -> 0.4 + 0.5*(0.4 - 0.4) = 0.4; Q_b never observed stays 0
    assert np.allclose(policy.q, [0.4, 0.0])


def test_tscl_reacts_to_forgetting():
    s = Signals(["stable", "forgetting", "idle"], window=8)
    policy = make("tscl", s.domains)
    for step in range(8):
        feed(s, step, [20, 20, 0], [18, 18 - 2 * step, 0])  # 0.9 flat vs 0.9 falling to 0.2
    w = policy.weights(s, 8)
    assert s.success_slope[1] < 0 and w.argmax() == 1 and w[1] > 0.8
    greedy = make("tscl", s.domains, mode="egreedy", epsilon=0.3).weights(s, 8)
    assert greedy[1] == pytest.approx(0.7 + 0.1) and greedy[0] == pytest.approx(0.1)


def test_exp3_exploration_decays():
    s = Signals(["a", "b", "c", "d"])
    policy = make("exp3", s.domains)
    inner: Exp3Policy = policy.inner
    rates = [inner.exploration(t) for t in (1, 10, 100, 1000)]
    assert rates == sorted(rates, reverse=True) and rates[0] == pytest.approx(0.25)
    assert rates[-1] == pytest.approx(np.sqrt(np.log(4) / 4000))
    mins = []
    for step in range(200):
        feed(s, step, [16, 16, 16, 16], [8, 8, 8, 8], abs_adv=[0.9, 0.1, 0.1, 0.1], groups=[2, 2, 2, 2])
        mins.append(run(policy, s, step).min())
    assert mins[-1] < mins[10] < 0.25  # exploration share shrinks as t grows
    assert policy.weights(s, 200).argmax() == 0


def test_thompson_variance_inflation_revisits_stale_domains():
    def stale_share(inflation: float) -> float:
        s = Signals(["good", "stale"])
        policy = build_policy(parse_policy({"type": "thompson", "inflation": inflation, "floor": 0.0,
                                            "draws": 64}), s.domains, seed=0)
        inner: ThompsonPolicy = policy.inner
        for step in range(5):  # both observed: good has utility ~0.6, stale ~0.3
            feed(s, step, [16, 16], [8, 8], abs_adv=[0.6, 0.3])
            run(policy, s, step)
        var_before = inner.var[1]
        shares = []
        for step in range(5, 80):  # only `good` is observed from now on
            feed(s, step, [16, 0], [8, 0], abs_adv=[0.6, 0.0])
            shares.append(run(policy, s, step)[1])
        if inflation > 0:
            assert inner.var[1] > 5 * var_before
        return float(np.mean(shares[-30:]))

    assert stale_share(0.02) > stale_share(0.0) + 0.05


def test_thompson_is_reproducible_for_a_step():
    s = Signals(["a", "b", "c"])
    policy = make("thompson", s.domains)
    assert np.array_equal(policy.weights(s, 4), policy.weights(s, 4))


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_floor_and_cap_hold_under_every_policy(kind):
    rng = np.random.default_rng(0)
    domains = [f"d{i}" for i in range(6)]
    s = Signals(domains)
    extra = {"weights": {"d0": 1.0}, "default": 0.0} if kind == "fixed" else {}
    policy = make(kind, domains, floor=0.3, cap=0.4, **extra)
    for step in range(40):
        att = rng.integers(0, 20, size=6).astype(float)
        feed(s, step, att, np.floor(att * rng.random(6)), abs_adv=rng.random(6))
        w = run(policy, s, step)
        assert w.sum() == pytest.approx(1.0)
        assert w.min() >= 0.3 / 6 - 1e-12, (kind, step, w)
        assert w.max() <= 0.4 + 1e-12, (kind, step, w)


def test_pinned_shares_warmup_and_smoothing():
    domains = ["math", "code", "tools"]
    s = Signals(domains)
    policy = make("fixed", domains, weights={"code": 1.0}, default=0.0, pinned={"tools": 0.2},
                  warmup_steps=2, smoothing=0.5)
    w0 = run(policy, s, 0)  # warm-up: uniform over the unpinned domains, tools pinned at 0.2
    assert np.allclose(w0, [0.4, 0.4, 0.2])
    feed(s, 0, [8, 8, 8], [4, 4, 4])
    w1 = run(policy, s, 1)  # one step recorded: still warming up
    assert np.allclose(w1, w0)
    feed(s, 1, [8, 8, 8], [4, 4, 4])
    w2 = run(policy, s, 2)  # after warm-up: raw [0, 0.8, 0.2], half of the previous weights kept
    assert np.allclose(w2, 0.5 * w1 + 0.5 * np.array([0.0, 0.8, 0.2]))
    with pytest.raises(ValueError, match="did you mean 'tools'"):
        make("uniform", domains, pinned={"tool": 0.1})
    with pytest.raises(ValueError, match="cap"):
        make("uniform", domains, cap=0.2)


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_state_round_trip(kind):
    rng = np.random.default_rng(1)
    domains = ["a", "b", "c"]
    s = Signals(domains)
    policy = make(kind, domains, smoothing=0.3)
    for step in range(7):
        feed(s, step, [8, 8, 8], rng.integers(0, 9, size=3), abs_adv=rng.random(3))
        run(policy, s, step)
    state = json.loads(json.dumps(policy.state_dict()))  # plain JSON all the way
    other = make(kind, domains, smoothing=0.3)
    other.load_state_dict(state)
    assert np.array_equal(other.weights(s, 7), policy.weights(s, 7))


def test_signals_windows_slopes_and_state():
    s = Signals(["a", "b"], window=4, ema_alpha=0.5)
    for step, k in enumerate([2, 4, 6, 8, 10]):
        feed(s, step, [10, 0], [k, 0], abs_adv=[0.5, 0.0])
    # window holds steps 1..4: successes 4+6+8+10 of 40; slope of 0.4, 0.6, 0.8, 1.0 is 0.2 per step
    assert s.success[0] == pytest.approx(0.7) and np.isnan(s.success[1])
    assert s.success_slope[0] == pytest.approx(0.2) and s.success_slope[1] == 0.0
    assert s.attempts[0] == 50 and s.mean_abs_adv[0] == pytest.approx(0.5)
    # EMA with alpha 0.5 from 0.2: 0.3, 0.45, 0.625, 0.8125
    assert s.ema_success[0] == pytest.approx(0.8125)
    feed(s, 9, [10, 10], [0, 5])  # a gap of 4 steps empties the window first
    assert s.success[0] == 0.0 and s.success[1] == 0.5
    copy = Signals(["a", "b"], window=4, ema_alpha=0.5)
    copy.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert np.array_equal(copy.success_slope, s.success_slope) and np.array_equal(copy.success, s.success)
    with pytest.raises(ValueError):
        feed(s, 9, [1, 1], [1, 1])


@pytest.mark.parametrize("path", sorted((CONF / "policy").glob("*.yaml")), ids=lambda p: p.stem)
def test_policy_yaml_validates(path):
    cfg = parse_policy(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    assert cfg.type == path.stem
    build_policy(cfg, ["arithmetic", "fractions"], seed=0)


def test_every_policy_has_a_yaml_and_typos_fail():
    assert {p.stem for p in (CONF / "policy").glob("*.yaml")} == set(POLICIES)
    with pytest.raises(Exception, match="temprature"):
        parse_policy({"type": "dump", "temprature": 0.1})
    with pytest.raises(Exception):
        parse_policy({"type": "dumb"})


def test_groups_compose_with_hydra(tmp_path):
    """conf/policy, conf/difficulty and conf/store compose under their keys, with overrides."""
    from hydra import compose, initialize_config_dir

    from curriculum.config import CurriculumConfig

    (tmp_path / "curriculum.yaml").write_text(
        "defaults:\n  - policy: learnability\n  - difficulty: threshold\n  - store: sqlite\n  - _self_\n"
        f"hydra:\n  searchpath:\n    - file://{CONF}\n")
    with initialize_config_dir(str(tmp_path), version_base=None):
        for kind in sorted(POLICIES):
            cfg = compose("curriculum", overrides=[f"policy={kind}", "policy.floor=0.2", "difficulty=target"])
            parsed = CurriculumConfig.model_validate(OmegaConf.to_container(cfg, resolve=True))
            assert parsed.policy.type == kind and parsed.policy.floor == 0.2
            assert parsed.difficulty.type == "target" and parsed.store.url is None
        typo = compose("curriculum", overrides=["+policy.temprature=0.3"])
        with pytest.raises(Exception, match="temprature"):
            CurriculumConfig.model_validate(OmegaConf.to_container(typo, resolve=True))
