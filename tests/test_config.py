"""Every option of every config group composes and validates; bad values fail in one line."""
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from trainer.app import CONF_DIR, config_groups, to_config
from trainer.config import ConfigError, TrainerConfig, validate_config
from trainer.config_keys import check_override_keys

# The training app's groups: those its defaults list names (conf/sim belongs to palestra-sim, and
# conf/experiment holds one preset for each app; both are composed by their own tests).
GROUPS = sorted(next(iter(entry)) for entry in OmegaConf.load(Path(CONF_DIR) / "config.yaml").defaults
                if not isinstance(entry, str))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["output_dir=/tmp/unused", *overrides])
    return to_config(cfg)


PRESETS = {"frontier": "threshold"}  # options that set another type's parameters


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def test_groups_are_the_documented_ones():
    assert {"model", "trainer", "policy", "difficulty", "store", "selection"} <= set(GROUPS)


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_group_option_validates(group, option):
    extra = ["model.name_or_path=/some/model"] if (group, option) == ("model", "hf") else []
    config = _compose([f"{group}={option}", *extra])
    section = getattr(config, group)
    if hasattr(section, "type"):
        assert section.type == PRESETS.get(option, option)


def test_defaults_are_the_main_job():
    config = _compose([])
    assert config.model.type == "tiny"
    assert config.policy.type == "learnability"
    assert config.difficulty.type == "threshold" and config.difficulty.lower_below == 0.05  # frontier.yaml
    assert config.domains[:3] == ["arithmetic", "linear_equations", "fractions"]
    assert {"code_functions", "code_lists"} <= set(config.domains)
    assert config.sft.steps > 0 and config.trainer.steps > 0


def test_stable_keys_override():
    config = _compose([
        "seed=7", "domains=[arithmetic]", "policy=uniform", "store.url=sqlite:///x.db", "trainer.steps=3",
        "trainer.prompts_per_step=4", "trainer.group_size=2", "trainer.optim.lr=0.01", "sft.steps=0", "eval.every=2",
        "resume=auto",
    ])
    assert (config.seed, config.domains, config.policy.type, config.store.url) == (7, ["arithmetic"], "uniform", "sqlite:///x.db")
    assert (config.trainer.steps, config.trainer.prompts_per_step, config.trainer.group_size) == (3, 4, 2)
    assert (config.trainer.optim.lr, config.sft.steps, config.eval.every, config.resume) == (0.01, 0, 2, "auto")


@pytest.mark.parametrize("override,message", [
    ("trainer.optim.lr=-1", "trainer.optim.lr: Input should be greater than 0"),
    ("trainer.group_size=1", "trainer.group_size: Input should be greater than or equal to 2"),
    ("+trainer.lrr=1", "trainer.lrr: Extra inputs are not permitted"),
    ("trainer.loss.aggregation=median", "trainer.loss.aggregation: Input should be 'seq_mean', 'token_mean' or 'constant'"),
    ("policy.floor=-0.5", "policy.floor:"),
    ("model=hf", "model: model.name_or_path is required when model.type is hf"),
    ("difficulty.lower_below=0.8", "difficulty: lower_below (0.8) must be below raise_above (0.7)"),
    ("cold_start.probe_rate=1.5", "cold_start.probe_rate: Input should be less than 1"),
    ("policy=headroom policy.max_ratio=0.5", "policy.max_ratio: Input should be greater than or equal to 1"),
])
def test_bad_values_fail_in_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        _compose(override.split())
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(message), text


@pytest.mark.parametrize("section,message", [
    ({"policy": {"type": "learnability", "pinned": {"arithmetc": 0.5}}},
     "policy: pinned share: unknown domain 'arithmetc'; did you mean 'arithmetic'?"),
    ({"policy": {"type": "fixed", "weights": {"arithmetic": 1.0, "fractionz": 1.0}}},
     "policy: fixed weights: unknown domain 'fractionz'; did you mean 'fractions'?"),
    ({"difficulty": {"type": "threshold", "start_levels": {"arithmetic": 9}}},
     "difficulty: domain 'arithmetic' has no level 9"),
])
def test_settings_that_name_domains_or_levels_are_checked_before_any_work(tmp_path, section, message):
    from trainer.recipe.grpo import GRPORecipe

    raw = {"domains": ["arithmetic", "fractions"], "policy": {"type": "learnability"},
           "difficulty": {"type": "threshold"}, "output_dir": str(tmp_path / "run"), **section}
    with pytest.raises(ConfigError) as info:
        GRPORecipe(validate_config(raw)).setup()
    assert str(info.value) == message
    assert not (tmp_path / "run").exists()  # no model, no store, no run row


def test_each_apps_help_names_the_shared_groups_that_are_the_other_apps():
    # palestra-train and palestra-sim share conf/, so Hydra's --help lists every group to both
    from curriculum.sim.config import SimAppConfig
    from trainer.config import PalestraConfig

    groups = config_groups() - {"experiment"}
    for yaml_name, config in [("config.yaml", PalestraConfig), ("sim_config.yaml", SimAppConfig)]:
        header = OmegaConf.load(Path(CONF_DIR) / yaml_name).hydra.help.header
        named = header.split("the groups ")[1].split(" are ")[0].replace(" and ", ", ").split(", ")
        foreign = groups - set(config.model_fields)
        assert foreign == {name.split("=")[0] for name in named} - {"experiment"}, yaml_name


