"""Difficulty controllers: threshold climbs and falls, target tracking, fixed, state, configs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from curriculum.config import build_difficulty, parse_difficulty
from curriculum.difficulty import CONTROLLERS, LevelTable

CONF = Path(__file__).resolve().parents[1] / "conf"
LEVELS = {"solved": (1, 2, 3, 4), "collapsing": (1, 2, 3, 4), "short": (5, 9)}


def controller(kind: str, **options):
    return build_difficulty(parse_difficulty({"type": kind, **options}), LEVELS)


def step_at_current(ctrl, step: int, attempts: dict[str, int], success_rate: dict[str, float]) -> None:
    """Feed one step in which every domain is attempted only at its current level."""
    t = ctrl.table
    att = np.zeros(t.n_cells)
    suc = np.zeros(t.n_cells)
    for d, name in enumerate(t.domains):
        cell = t.offset[d] + ctrl.idx[d]
        att[cell] = attempts[name]
        suc[cell] = round(attempts[name] * success_rate[name])
    ctrl.update(step, att, suc, suc.copy())


def test_level_table_layout():
    t = LevelTable(LEVELS)
    assert t.n_cells == 10 and t.offset.tolist() == [0, 4, 8]
    assert t.cell[("short", 9)] == 9 and t.domain_of.tolist() == [0] * 4 + [1] * 4 + [2] * 2
    with pytest.raises(ValueError, match="increasing"):
        LevelTable({"x": (2, 1)})


def test_threshold_climbs_on_a_solved_domain_and_falls_on_a_collapsing_one():
    ctrl = controller("threshold", window=16, start_levels={"collapsing": 4})
    assert ctrl.levels().tolist() == [1, 4, 5]
    history = []
    for step in range(12):
        step_at_current(ctrl, step, {"solved": 8, "collapsing": 8, "short": 8},
                        {"solved": 1.0, "collapsing": 0.0, "short": 0.5})
        history.append(ctrl.levels().tolist())
    assert history[0] == [1, 4, 5]  # 8 attempts < window of 16: no decision yet
    assert history[1] == [2, 3, 5]  # 16 attempts: solved rises, collapsing falls, 0.5 stays
    assert history[2] == [2, 3, 5]  # the evidence was cleared on the change
    assert history[-1] == [4, 1, 5]  # bounded by each domain's levels


def test_threshold_uses_only_attempts_at_the_current_level():
    ctrl = controller("threshold", window=4)
    t = ctrl.table
    att = np.zeros(t.n_cells)
    att[t.cell[("solved", 3)]] = 100  # successes at another level must not move level 1
    ctrl.update(0, att, att.copy(), att.copy())
    assert ctrl.levels().tolist() == [1, 1, 5]


def test_target_tracks_a_success_rate():
    ctrl = controller("target", target=0.5, eta=0.5, alpha=2.0)
    step_at_current(ctrl, 0, {"solved": 10, "collapsing": 10, "short": 0},
                    {"solved": 1.0, "collapsing": 0.0, "short": 0.0})
    # T moves by 0.5 * tanh(2 * (1 - 0.5)) = 0.3808 up for solved; collapsing is clipped at 0
    assert ctrl.position[0] == pytest.approx(0.5 * np.tanh(1.0))
    assert ctrl.position[1] == 0.0 and ctrl.position[2] == 0.0  # short: no attempts, no move
    for step in range(1, 20):
        step_at_current(ctrl, step, {"solved": 10, "collapsing": 10, "short": 10},
                        {"solved": 1.0, "collapsing": 0.0, "short": 1.0})
    assert ctrl.levels().tolist() == [4, 1, 9]


def test_fixed_stays_put_and_replay_share_points_below():
    ctrl = controller("fixed", level=2, start_levels={"short": 9}, replay_share=0.25)
    step_at_current(ctrl, 0, {"solved": 8, "collapsing": 8, "short": 8},
                    {"solved": 1.0, "collapsing": 1.0, "short": 1.0})
    assert ctrl.levels().tolist() == [2, 2, 9]
    assert ctrl.replay().tolist() == [0.25, 0.25, 0.25]
    with pytest.raises(ValueError, match="no level 2"):
        build_difficulty(parse_difficulty({"type": "fixed", "level": 2}), {"x": (1, 3)})
    low = controller("fixed", replay_share=0.25)
    assert low.replay().tolist() == [0.0, 0.0, 0.0]  # nothing below the easiest level


def test_learnability_spreads_over_levels_by_p_times_one_minus_p():
    ctrl = controller("learnability", floor=0.2, window=32)
    shares = ctrl.shares()
    # unseen levels are all at p = 0.5: an even spread
    assert np.allclose(shares[:4], 0.25) and np.allclose(shares[8:], 0.5)
    t = ctrl.table
    att, suc = np.zeros(t.n_cells), np.zeros(t.n_cells)
    rates = [1.0, 0.5, 0.0, 0.0]  # "solved": level 1 mastered, level 2 half right, 3 and 4 never
    att[:4] = 30
    suc[:4] = [30 * r for r in rates]
    ctrl.update(0, att, suc, suc.copy())
    p = (suc[:4] + 1) / (att[:4] + 2)  # Laplace estimates: 31/32, 16/32, 1/32, 1/32
    score = p * (1 - p)
    expected = 0.8 * score / score.sum() + 0.2 / 4
    shares = ctrl.shares()
    assert np.allclose(shares[:4], expected)
    assert shares[1] > 0.6 and shares[0] >= 0.05 and ctrl.levels()[0] == 2  # level 2 leads, none dropped
    assert np.allclose(np.bincount(t.domain_of, weights=shares), 1.0)


def test_scheduler_splits_a_domain_over_levels_by_the_shares():
    from curriculum.config import parse_policy
    from curriculum.scheduler import Scheduler
    sched = Scheduler({"a": (1, 2, 3, 4)}, parse_policy({"type": "uniform"}),
                      parse_difficulty({"type": "learnability", "floor": 0.0}), prompts_per_step=8, seed=3)
    totals = np.zeros(4)
    for step in range(50):
        plan = sched.plan(step)
        assert sum(plan.counts.values()) == 8
        for (_, level), n in plan.counts.items():
            totals[level - 1] += n
    assert np.allclose(totals / totals.sum(), 0.25, atol=0.03)  # even shares, exact counts each step


@pytest.mark.parametrize("kind", sorted(CONTROLLERS))
def test_state_round_trip(kind):
    ctrl = controller(kind)
    for step in range(10):
        step_at_current(ctrl, step, {"solved": 8, "collapsing": 8, "short": 8},
                        {"solved": 0.9, "collapsing": 0.1, "short": 0.6})
    other = controller(kind)
    other.load_state_dict(json.loads(json.dumps(ctrl.state_dict())))
    assert other.state_dict() == ctrl.state_dict()


PRESETS = {"frontier": "threshold"}  # yaml files that set another controller's parameters


@pytest.mark.parametrize("path", sorted((CONF / "difficulty").glob("*.yaml")), ids=lambda p: p.stem)
def test_difficulty_yaml_validates(path):
    cfg = parse_difficulty(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    assert cfg.type == PRESETS.get(path.stem, path.stem)
    build_difficulty(cfg, LEVELS)


def test_every_controller_has_a_yaml_and_typos_fail():
    assert {p.stem for p in (CONF / "difficulty").glob("*.yaml")} - set(PRESETS) == set(CONTROLLERS)
    with pytest.raises(Exception, match="raise_abov"):
        parse_difficulty({"type": "threshold", "raise_abov": 0.8})
    with pytest.raises(ValueError):
        build_difficulty(parse_difficulty({"type": "threshold", "raise_above": 0.2, "lower_below": 0.5}), LEVELS)
