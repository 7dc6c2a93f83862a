"""The simulator: world effects, the learner's advantages and learning, runs through the production
Scheduler and store, and the Hydra app's config (every scenario and policy composed and validated)."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.types import RunMode

from curriculum.config import ColdStartConfig, parse_difficulty, parse_policy
from curriculum.scheduler import Scheduler
from curriculum.sim.app import CONF_DIR, to_config
from curriculum.sim.config import ScenarioConfig, SimAppConfig, SimConfigError
from curriculum.sim.learner import KINDS, Learner, build_world, sigmoid
from curriculum.sim.runner import run_sim
from curriculum.store import StatsStore

POLICIES = ["uniform", "fixed", "prioritized", "learnability", "dump", "sec", "thompson", "tscl", "exp3"]


def scenario(**kw) -> ScenarioConfig:
    base = dict(domains=20, levels=3, steps=20, prompts_per_step=8, group_size=4, cluster_size=5)
    return ScenarioConfig(**{**base, **kw})


def app_config(policy="uniform", seed=0, **kw) -> SimAppConfig:
    return SimAppConfig(sim=scenario(**kw), policy=parse_policy({"type": policy}),
                        difficulty=parse_difficulty({"type": "threshold"}), seed=seed)


# -- world --------------------------------------------------------------------------------------------
def test_world_is_a_function_of_the_seed_and_carries_each_effect():
    cfg = scenario(unlearnable_share=0.1, noisy_share=0.1, prerequisite_share=0.2, forgetting_share=0.5,
                   transfer_neg=0.1, negative_pairs=2, size_min=10, size_max=100)
    a, b, c = build_world(cfg, 1), build_world(cfg, 1), build_world(cfg, 2)
    np.testing.assert_array_equal(a.theta0, b.theta0)
    np.testing.assert_array_equal(a.transfer, b.transfer)
    assert not np.array_equal(a.theta0, c.theta0)
    counts = {k: int((a.kind == KINDS.index(k)).sum()) for k in KINDS}
    assert counts == {"plain": 12, "unlearnable": 2, "noisy": 2, "locked": 4}
    assert (a.kind[::5] == 0).all()  # cluster foundations stay plain
    assert (a.prereq[a.kind == KINDS.index("locked")] % 5 == 0).all()
    assert (a.transfer > 0).any() and (a.transfer < 0).any() and np.diag(a.transfer).sum() == 0
    cluster = np.arange(20) // 5
    assert (a.transfer[cluster[:, None] != cluster[None, :]] <= 0).all()  # only negative across clusters
    assert ((a.size >= 10) & (a.size <= 100)).all()
    assert (a.lr[a.frozen | a.noisy] == 0).all() and (a.forget > 0).sum() > 0


# -- learner ------------------------------------------------------------------------------------------
def test_advantages_are_mean_centred_and_std_normalised_per_group():
    world = build_world(scenario(theta0_std=0.0), 0)
    learner = Learner(world, seed=0, group_size=8)
    out = learner.rollout(np.arange(20), np.zeros(20, dtype=np.int64))
    np.testing.assert_allclose(out.advantage.mean(axis=1), 0.0, atol=1e-9)
    p = out.reward.mean(axis=1)
    mixed = (p > 0) & (p < 1)
    assert mixed.any()
    # with 0/1 rewards, mean |A| = 2 sqrt(p(1-p)) / (std + eps) * std = 2 sqrt(p(1-p)) up to eps
    np.testing.assert_allclose(np.abs(out.advantage[mixed]).mean(axis=1), 2 * np.sqrt(p[mixed] * (1 - p[mixed])),
                               rtol=1e-3)
    assert (out.advantage[~mixed] == 0).all()


def test_heldout_is_the_model_mean_over_levels():
    world = build_world(scenario(), 0)
    learner = Learner(world, 0, 4)
    expected = np.mean([sigmoid(world.slope * (learner.theta - b)) for b in world.b], axis=0)
    np.testing.assert_allclose(learner.heldout(), expected)


def test_learning_grows_with_learnability_and_respects_the_effects():
    cfg = scenario(domains=10, cluster_size=5, unlearnable_share=0.1, noisy_share=0.1, prerequisite_share=0.1,
                   transfer_pos=0.0, lr=0.1, lr_spread=0.0, theta0_std=0.0)
    world = build_world(cfg, 3)
    learner = Learner(world, 3, 8)
    kinds = {k: np.nonzero(world.kind == KINDS.index(k))[0] for k in KINDS}
    plain, frozen, noisy, locked = (int(kinds[k][0]) for k in ("plain", "unlearnable", "noisy", "locked"))
    before = learner.theta.copy()
    domains = np.array([plain] * 4 + [frozen] * 4 + [noisy] * 4 + [locked] * 4)
    for _ in range(20):
        learner.learn(learner.rollout(domains, np.zeros(len(domains), dtype=np.int64)))
    gain = learner.theta - before
    assert gain[plain] > 0.5
    assert gain[frozen] == 0 and gain[noisy] == 0
    assert 0 < gain[locked] < 0.2 * gain[plain]  # its prerequisite is far below unlock_theta


def test_all_agreeing_groups_teach_nothing():
    world = build_world(scenario(transfer_pos=0.0, theta0_mean=20.0, theta0_std=0.0), 0)
    learner = Learner(world, 0, 8)
    before = learner.theta.copy()
    learner.learn(learner.rollout(np.arange(5), np.zeros(5, dtype=np.int64)))  # p ~ 1: all correct
    np.testing.assert_allclose(learner.theta, before)


def test_refills_replace_agreeing_groups_as_dynamic_sampling_does():
    # the trainer's dynamic sampling: groups whose rewards all agree are left out and replaced by
    # groups of the plan's (domain, level) pairs; all are recorded, only the varied ones train
    from curriculum.sim.runner import rollout_with_refills
    from curriculum.types import rewards_agree

    world = build_world(scenario(theta0_mean=1.0, theta0_std=3.0), 0)
    domain, level = np.arange(16) % 20, np.zeros(16, dtype=np.int64)
    out, kept = rollout_with_refills(Learner(world, 0, 4), domain, level, 2, np.random.default_rng(0))
    assert len(out.domain) > 16 and not rewards_agree(kept.reward).any() and len(kept.domain) <= 16
    assert set(out.domain.tolist()) <= set(domain.tolist())  # refills come from the plan's pairs
    # refill_from="dropped": each group left out is redrawn from its own (domain, level)
    first = Learner(world, 0, 4).rollout(domain, level)
    left_out = set(domain[rewards_agree(first.reward)].tolist())
    out, kept = rollout_with_refills(Learner(world, 0, 4), domain, level, 2, np.random.default_rng(0), "dropped")
    assert set(out.domain[16:].tolist()) <= left_out and len(out.domain) > 16
    assert (np.bincount(kept.domain, minlength=20) <= np.bincount(domain, minlength=20)).all()
    plain, same = rollout_with_refills(Learner(world, 0, 4), domain, level, 0, np.random.default_rng(0))
    assert plain is same and len(plain.domain) == 16
    # a run with refills generates more, trains on more varied groups, and learns more
    with_refills = run_sim(app_config("uniform", 0, refill_rounds=2, theta0_mean=2.0, theta0_std=3.0))
    without = run_sim(app_config("uniform", 0, theta0_mean=2.0, theta0_std=3.0))
    assert with_refills.final_macro > without.final_macro
    assert run_sim(app_config("uniform", 0, refill_rounds=2, theta0_mean=2.0, theta0_std=3.0)).final_macro == \
        with_refills.final_macro


def test_unpractised_domains_forget_and_small_domains_saturate():
    cfg = scenario(domains=4, cluster_size=4, forgetting_share=1.0, forgetting_rate=0.5, transfer_pos=0.0,
                   lr=0.2, lr_spread=0.0, size_min=2, size_max=2, theta0_std=0.0)
    world = build_world(cfg, 0)
    learner = Learner(world, 0, 8)
    learner.theta[1] = 3.0
    learner.learn(learner.rollout(np.array([0, 0]), np.array([0, 0])))
    assert abs(learner.theta[1] - world.theta0[1]) < 3.0 - world.theta0[1]  # not practised: decays
    assert learner.groups_drawn[0] == 2
    # reuse of a 2-prompt domain: the next group is worth 1/sqrt(1 + 2/2) of the first
    learner.theta[0] = world.theta0[0]
    out = learner.rollout(np.array([0]), np.array([0]))
    expected = world.lr[0] / np.sqrt(2.0) * np.abs(out.advantage).mean()
    theta = learner.theta[0]
    learner.learn(out)
    assert learner.theta[0] - theta == pytest.approx(expected)


# -- runs ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("store_results", [False, True])
def test_run_records_every_step_and_the_heldout_metrics(tmp_path, store_results):
    cfg = app_config("sec", seed=4, steps=12, domains_every=5).model_copy(
        update={"sweep_id": "sw", "store_results": store_results})
    with StatsStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        result = run_sim(cfg, store)
        run = store.run(result.run_id)
        metrics = store.metrics(result.run_id)
        # one row per completion, or none when only the aggregates are kept
        assert store.count_results(result.run_id) == (12 * 8 * 4 if store_results else 0)
        assert sum(r["attempts"] for r in store.step_stats(result.run_id)) == 12 * 8 * 4
        assert [r["id"] for r in store.sweep_runs("sw")] == [result.run_id]
    assert run["status"] == "finished" and run["sweep_id"] == "sw" and run["last_step"] == 12
    assert run["config"]["policy"]["type"] == "sec" and "world" in run["config"]
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert metrics[-1]["heldout/macro"] == pytest.approx(result.final_macro)
    assert metrics[-1]["sim/rollouts"] == 12 * 8 * 4
    with_vectors = [m["step"] for m in metrics if "heldout/domains" in m]
    assert with_vectors == [1, 5, 10, 12] and len(metrics[0]["heldout/domains"]) == 20


def test_each_step_logs_the_groups_the_learner_trained_on_per_domain(tmp_path, monkeypatch):
    from curriculum.run_summary import domain_stats

    learned = []
    learn = Learner.learn
    monkeypatch.setattr(Learner, "learn", lambda self, out: (learned.append(out.domain.copy()), learn(self, out)))
    cfg = app_config("uniform", seed=2, steps=6, refill_rounds=1, theta0_mean=2.0, theta0_std=3.0)
    with StatsStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        result = run_sim(cfg, store)
        metrics = store.metrics(result.run_id)
        rows = domain_stats(store, result.run_id, metrics)
    names = [f"d{i:02d}" for i in range(20)]
    for m, domains in zip(metrics, learned, strict=True):
        trained = {k.split("/")[1]: v for k, v in m.items() if k.endswith("/trained")}
        assert trained == {names[d]: n for d, n in enumerate(np.bincount(domains, minlength=20)) if n}
    assert sum(r["planned_share"] for r in rows) == pytest.approx(1.0)
    assert sum(r["trained_share"] for r in rows) == pytest.approx(1.0)
    assert sum(len(d) for d in learned) < 6 * 8  # agreeing groups left out: the trained counts are their own


def test_a_failed_background_write_marks_the_run_failed(tmp_path):
    from curriculum.scheduler import StepWriteFailed

    cfg = app_config("uniform", seed=1, steps=40).model_copy(update={"write_behind": True})
    with StatsStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        write_step = store.write_step

        def fail_at_step_3(run_id, step, *args, **kwargs):
            if step == 3:
                raise ValueError("a row the database refuses")
            write_step(run_id, step, *args, **kwargs)

        store.write_step = fail_at_step_3
        with pytest.raises(StepWriteFailed, match="a row the database refuses"):
            run_sim(cfg, store)  # raised in the loop, by the step after the failed one
        with pytest.raises(StepWriteFailed, match="a row the database refuses"):
            run_sim(cfg.model_copy(update={"sim": cfg.sim.model_copy(update={"steps": 3})}), store)  # at close
        assert [r["status"] for r in store.runs()] == ["failed", "failed"]  # not "running" forever


def test_aggregated_writes_rebuild_the_scheduler_exactly(tmp_path):
    cfg = app_config("thompson", seed=2, steps=15)
    with StatsStore(f"sqlite:///{tmp_path / 'r.db'}") as store:
        result = run_sim(cfg, store)
        world = build_world(cfg.sim, cfg.seed)
        rebuilt = Scheduler({n: tuple(range(cfg.sim.levels)) for n in world.names}, cfg.policy, cfg.difficulty,
                            prompts_per_step=cfg.sim.prompts_per_step, seed=cfg.seed, store=store,
                            run_id=result.run_id)
        rebuilt.rebuild_from_store()
        last = store.plan_vectors(result.run_id)[-1]
    assert rebuilt.last_step == 15
    # the plan the rebuilt scheduler would make next is a pure function of the stored history
    replay = run_sim(cfg.model_copy(update={"sim": cfg.sim.model_copy(update={"steps": 16})}))
    assert replay.steps == 16 and len(last["weights"]) == 20
    assert rebuilt.plan(16).counts == _plan_after(cfg, 15)


def _plan_after(cfg, steps):
    """The live scheduler's plan for step steps + 1, from a run without a store."""
    from curriculum.sim import runner

    captured = {}
    original = runner.Curriculum

    class Spy(original):
        def plan(self, step):
            plan = super().plan(step)
            captured.setdefault(step, plan.counts)
            return plan

    runner.Curriculum = Spy
    try:
        run_sim(cfg.model_copy(update={"sim": cfg.sim.model_copy(update={"steps": steps + 1})}))
    finally:
        runner.Curriculum = original
    return captured[steps + 1]