GROUPS = config_groups()


@pytest.mark.parametrize("override, message", [
    ("trainer.stepz=5", "trainer.stepz: no such setting (did you mean trainer.steps?)"),
    ("polciy=uniform", "polciy: no such setting (did you mean policy?)"),
    ("policy.alfa=1", "policy.alfa: no such setting (did you mean policy.alpha?)"),  # in no policy's options
    ("model.tiny.hiden_size=3", "model.tiny.hiden_size: no such setting (did you mean model.tiny.hidden_size?)"),
    ("qqq=1", "qqq: no such setting"),
])
def test_a_mistyped_key_fails_in_one_line_with_the_nearest_key(override, message):
    with pytest.raises(ConfigError) as info:
        check_override_keys(["seed=1", override], GROUPS)
    assert str(info.value) == message


def test_keys_hydra_and_the_config_know_pass_the_key_check():
    check_override_keys([
        "trainer.steps=2,3", "model=hf", "policy=tscl", "policy.unseen_success=0.3",  # a key of another policy
        "+experiment=reasoning_gym", "++trainer.optim.lr=1", "~sft", "hydra.run.dir=/tmp/x", "-m", "--cfg", "job",
        "domain_options.arithmetic.anything=1", "domains=[arithmetic]", "sim=default",
    ], GROUPS)


def test_the_train_command_says_a_mistyped_key_in_one_line():
    done = subprocess.run([sys.executable, "-m", "trainer.app", "trainer.stepz=5"], capture_output=True, text=True,
                          cwd=Path(CONF_DIR).parent)
    assert done.returncode == 2
    assert done.stderr == "error: trainer.stepz: no such setting (did you mean trainer.steps?)\n"


def test_a_refused_config_leaves_no_run_folder_but_keeps_one_in_use(tmp_path):
    def train(folder: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainer.app", f"hydra.run.dir={folder}", "trainer.lr=-1"],
                              capture_output=True, text=True, cwd=Path(CONF_DIR).parent)

    done = train(tmp_path / "fresh")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "note: trainer.lr is now trainer.optim.lr; the flat key is accepted for a while",
        "error: trainer.optim.lr: Input should be greater than 0"]
    assert not (tmp_path / "fresh").exists()  # Hydra made it, with its config and log; nothing else was written
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "palestra.db").write_bytes(b"an earlier run's store")
    assert train(tmp_path / "used").returncode == 2
    assert (tmp_path / "used" / "palestra.db").read_bytes() == b"an earlier run's store"


def test_changed_settings_names_nested_keys_and_leaves_out_where_a_launch_writes():
    from trainer.config_keys import changed_settings

    started = {"seed": 0, "output_dir": "a", "resume": "never", "versions": {"torch": "2.12"},
               "trainer": {"mu": 1, "lr": 1e-4}, "domains": ["arithmetic"]}
    now = {"seed": 0, "output_dir": "b", "resume": "auto", "versions": {"torch": "2.13"},
           "trainer": {"mu": 2, "lr": 1e-4, "sft_coef": 1.0}, "domains": ["arithmetic", "fractions"],
           "health": {"kl_max": None}}
    assert changed_settings(started, now) == [
        "domains: ['arithmetic'] -> ['arithmetic', 'fractions']",
        "health.kl_max: (absent) -> None",  # a section the start lacked: each of its settings
        "trainer.mu: 1 -> 2", "trainer.sft_coef: (absent) -> 1.0", "versions.torch: '2.12' -> '2.13'"]
    assert changed_settings(now, now) == []


# -- one source of defaults, and the trainer's groups ---------------------------------------------------
# Where a config built in Python may differ from the main job's: where it writes (Hydra stamps the
# folder), the two sections the schema makes the user choose, and the candidates per slot, which
# nothing reads without a selection rule: conf/'s `none` keeps the 1 runs were stored with (so a
# resume of one reports no change), the schema the 4 that a rule turned on in Python needs.
INTENDED_DIFFERENCES = {"output_dir", "policy", "difficulty", "selection.candidates_factor"}


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_the_schema_defaults_are_the_main_job():
    """A PalestraConfig built in Python trains the recipe palestra-train runs: every default of the
    schema equals conf/'s main job, except where INTENDED_DIFFERENCES says."""
    from trainer.config import PalestraConfig

    main_job = _leaves(_compose([]).model_dump(mode="json"))
    schema = _leaves(PalestraConfig(policy={"type": "learnability"}, difficulty={"type": "threshold"}).model_dump(mode="json"))
    differing = sorted(k for k in main_job.keys() | schema.keys()
                       if k.split(".")[0] not in INTENDED_DIFFERENCES and k not in INTENDED_DIFFERENCES
                       and main_job.get(k, "absent") != schema.get(k, "absent"))
    assert differing == [], [(k, schema.get(k, "absent"), main_job.get(k, "absent")) for k in differing]


