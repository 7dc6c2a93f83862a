"""The curriculum's part of a TRL checkpoint: ``checkpoint-N/palestra_curriculum.pt``.

TRL saves the model, the optimizer, its schedule and its RNG states into ``checkpoint-N``; the
curriculum callback adds this file beside them (``on_save``): the Curriculum's state (scheduler,
policy, difficulty, the task stream's generator), the plan steps TRL's loader had read and not yet
scored (handed out again on resume), the plan step counter, the run id, the held-out evaluation's
state and the process's RNG states. ``TRLCurriculum.build(resume_from_checkpoint=...)`` reads it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from curriculum.curriculum import Curriculum, mark_run
from curriculum.store import StatsStore

FILE = "palestra_curriculum.pt"
VERSION = 1


def require_resumable(args: Any) -> None:
    """One line unless TRL will hand the resumed curriculum its stream from where it stopped."""
    if not getattr(args, "ignore_data_skip", False):
        raise ValueError("resuming with a Palestra curriculum needs GRPOConfig(ignore_data_skip=True): the "
                         "curriculum's dataset is a live stream that goes on where the checkpoint left it")


def find(resume: str | os.PathLike | bool, output_dir: str | None) -> Path:
    """The checkpoint folder to resume from: ``True`` for the newest ``checkpoint-N`` in
    ``output_dir`` (as ``trainer.train(resume_from_checkpoint=True)`` picks it), or a folder."""
    from transformers.trainer_utils import get_last_checkpoint

    if resume is True:
        found = get_last_checkpoint(output_dir) if output_dir and os.path.isdir(output_dir) else None
        if found is None:
            raise ValueError(f"resume_from_checkpoint=True: no checkpoint-N folder in {output_dir}")
        path = Path(found)
    elif isinstance(resume, (str, os.PathLike)):
        path = Path(resume)
        if not path.is_dir():
            raise ValueError(f"resume_from_checkpoint: {path} is not a folder")
    else:
        raise ValueError(f"resume_from_checkpoint must be a checkpoint folder or True, not {resume!r}")
    if not (path / FILE).is_file():
        raise ValueError(f"resume_from_checkpoint: {path} has no {FILE}: it was not saved by a run with the "
                         "Palestra curriculum's callback")
    return path


def load(path: Path) -> dict:
    state = torch.load(path / FILE, weights_only=False)  # our own file: plans, tasks and RNG states
    if state.get("version") != VERSION:
        raise ValueError(f"{path / FILE} has version {state.get('version')}, this Palestra reads {VERSION}")
    return state


def save(folder: Path, state: dict) -> Path:
    """Written under a temporary name and renamed, so a crash mid-save leaves no half file."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{FILE}.tmp"
    torch.save({"version": VERSION, **state}, tmp)
    tmp.replace(folder / FILE)
    return folder / FILE


def checkpoint_folder(args: Any, global_step: int) -> Path:
    """Where TRL has just saved the checkpoint of ``global_step`` (transformers' naming)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{global_step}"


def at_plan_boundary(args: Any, global_step: int) -> bool:
    """Whether the optimizer steps up to ``global_step`` trained on whole generation batches.

    TRL keeps a generation batch's completions in memory to train on them for
    ``steps_per_generation × num_iterations`` micro-steps, and a checkpoint does not hold them:
    a run resumed in the middle of one would generate that batch again from the next plan."""
    reuse = int(args.steps_per_generation) * int(getattr(args, "num_iterations", 1))
    return global_step * int(args.gradient_accumulation_steps) % reuse == 0


def resume_state(args: Any, resume: str | Path | bool) -> dict:
    """The checkpoint's curriculum state, or a one-line error before anything starts."""
    require_resumable(args)
    path = find(resume, getattr(args, "output_dir", None))
    state = load(path)
    if not at_plan_boundary(args, state["global_step"]):
        raise ValueError(f"resume_from_checkpoint: {path} was saved inside a generation batch, which TRL's "
                         "checkpoint does not hold: resume from one saved between generation batches")
    return state


def check_stored(store: StatsStore, run_id: str) -> None:
    try:
        store.run(run_id)
    except KeyError:
        raise ValueError(f"resume_from_checkpoint: the checkpoint is of run {run_id}, which is not in the store "
                         f"{store.safe_url}: pass the run's store_url") from None


def reopen(store: StatsStore, resume: dict, settings: dict) -> Curriculum:
    """The checkpointed run again: its steps after the checkpoint go (they are redone); the
    ``TRLCurriculum`` hands its handed-out plans out again (``SharedCurriculum.reissue``)."""
    run_id = resume["run_id"]
    try:
        curriculum = Curriculum.reopen(store, run_id, resume["curriculum"], **settings)
    except BaseException:
        mark_run(store, run_id, "failed")  # reopen marked it running
        raise
    return curriculum
