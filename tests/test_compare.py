"""Comparison metrics, budget matching and paired-seed intervals; `palestra compare` on a tiny sweep."""
import json

import numpy as np
import pytest
import yaml

from curriculum.cli import main
from curriculum.compare import RunCurves, compare_curves, format_table, load_run, paired_ci, run_metrics
from curriculum.config import parse_difficulty, parse_policy
from curriculum.sim.config import ScenarioConfig, SimAppConfig
from curriculum.sim.runner import run_sim
from curriculum.store import StatsStore
from quick_settings import quick


def curves(label, seed, macro, rollouts_per_step=10, domains=None):
    macro = np.asarray(macro, dtype=float)
    steps = np.arange(1, len(macro) + 1, dtype=float)
    doms = np.asarray(domains if domains is not None else np.zeros((0, 0)), dtype=float)
    dsteps = steps[: len(doms)] if len(doms) else np.zeros(0)
    return RunCurves(f"{label}{seed}", label, seed, steps, steps * rollouts_per_step, macro,
                     np.full(len(macro), np.nan), np.zeros(len(macro)), dsteps, doms)


def test_paired_ci_by_hand():
    # diffs 1, 2, 3: mean 2, sd 1, t(0.975, 2 dof) = 4.3027, half width 4.3027 / sqrt(3) = 2.4841
    mean, lo, hi = paired_ci(np.array([1.0, 2.0, 3.0]))
    assert mean == 2.0
    assert (lo, hi) == pytest.approx((2 - 2.4841, 2 + 2.4841), abs=1e-4)
    assert np.isnan(paired_ci(np.array([1.0]))[1])
    # every pair differing alike: the spread is unknown, not zero, so there is no interval
    assert paired_ci(np.array([-7.0, -7.0]))[0] == -7.0 and np.isnan(paired_ci(np.array([-7.0, -7.0]))[1])


def test_two_seeds_that_differ_alike_get_no_zero_width_star():
    # steps to target 0.5: uniform reaches it at steps 10 and 11, the other policy 7 steps sooner on
    # both seeds; the t interval would be [-7, -7] and starred
    runs = []
    for seed, reach in ((0, 10), (1, 11)):
        runs.append(curves("uniform", seed, np.where(np.arange(1, 21) >= reach, 0.6, 0.1)))
        runs.append(curves("fast", seed, np.where(np.arange(1, 21) >= reach - 7, 0.6, 0.1)))
    cmp = compare_curves(runs, "sw", target=0.5)
    cell = cmp.policies["fast"]["to_target"]
    assert (cell["diff"], cell["lo"], cell["hi"], cell["pairs"]) == (-7.0, None, None, 2)
    assert cell["tied"] and not cell["significant"]
    row = format_table(cmp).splitlines()[-1]
    assert row.split()[:2] == ["fast", "2"]  # the seeds every cell of the row rests on
    assert "(-7 tied)" in row and "[-7,-7]" not in row and "*" not in row


def test_fewer_than_three_seeds_are_never_significant():
    runs = []
    for seed in range(3):
        base = np.linspace(0.1, 0.5, 10) + 0.01 * seed
        runs.append(curves("uniform", seed, base))
        runs.append(curves("better", seed, base + 0.1 + 0.002 * seed))
    three = compare_curves(runs, "sw", target=0.3).policies["better"]["final"]
    two = compare_curves([r for r in runs if r.seed < 2], "sw", target=0.3).policies["better"]["final"]
    assert three["significant"] and three["lo"] > 0
    assert two["lo"] > 0 and not two["significant"]  # an interval above zero, on two seeds only
    rows = format_table(compare_curves([r for r in runs if r.seed < 2], "sw", target=0.3)).splitlines()[1:]
    assert not any("*" in row for row in rows)