def test_the_trainer_settings_are_grouped_by_what_they_govern():
    config = _compose(["trainer.sampling.temperature=0.9", "trainer.loss.beta=0", "trainer.optim.mu=1",
                       "trainer.system.cpu_threads=1"])
    t = config.trainer
    assert (t.sampling.temperature, t.loss.beta, t.optim.mu, t.system.cpu_threads) == (0.9, 0.0, 1, 1)


def test_old_flat_trainer_keys_are_accepted_with_a_one_line_note(capsys):
    from trainer.config_keys import regroup_overrides

    config = validate_config({"policy": {"type": "uniform"}, "difficulty": {"type": "fixed"},
                              "trainer": {"lr": 2e-4, "mu": 1, "log_every": 5, "optim": {"warmup_steps": 1}}})
    assert (config.trainer.optim.lr, config.trainer.optim.mu, config.trainer.optim.warmup_steps) == (2e-4, 1, 1)
    notes = capsys.readouterr().err.splitlines()
    assert notes == ["note: trainer.log_every is read by nothing and is ignored; drop it",
                     "note: trainer.lr is now trainer.optim.lr; the flat key is accepted for a while",
                     "note: trainer.mu is now trainer.optim.mu; the flat key is accepted for a while"]
    assert regroup_overrides(["trainer.temperature=0.5", "trainer.steps=3", "seed=1", "~trainer.mu",
                              "++trainer.lr=1", "trainer.log_every=5"]) == [
        "trainer.sampling.temperature=0.5", "trainer.steps=3", "seed=1", "~trainer.optim.mu", "++trainer.optim.lr=1"]
    assert "note: trainer.log_every is read by nothing and is ignored; drop it" in capsys.readouterr().err


def test_a_grouped_key_typed_on_the_command_line_wins_over_a_flat_key_from_a_conf_file():
    from trainer.config import OptimConfig, TrainerConfig
    from trainer.config_keys import drop_shadowed_flat_keys

    from_file = {"trainer": {"mu": 1, "lr": 3e-4, "optim": {"mu": 2, "lr": 1e-4}}}  # an old conf file over conf/
    kept = drop_shadowed_flat_keys(from_file, ["trainer.optim.mu=3", "seed=1"])
    assert kept["trainer"] == {"lr": 3e-4, "optim": {"mu": 2, "lr": 1e-4}}
    kept["trainer"]["optim"]["mu"] = 3  # as Hydra composed it
    optim = TrainerConfig.model_validate(kept["trainer"]).optim
    assert (optim.mu, optim.lr) == (3, 3e-4)  # the typed key; the file's flat lr over conf/'s default
    assert TrainerConfig(lr=2e-4, optim=OptimConfig(mu=1)).optim.lr == 2e-4  # flat and grouped together, in Python


def test_a_run_stored_with_flat_trainer_keys_resumes_without_reporting_them_changed():
    from trainer.config_keys import as_stored_now, changed_settings

    now = validate_config({"policy": {"type": "uniform"}, "difficulty": {"type": "fixed"}}).model_dump(mode="json")
    flat = dict(now, trainer={"steps": 100, "prompts_per_step": 12, "group_size": 8, "log_every": 1,
                              **{k: v for group in ("sampling", "loss", "optim", "system")
                                 for k, v in now["trainer"][group].items()}})
    assert len(changed_settings(flat, now)) > 20  # read as they are, every setting moved
    assert changed_settings(as_stored_now(flat), now) == []
    flat["trainer"]["lr"] = 5e-5
    assert changed_settings(as_stored_now(flat), now) == ["trainer.optim.lr: 5e-05 -> 0.0001"]


def test_the_smollm2_preset_composes_to_the_real_model_asked_in_words():
    config = _compose(["+experiment=smollm2"])
    assert config.model.type == "smollm2" and config.model.domain_options() == {"prompt_style": "chat"}
    assert len(config.domains) == 8 and config.sft.steps == 0 and config.trainer.loss.beta == 0.0
    assert config.policy.type == "uniform" and config.trainer.steps == 20


def test_the_pool_preset_loads_24_distinct_domains_with_reasoning_gym_at_its_easiest_level():
    from domains.registry import load_all
    config = _compose(["+experiment=smollm2_pool"])
    assert config.model.type == "smollm2" and config.trainer.steps == 20  # the SmolLM2 preset beneath
    assert config.eval.tasks_per_level == 4 and config.eval.min_tasks_per_domain == 20
    loaded = load_all(config.domains, config.domain_options)
    gym = [d for name, d in loaded.items() if name.startswith("rg_")]
    assert len(loaded) == 24 and len(gym) == 16
    assert all(d.levels == (1,) for d in gym)


def test_oversampling_needs_dynamic_sampling():
    with pytest.raises(ValueError, match="oversample > 1 draws extra groups for dynamic sampling"):
        TrainerConfig(sampling={"oversample": 2, "dynamic_sampling": False})
    assert TrainerConfig(sampling={"oversample": 2}).sampling.oversample == 2
