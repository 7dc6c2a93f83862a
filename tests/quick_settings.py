"""The settings the tests' small training runs are written against: one pass over the rollouts, no
KL anchor, no rehearsal blend, no refills, a constant learning rate, one sampling thread, no
checkpoints between steps. They were the schema's defaults until the schema took the main job's
(tests/test_config.py checks that), so each run's exact row counts and speed stay what the tests
expect; a test that needs another value gives it."""
from trainer.config import regroup_trainer

QUICK = {
    "trainer": {
        "sampling": {"temperature": 1.0, "rollout_batch_size": 64, "dynamic_sampling": False},
        "loss": {"beta": 0.0, "skip_zero_advantage": False, "sft_coef": 0.0, "sft_source": "step"},
        "optim": {"lr_decay": "constant", "mu": 1, "micro_batch_size": 64},
        "system": {"cpu_threads": 1, "table_every": 10},
    },
    "sft": {"steps": 0},
    "checkpoint": {"every": 0},
}


def quick(raw: dict) -> dict:
    """``raw`` over QUICK (its flat trainer keys, ``lr``, read as their groups' ``optim.lr``)."""
    given = dict(raw)
    if isinstance(given.get("trainer"), dict):
        given["trainer"] = regroup_trainer(given["trainer"])
    return _merged(QUICK, given)


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out