def test_same_seed_same_run_and_the_policy_matters():
    a, b = run_sim(app_config("uniform", 1)), run_sim(app_config("uniform", 1))
    assert a.final_macro == b.final_macro and a.auc == b.auc
    c = run_sim(app_config("dump", 1))
    assert c.auc != a.auc


def leads_config(hint_form="lead", seed=0, **kw) -> SimAppConfig:
    """Cold domains (p near 0 at the easiest level) that leads can open, hints withdrawn at 30%."""
    cfg = app_config("uniform", seed, domains=6, levels=2, steps=15, theta0_mean=-3.0, theta0_std=0.2,
                     lr=0.1, lr_spread=0.0, cluster_size=6, transfer_pos=0.0, lead_success=0.8, **kw)
    cold = ColdStartConfig(hint_below=0.3, hint_share=1.0, hint_form=hint_form)
    return cfg.model_copy(update={"cold_start": cold, "difficulty": parse_difficulty({"type": "fixed"})})


def test_leads_teach_cold_domains_and_the_scheduler_sees_only_the_unled_half(tmp_path):
    with StatsStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        led = run_sim(leads_config(), store)
        stats = store.step_stats(led.run_id)
    plain = run_sim(leads_config(hint_form="words"))  # hints in words are not modelled: no help
    assert led.final_macro > plain.final_macro + 0.05
    # the led members (G//2 = 2 of each led group) are left out of the counts the policies read
    attempts = sum(r["attempts"] for r in stats)
    assert attempts < 15 * 8 * 4 and attempts % 2 == 0
    assert sum(r["groups"] for r in stats) == 15 * 8


