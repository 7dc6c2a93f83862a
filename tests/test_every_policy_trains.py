"""Every mixing policy and difficulty controller drives a real training step by one override."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from curriculum.store import StatsStore
from trainer.app import CONF_DIR, run, to_config

POLICIES = sorted(p.stem for p in (Path(CONF_DIR) / "policy").glob("*.yaml"))
DIFFICULTIES = sorted(p.stem for p in (Path(CONF_DIR) / "difficulty").glob("*.yaml"))
TINY = ["model.tiny.hidden_size=32", "model.tiny.layers=1", "model.tiny.heads=2", "model.tiny.kv_heads=1",
        "model.tiny.intermediate_size=64"]


def _train(tmp_path, override: str) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            override, f"output_dir={tmp_path}", "domains=[arithmetic,fractions]", "trainer.steps=2",
            "trainer.prompts_per_step=4", "trainer.group_size=2", "trainer.sampling.max_new_tokens=4",
            "verifier.workers=1", "sft.steps=0", "eval.tasks_per_level=1", *TINY,
            "trainer.sampling.dynamic_sampling=false",  # every planned group trains, none is refilled: the counts below
        ])
    return run(to_config(cfg))


@pytest.mark.parametrize("name", POLICIES + [f"difficulty={d}" for d in DIFFICULTIES if d != "frontier"])  # the default
def test_one_override_trains(tmp_path, name):
    override = name if name.startswith("difficulty=") else f"policy={name}"
    summary = _train(tmp_path, override)
    with StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}") as store:
        assert store.count_results(summary["run_id"]) == 2 * 4 * 2
        config = store.run(summary["run_id"])["config"]
    key, value = override.split("=")
    assert config[key]["type"] == value


@pytest.mark.parametrize("selection", ["streak", "beta", "retire"])
def test_prompt_selection_trains_and_keeps_prompt_stats(tmp_path, selection):
    summary = _train(tmp_path, f"selection={selection}")
    with StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}") as store:
        assert store.count_results(summary["run_id"]) == 2 * 4 * 2
        stats = store.prompt_stats(summary["run_id"])
        metrics = store.metrics(summary["run_id"])
    assert sum(s["attempts"] for s in stats) == 2 * 4 * 2  # every completion counted once per prompt
    assert any(key.startswith("selection/") for key in metrics[-1])


def test_the_captured_sampler_trains_through_one_override(tmp_path):
    # on the CPU it runs its static-cache loop eagerly; on CUDA (auto) it is the default
    summary = _train(tmp_path, "trainer.sampling.rollout_backend=captured")
    with StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}") as store:
        assert store.count_results(summary["run_id"]) == 2 * 4 * 2
        assert store.run(summary["run_id"])["config"]["trainer"]["sampling"]["rollout_backend"] == "captured"
