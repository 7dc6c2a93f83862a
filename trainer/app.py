"""``palestra-train``: the Hydra entry point. Composes conf/, validates it, runs the GRPO recipe."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from curriculum.config import fill_run_defaults
from curriculum.store import StoreUnavailable
from domains.registry import DomainError
from trainer.config import ConfigError, PalestraConfig, validate_config

log = logging.getLogger("palestra")


def to_config(cfg: DictConfig, hydra_cfg: Any | None = None) -> PalestraConfig:
    """Composed Hydra config -> validated PalestraConfig (no DictConfig travels further); in a
    multirun, the runs share a sweep id and, by default, one store in the sweep folder."""
    raw: Any = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    raw.pop("hydra", None)
    return validate_config(fill_run_defaults(raw, hydra_cfg, default_name="palestra"))


def run(config: PalestraConfig) -> dict[str, Any]:
    from trainer.grpo import GRPORecipe  # heavy imports only once the config is known to be valid

    recipe = GRPORecipe(config)
    status = "failed"
    try:
        recipe.setup()
        summary = recipe.train()
        status = "finished"
        return summary
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        recipe.cleanup(status)


# conf/ sits at the project root (an editable install keeps it there); an absolute path stops
# Hydra from looking for it as a Python package.
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        config = to_config(cfg, HydraConfig.get())
        summary = run(config)
    except (ConfigError, DomainError, StoreUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    before, after = summary["before"].get("eval/macro", 0.0), summary["after"].get("eval/macro", 0.0)
    print(json.dumps({"run_id": summary["run_id"], "macro_before": round(before, 4), "macro_after": round(after, 4),
                      "macro_gain": round(after - before, 4)}))


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