def test_a_lead_with_no_domain_to_lead_fails_in_one_line():
    raw = leads_config().model_dump()
    raw["sim"]["lead_success"] = 0.0
    with pytest.raises(ValueError, match="cold_start.hint_form=lead leads nothing in this scenario"):
        SimAppConfig.model_validate(raw)
    raw["cold_start"]["hint_form"] = "words"  # hints in words are not modelled, and refuse nothing
    assert SimAppConfig.model_validate(raw).sim.lead_success == 0.0


# -- the Hydra app ------------------------------------------------------------------------------------
def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="sim_config", overrides=list(overrides))


@pytest.mark.parametrize("sim", ["small", "hundreds", "huge"])
def test_every_scenario_composes_and_validates(sim):
    cfg = to_config(composed(f"sim={sim}", "store.url=sqlite://", "output_dir=x"))
    assert cfg.sim.name == sim and cfg.sim.domains == {"small": 10, "hundreds": 200, "huge": 1000}[sim]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("difficulty", ["fixed", "threshold", "target"])
def test_every_policy_and_difficulty_compose(policy, difficulty):
    cfg = to_config(composed(f"policy={policy}", f"difficulty={difficulty}", "store.url=sqlite://",
                             "output_dir=x", "sim.steps=7", "seed=3"))
    assert (cfg.policy.type, cfg.difficulty.type, cfg.sim.steps, cfg.seed) == (policy, difficulty, 7, 3)


