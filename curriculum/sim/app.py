"""``palestra-sim``: the Hydra entry point of the simulator (conf/sim_config.yaml).

    palestra-sim sim=hundreds policy=dump seed=3 store.url=sqlite:///sim.db
    palestra-sim -m policy=uniform,dump,sec seed='range(8)' sim=hundreds store.url=sqlite:///sweep.db

Every run of a multirun is recorded under one sweep id: the ``sweep_id`` key when given, else one
derived from Hydra's sweep dir, so ``palestra runs`` and ``palestra compare --sweep`` find them.
With ``store.url`` unset a single run writes ``<run dir>/palestra.db`` and a multirun shares
``<sweep dir>/palestra.db``. The task returns the run's mean macro held-out success (the area
under its curve), which is what Hydra's Optuna sweeper maximises (conf/experiment/).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from curriculum.config import fill_run_defaults
from curriculum.sim.config import SimAppConfig, SimConfigError, validate_sim_config
from curriculum.store import SchemaVersionError, StoreUnavailable, default_store_url

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def to_config(cfg: DictConfig, hydra_cfg: Any | None = None) -> SimAppConfig:
    """Composed Hydra config -> validated SimAppConfig, with sweep id and store path filled in."""
    raw: Any = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    raw.pop("hydra", None)
    fill_run_defaults(raw, hydra_cfg, default_name="sim")
    return validate_sim_config(raw)


def run(config: SimAppConfig) -> dict:
    from curriculum.sim.runner import run_sim
    from curriculum.store import StatsStore

    url = config.store.url or default_store_url(config.output_dir)
    with StatsStore(url) as store:
        result = run_sim(config, store)
    return {"run_id": result.run_id, "sweep_id": config.sweep_id, "policy": config.policy.type,
            "seed": config.seed, "final_macro": round(result.final_macro, 4), "auc": round(result.auc, 4),
            "seconds": round(result.seconds, 2), "db": url}


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="sim_config")
def _hydra_main(cfg: DictConfig) -> float:
    try:
        config = to_config(cfg, HydraConfig.get())
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        summary = run(config)
    except (StoreUnavailable, SchemaVersionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(summary))
    return summary["auc"]  # the Optuna sweeper's objective


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