def test_a_cell_on_fewer_seeds_says_so():
    # retention is undefined on a run that never masters a domain: that seed drops out of its cell
    mastered = [[0.1, 0.2], [0.9, 0.5], [0.85, 0.8]]
    never = [[0.1, 0.2], [0.3, 0.4], [0.3, 0.4]]
    runs = [curves(label, seed, [0.2, 0.4, 0.6], domains=mastered if (label, seed) != ("other", 2) else never)
            for label in ("uniform", "other") for seed in range(3)]
    cmp = compare_curves(runs, "sw", target=0.5)
    assert cmp.policies["other"]["retention"]["pairs"] == 2
    row = format_table(cmp).splitlines()[-1]
    assert row.split()[:2] == ["other", "3"] and "n=2" in row


def test_run_metrics_by_hand():
    # domain 0 peaks at 0.9 then ends at 0.45 (retention 0.5); domain 1 ends at its peak 0.8 (1.0)
    c = curves("u", 0, [0.2, 0.4, 0.6, 0.6], domains=[[0.1, 0.2], [0.9, 0.5], [0.7, 0.8], [0.45, 0.8]])
    m = run_metrics(c, target=0.5, mastery=0.8)
    assert m["auc"] == pytest.approx((0.2 + 0.4 + 0.6 + 0.6) / 4)  # equal rollouts per step: the mean
    assert m["final"] == 0.6 and m["to_target"] == 3.0
    assert m["retention"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["worst10"] == 0.45  # no logged worst decile: the worst domain of 2 at the end
    assert run_metrics(c, target=0.99)["to_target"] == 5.0  # never reached: last step + 1


def test_budget_matching_and_paired_differences():
    runs = []
    for seed in range(4):
        base = 0.1 * seed + np.linspace(0.1, 0.5, 10)
        runs.append(curves("uniform", seed, base))
        # better by 0.05 everywhere, but ran longer: the extra steps must not count
        runs.append(curves("sec", seed, np.concatenate([base + 0.05 + 0.001 * seed, np.full(5, 1.0)])))
    cmp = compare_curves(runs, "sw", target=0.3)
    assert cmp.budget == 100
    auc = cmp.policies["sec"]["auc"]
    assert auc["pairs"] == 4 and auc["diff"] == pytest.approx(0.0515)
    assert 0 < auc["lo"] < auc["diff"] < auc["hi"]
    assert cmp.policies["sec"]["final"]["diff"] == pytest.approx(0.0515)
    assert list(cmp.policies) == ["uniform", "sec"]
    with pytest.raises(ValueError, match="no 'uniform' runs"):
        compare_curves([r for r in runs if r.label == "sec"], "sw")
    # a sweep over another setting too (say two learning rates per policy and seed) would
    # pair runs that differ in more than the policy: refused, not half dropped
    with pytest.raises(ValueError, match="two 'uniform' runs with seed 0: runs are told apart by policy, difficulty controller and seed"):
        compare_curves(runs + [curves("uniform", 0, np.linspace(0.2, 0.6, 10))], "sw")


@pytest.fixture()
def sweep_db(tmp_path):
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    sim = ScenarioConfig(domains=12, levels=3, steps=15, prompts_per_step=8, group_size=4, cluster_size=4)
    with StatsStore(url) as store:
        for policy in ("uniform", "sec"):
            for seed in range(3):
                cfg = SimAppConfig(sim=sim, policy=parse_policy({"type": policy}), seed=seed, sweep_id="sw1",
                                   difficulty=parse_difficulty({"type": "threshold"}))
                run_sim(cfg, store)
    return url


def test_cli_compare_table_and_json(sweep_db, capsys):
    assert main(["compare", "--db", sweep_db, "--sweep", "sw1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["budget"], out["budget_unit"]) == (15 * 8 * 4, "rollouts") and list(out["policies"]) == ["uniform", "sec"]
    sec = out["policies"]["sec"]
    assert sec["auc"]["pairs"] == 3 and sec["auc"]["lo"] <= sec["auc"]["diff"] <= sec["auc"]["hi"]
    assert set(sec) == {"auc", "final", "worst10", "to_target", "retention", "zero_var", "completions"}
    assert sec["completions"]["mean"] == 15 * 8 * 4 and sec["completions"]["diff"] == 0  # one rollout budget
    assert main(["compare", "--db", sweep_db, "--sweep", "sw1", "--target", "0.2"]) == 0
    table = capsys.readouterr().out
    assert "target macro 0.200" in table and table.count("\n") == 4
    assert main(["compare", "--db", sweep_db, "--sweep", "nope"]) == 2
    assert "no finished runs" in capsys.readouterr().err


def test_a_training_sweep_compares_from_its_held_out_evaluations(tmp_path, capsys):
    # two real GRPO runs (tiny model) of one sweep: their held-out evaluations go to the store
    # under the keys the simulator writes, so `palestra compare` and `report` read them alike
    from trainer.app import run
    from trainer.config import validate_config

    url = f"sqlite:///{tmp_path / 'train_sweep.db'}"
    tiny = {"type": "tiny", "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}}
    for n, policy in enumerate(("uniform", "learnability")):
        run(validate_config(quick({
            "name": "sweep", "seed": 0, "sweep_id": "trainsweep", "output_dir": str(tmp_path / f"run{n}"),
            "model": tiny, "domains": ["arithmetic", "fractions"], "policy": {"type": policy},
            "difficulty": {"type": "threshold"}, "store": {"url": url},
            "trainer": {"steps": 3, "prompts_per_step": 4, "group_size": 2, "max_new_tokens": 8,
                        "rollout_batch_size": 8, "micro_batch_size": 8},
            "verifier": {"workers": 1}, "sft": {"steps": 2, "batch_size": 8},
            "eval": {"tasks_per_level": 1, "every": 2},
        })))
    with StatsStore(url) as store:
        [first, _] = store.runs()
        stored = {r["step"]: r for r in store.metrics(first["id"]) if "heldout/macro" in r}
    assert sorted(stored) == [0, 2, 3]  # before GRPO, after step 2, after the last step
    assert len(stored[3]["heldout/domains"]) == 2 and 0.0 <= stored[3]["heldout/macro"] <= 1.0
    assert "heldout/arithmetic/level1" in stored[3]
    capsys.readouterr()  # the runs' own console output
    assert main(["compare", "--db", url, "--sweep", "trainsweep", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["policies"]) == ["uniform", "learnability"]
    assert out["policies"]["learnability"]["final"]["pairs"] == 1
    # each domain's final held-out success, by name, paired with uniform's
    effects = out["domains"]["learnability"]
    assert sorted(effects) == ["arithmetic", "fractions"] and effects["arithmetic"]["pairs"] == 1
    final = {r["step"]: r for r in store_metrics(url, first["id"]) if "heldout/macro" in r}[3]
    assert out["domains"]["uniform"]["arithmetic"]["mean"] == pytest.approx(final["heldout/arithmetic"], abs=1e-5)
    assert main(["compare", "--db", url, "--sweep", "trainsweep", "--domains"]) == 0
    assert "domain (final held-out)" in capsys.readouterr().out
    # a training sweep is cut at a common step: its evaluations are sparse, and dynamic sampling
    # makes its runs' rollout counts differ
    assert (out["budget"], out["budget_unit"]) == (3, "steps")
    assert out["policies"]["uniform"]["completions"]["mean"] == 3 * 4 * 2  # what the run generated
    with StatsStore(url) as store:
        curves = load_run(store, first)
    assert curves.rollouts.tolist() == [0, 2 * 4 * 2, 3 * 4 * 2]  # every completion generated up to each evaluation
    assert main(["report", "--db", url, "--run", first["id"], "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "macro.png").exists() and (tmp_path / "report" / "heldout.png").exists()
    page = (tmp_path / "report" / "index.html").read_text()  # a trainer run stores its verdicts: all columns shown
    assert "<td>arithmetic</td>" in page and "<th>correct</th>" in page and "<th>sandbox violation</th>" in page
    # the simulator fitted to the run: one domain per trained domain, its batch and steps
    from curriculum.sim.fit import main as fit_main

    fit_main(["--db", url, "--run", first["id"], "--out", str(tmp_path / "fitted.yaml"), "--seeds", "2"])
    scenario = ScenarioConfig(**yaml.safe_load((tmp_path / "fitted.yaml").read_text()))
    assert [d.name for d in scenario.fitted] == ["arithmetic", "fractions"] and scenario.name == "fitted"
    assert (scenario.steps, scenario.prompts_per_step, scenario.group_size, scenario.levels) == (3, 4, 2, 5)
    assert "held-out gain" in capsys.readouterr().out


def test_a_difficulty_ablation_is_a_group_of_its_own(tmp_path):
    # one sweep: uniform and sec with the usual controller, and uniform with a fixed difficulty;
    # the odd controller's runs get their own label, paired with the uniform runs like a policy
    from curriculum.compare import compare_sweep

    url = f"sqlite:///{tmp_path / 'ablation.db'}"
    sim = ScenarioConfig(domains=6, levels=3, steps=8, prompts_per_step=8, group_size=4, cluster_size=3)
    with StatsStore(url) as store:
        for policy, controller in (("uniform", "threshold"), ("sec", "threshold"), ("uniform", "fixed")):
            for seed in range(3):
                run_sim(SimAppConfig(sim=sim, policy=parse_policy({"type": policy}), seed=seed, sweep_id="abl",
                                     difficulty=parse_difficulty({"type": controller})), store)
        cmp = compare_sweep(store, "abl")
    assert list(cmp.policies) == ["uniform", "sec", "uniform difficulty=fixed"]
    assert cmp.policies["uniform difficulty=fixed"]["auc"]["pairs"] == 3


def test_settings_of_one_policy_are_labelled_by_the_keys_in_which_they_differ():
    from curriculum.compare import split_labels

    def run(run_id, **policy):
        return {"id": run_id, "config": {"policy": policy, "difficulty": {"type": "frontier"}}}

    runs = [run("u", type="uniform"), run("a", type="headroom", gain=10.0, progress_z=0.0),
            run("b", type="headroom", gain=10.0, progress_z=1.0), run("c", type="headroom", gain=10.0)]
    # c was stored before progress_z existed: it says so rather than claim a value
    assert split_labels(runs) == {"u": "uniform", "a": "headroom progress_z=0.0",
                                  "b": "headroom progress_z=1.0", "c": "headroom progress_z=unset"}
    assert split_labels(runs[:2]) == {"u": "uniform", "a": "headroom"}  # one setting: the type alone


def test_a_run_in_another_precision_is_labelled_by_its_dtype():
    from curriculum.compare import split_labels

    def run(run_id, dtype):
        return {"id": run_id, "config": {"policy": {"type": "uniform"}, "difficulty": {"type": "frontier"},
                                         "model": {"dtype": dtype}}}

    runs = [run("a", "auto"), run("b", "auto"), run("c", "bfloat16")]
    assert split_labels(runs) == {"a": "uniform", "b": "uniform", "c": "uniform model.dtype=bfloat16"}
    # model.dtype=auto on a CPU with bf16: the run stores what it computed in, and is labelled by that
    runs = [run("a", "auto"), run("b", "auto"), run("c", "auto"), run("d", "auto"), run("e", "bfloat16")]
    runs[3]["config"]["arithmetic"] = "bfloat16"
    labels = split_labels(runs)
    assert labels["d"] == labels["e"] == "uniform model.dtype=bfloat16" and labels["c"] == "uniform"
    # a simulator run has no model: it is never tagged
    assert split_labels([{"id": "s", "config": {"policy": {"type": "uniform"}}}]) == {"s": "uniform"}


def store_metrics(url: str, run_id: str) -> list[dict]:
    with StatsStore(url) as store:
        return store.metrics(run_id)
