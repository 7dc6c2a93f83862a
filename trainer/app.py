"""``palestra-train``: the Hydra entry point. Composes conf/, validates it, runs the GRPO recipe."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from curriculum.config import fill_run_defaults
from curriculum.store import SchemaVersionError, StoreUnavailable
from domains.verify.pool import VerifierBackendUnavailable, VerifierPoolBroken
from trainer.recipe.audit import CanaryPaid
from trainer.sampling.vllm_engine import VLLMUnavailable
from domains.registry import DomainError
from trainer.config import ConfigError, PalestraConfig, validate_config
from trainer.config_keys import check_override_keys, drop_shadowed_flat_keys, regroup_overrides

log = logging.getLogger("palestra")


def to_config(cfg: DictConfig, hydra_cfg: Any | None = None) -> PalestraConfig:
    """Composed Hydra config -> validated PalestraConfig (no DictConfig travels further); in a
    multirun, the runs share a sweep id and, by default, one store in the sweep folder."""
    raw: Any = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    raw.pop("hydra", None)
    raw = drop_shadowed_flat_keys(raw, list(hydra_cfg.overrides.task) if hydra_cfg is not None else [])
    return validate_config(fill_run_defaults(raw, hydra_cfg, default_name="palestra"))


def run(config: PalestraConfig | None) -> dict[str, Any]:
    """Train with ``config``. Under torchrun, rank 0 passes the config it validated and the other
    ranks pass None and receive it, so every rank trains with the very same settings (including
    an output_dir that Hydra stamped with rank 0's clock)."""
    from trainer import distributed
    from trainer.recipe.grpo import GRPORecipe  # heavy imports only once the config is known to be valid

    config = distributed.init().broadcast(config)
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
    except CanaryPaid:  # stopped on purpose (audit.stop_on_canary), with a checkpoint to resume from
        status = "stopped"
        raise
    finally:
        recipe.cleanup(status)


# conf/ sits at the project root (an editable install keeps it there); an absolute path stops
# Hydra from looking for it as a Python package.
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def config_groups() -> set[str]:
    """The config groups in conf/ (of both apps: palestra-train and palestra-sim share the folder)."""
    return {d.name for d in Path(CONF_DIR).iterdir() if d.is_dir()}


RESUME_HINT = "resume=auto goes on from the last checkpoint saved, if any"


def _interrupt(signum: int, _frame: object) -> None:
    stop = KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}; {RESUME_HINT}")
    stop.signum = signum  # type: ignore[attr-defined]  # the exit status says which signal
    raise stop


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    # SIGTERM (a scheduler's preemption) ends the run as Ctrl-C does: marked interrupted in its store
    # (during GRPO, the recipe instead finishes the step and saves a checkpoint first). Other
    # torchrun ranks keep the default: they hold no store, and torchrun stops them.
    signal.signal(signal.SIGTERM, _interrupt)
    validated = False
    try:
        config = to_config(cfg, HydraConfig.get())
        if _launched_ranks() > 1 and HydraConfig.get().mode == RunMode.MULTIRUN:
            raise ConfigError("a torchrun launch trains one run; start one launch per sweep point instead of -m")
        validated = True  # from here a run may write elsewhere (a resume goes on in its own folder)
        summary = run(config)
    except (ConfigError, DomainError, StoreUnavailable, SchemaVersionError, VerifierBackendUnavailable,
            VerifierPoolBroken, VLLMUnavailable, CanaryPaid) as exc:
        if not validated:
            _discard_unused_run_folder()
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as exc:  # the run is marked interrupted in its store; say how to go on
        print(f"interrupted: {str(exc) or RESUME_HINT}", file=sys.stderr)
        sys.exit(128 + getattr(exc, "signum", signal.SIGINT))  # 130 for Ctrl-C, 143 for SIGTERM
    print(json.dumps(_result_line(summary)))


def _discard_unused_run_folder() -> None:
    """A config refused by validation leaves no folder behind: Hydra creates the run folder, with
    its saved config and log, before the config is validated. A folder holding anything else (an
    earlier run's store or checkpoints) stays as it is."""
    hydra_cfg = HydraConfig.get()
    folder = Path(hydra_cfg.runtime.output_dir)
    hydra_own = {hydra_cfg.output_subdir, f"{hydra_cfg.job.name}.log"}
    if folder.is_dir() and {entry.name for entry in folder.iterdir()} <= hydra_own:
        shutil.rmtree(folder, ignore_errors=True)


def _result_line(summary: dict) -> dict:
    """The run's last printed line; null where there is nothing to compare (a resume whose held-out
    tasks changed has no evaluation before GRPO to compare with)."""
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    line = {"run_id": summary["run_id"], "macro_before": rounded(summary["before"].get("eval/macro")),
            "macro_after": rounded(summary["after"].get("eval/macro")), "macro_gain": rounded(summary["macro_gain"])}
    if "macro_gain_ci95" in summary:
        line["macro_gain_ci95"] = [rounded(bound) for bound in summary["macro_gain_ci95"]]
    return line


def _launched_ranks() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun


def main() -> None:
    if int(os.environ.get("RANK", "0")) > 0:
        # torchrun's other ranks: rank 0 alone composes and validates the config (and creates
        # Hydra's output folder); they receive it and train alongside, silently
        run(None)
        return
    sys.argv[1:] = regroup_overrides(sys.argv[1:])  # trainer.lr -> trainer.optim.lr, with a note
    try:
        check_override_keys(sys.argv[1:], config_groups())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
