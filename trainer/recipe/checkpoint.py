"""Checkpoints: model, optimizer, LR schedule, RNG states and the scheduler's state, saved atomically.

A checkpoint is a folder ``checkpoints/step-000123``. It is written under a temporary name and
renamed when complete, so a crash mid-save never leaves a folder that looks finished.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.config import ConfigError
from trainer.models.adapters import ADAPTER_WEIGHTS, MERGED, has_adapters, load_adapters, merged_state, save_plain
from trainer.models.sharding import SHARDED, is_sharded, load_sharded, save_sharded
from trainer.distributed import World

PREFIX = "step-"


def save(output_dir: Path, step: int, *, keep: int, model, tokenizer, optimizer, lr_schedule,
         state: dict[str, Any], export_merged: bool = False, world: World = World()) -> Path | None:
    """With LoRA ``model`` saves its adapters alone; ``export_merged`` adds ``merged/``, an ordinary
    model folder of the base with the adapters merged in. A sharded model is saved by every rank
    (its shards, and the optimizer's, in ``sharded/``); rank 0 writes the rest and returns the folder."""
    root = output_dir / "checkpoints"
    final = root / f"{PREFIX}{step:07d}"
    tmp = root / f".tmp-{PREFIX}{step:07d}"
    sharded = is_sharded(model)
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if sharded:
        world.barrier()  # the folder exists before any rank writes into it
        save_sharded(tmp, model, optimizer)  # returns once every rank's shards are written
        if not world.is_main:
            return None
    else:
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if export_merged and has_adapters(model):
        save_plain(model, tmp / MERGED, merged_state(model))
        tokenizer.save_pretrained(tmp / MERGED)
    optimizer_state = None if sharded else optimizer.state_dict()  # sharded: in sharded/
    torch.save({"step": step, "optimizer": optimizer_state, "lr_schedule": lr_schedule.state_dict(), **state},
               tmp / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in complete(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete(output_dir: Path) -> list[Path]:
    """Finished checkpoints, oldest first."""
    root = output_dir / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "trainer_state.pt").exists())


def find(output_dir: Path, resume: str) -> Path | None:
    """The checkpoint to resume from: none, the newest in ``output_dir`` (``auto``), or an explicit folder."""
    if resume == "never":
        return None
    if resume == "auto":
        found = complete(output_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / "trainer_state.pt").exists():
        raise ConfigError(f"resume: {path} is not a complete checkpoint folder")
    return path


def run_folder(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint was saved in (``<run>/checkpoints/step-…``), where the run's
    SFT model, metrics and default SQLite store live; None for a checkpoint moved elsewhere."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


def load(path: Path, model, optimizer, lr_schedule) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    if (path / SHARDED).is_dir():  # written by any number of ranks, read by as many as this run has
        load_sharded(path, model, optimizer)
    elif is_sharded(model):
        raise ConfigError(f"resume: {path} was saved by replicated ranks; "
                          "resume it with trainer.system.sharding=replicate")
    elif has_adapters(model):
        load_adapters(model, path)
    elif (path / ADAPTER_WEIGHTS).is_file():
        raise ConfigError(f"resume: {path} holds LoRA adapters; resume it with model.lora.enabled=true")
    else:
        model.load_state_dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict())
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    if state["optimizer"] is not None:  # None: the optimizer came with the shards
        optimizer.load_state_dict(state["optimizer"])
    lr_schedule.load_state_dict(state["lr_schedule"])
    return state


def optimizer_state(path: Path) -> dict[str, Any]:
    """The optimizer's state dict saved in the (unsharded) checkpoint ``path``."""
    return torch.load(path / "trainer_state.pt", weights_only=False)["optimizer"]


def capture_rng() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