def test_bad_values_fail_in_one_line():
    with pytest.raises(SimConfigError, match=r"^sim\.steps: Input should be greater"):
        to_config(composed("sim.steps=0", "store.url=sqlite://", "output_dir=x"))
    with pytest.raises(SimConfigError, match=r"^policy\.temprature: Extra inputs"):
        to_config(composed("policy=sec", "+policy.temprature=1", "store.url=sqlite://", "output_dir=x"))
    # a cluster of one has no members: every effect would have piled onto domain 0
    with pytest.raises(SimConfigError, match=r"^sim\.cluster_size: Input should be greater than or equal to 2"):
        to_config(composed("sim.cluster_size=1", "store.url=sqlite://", "output_dir=x"))


def test_write_behind_with_an_in_memory_store_fails_before_the_run():
    with pytest.raises(SimConfigError, match=r"^config: write_behind needs a file or server database"):
        to_config(composed("write_behind=true", "store.url=sqlite://", "output_dir=x"))


@pytest.mark.parametrize("kind", ["not a database", "missing folder"])
def test_an_unusable_store_is_a_one_line_error_of_the_app(tmp_path, kind):
    path = tmp_path / ("notes.db" if kind == "not a database" else "gone/x.db")
    if kind == "not a database":
        path.write_text("notes\n")
    done = subprocess.run([sys.executable, "-m", "curriculum.sim.app", f"store.url=sqlite:///{path}", "sim=small",
                           "sim.steps=2", f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"error: cannot open the stats store sqlite:///{path}: ")
    assert done.stderr.count("\n") == 1, done.stderr


def test_multirun_derives_a_shared_sweep_id_and_database(tmp_path):
    hydra_cfg = SimpleNamespace(mode=RunMode.MULTIRUN, sweep=SimpleNamespace(dir=str(tmp_path / "2026-01-01_00-00-00")),
                                runtime=SimpleNamespace(output_dir=str(tmp_path / "2026-01-01_00-00-00" / "3")))
    cfg = to_config(composed("output_dir=x", "store.url=null"), hydra_cfg)
    assert cfg.sweep_id == "sim/2026-01-01_00-00-00"
    assert cfg.store.url == f"sqlite:///{tmp_path / '2026-01-01_00-00-00' / 'palestra.db'}"
    given = to_config(composed("output_dir=x", "sweep_id=mine", "store.url=sqlite://"), hydra_cfg)
    assert given.sweep_id == "mine" and given.store.url == "sqlite://"
    single = SimpleNamespace(mode=RunMode.RUN, sweep=hydra_cfg.sweep, runtime=hydra_cfg.runtime)
    assert to_config(composed("output_dir=x", "store.url=sqlite://"), single).sweep_id is None


def test_the_optuna_experiment_composes():
    import hydra_plugins.hydra_optuna_sweeper  # noqa: F401  (the tune extra; make test installs it)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="sim_config", overrides=["+experiment=tune_sec"], return_hydra_config=True)
    assert cfg.policy.type == "sec" and cfg.sim.name == "small"
    assert "optuna" in cfg.hydra.sweeper._target_.lower()
    assert set(cfg.hydra.sweeper.params) == {"policy.temperature", "policy.alpha"}


def test_conf_sim_files_hold_every_scenario_key():
    keys = set(ScenarioConfig.model_fields)
    for path in Path(CONF_DIR, "sim").glob("*.yaml"):
        import yaml

        assert set(yaml.safe_load(path.read_text())) == keys, path.name
