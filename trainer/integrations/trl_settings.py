"""The settings ``TRLCurriculum.build`` takes, validated as the Hydra apps validate them (an error
is one line naming its key), and what a TRL run stores of TRL's own."""
from __future__ import annotations

import math
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from curriculum.config import CurriculumConfig, DifficultyConfig, PolicyConfig, describe_error
from curriculum.store import default_store_url as store_url_in
from domains.verify.backend import VerifierConfig


def curriculum_config(policy: PolicyConfig | dict | None,
                      difficulty: DifficultyConfig | dict | None) -> CurriculumConfig:
    """Policy and difficulty validated as the Hydra apps validate them (defaults: learnability, threshold)."""
    given = {key: value for key, value in (("policy", policy), ("difficulty", difficulty)) if value is not None}
    try:
        return CurriculumConfig.model_validate(given)
    except ValidationError as exc:
        raise ValueError(describe_error(exc)) from None


class _VerifierSection(BaseModel):
    verifier: VerifierConfig  # nested, so an error names its key as the Hydra apps do: verifier.workers


def verifier_config(verifier: VerifierConfig | dict | None, workers: int | None) -> VerifierConfig | None:
    if verifier is not None and workers is not None:
        raise ValueError("give verifier_workers or verifier (which has its own workers), not both")
    if verifier is None or isinstance(verifier, VerifierConfig):
        return verifier
    try:
        return _VerifierSection.model_validate({"verifier": verifier}).verifier
    except ValidationError as exc:
        raise ValueError(describe_error(exc)) from None


def default_store_url(output_dir: str | None) -> str:
    folder = Path(output_dir or ".")
    folder.mkdir(parents=True, exist_ok=True)
    return store_url_in(folder)


def run_settings(args: Any) -> dict:
    keys = ("max_steps", "learning_rate", "beta", "num_generations", "generation_batch_size", "num_iterations",
            "max_completion_length", "temperature", "loss_type", "seed")
    settings = {k: getattr(args, k) for k in keys if isinstance(getattr(args, k, None), (int, float, str))}
    for package in ("trl", "transformers"):
        try:
            settings[f"{package}_version"] = version(package)
        except PackageNotFoundError:
            pass
    return settings


@dataclass(frozen=True)
class BatchShape:
    """What the curriculum must know of TRL's batching."""

    prompts_per_step: int  # distinct prompts per generation batch = one plan
    group_size: int  # completions per prompt (num_generations)
    max_open_steps: int  # plans TRL may read before it scores the first of them


def trl_batch_shape(args: Any) -> BatchShape:
    """The batch shape of a ``GRPOConfig``, or a one-line ValueError for settings the curriculum
    cannot work under."""
    if getattr(args, "shuffle_dataset", False):
        raise ValueError("set GRPOConfig(shuffle_dataset=False): TRL's shuffle buffer reads ~1000 rows ahead, "
                         "so the curriculum's plans could not adapt")
    if getattr(args, "remove_unused_columns", False):
        raise ValueError("set GRPOConfig(remove_unused_columns=False): palestra_reward needs the "
                         "palestra_step and palestra_group columns")
    if not getattr(args, "max_steps", 0) or args.max_steps <= 0:
        raise ValueError("set GRPOConfig(max_steps=N): the curriculum's dataset is an endless stream")
    # generation_batch_size counts every rank's rows: one plan is the batch of all the processes
    group, batch = int(args.num_generations), int(args.generation_batch_size)
    if batch % group:
        raise ValueError(f"generation_batch_size {batch} is not a multiple of num_generations {group}")
    # One optimizer step reads gradient_accumulation_steps batches before it trains; a plan lasts
    # steps_per_generation × num_iterations of them; the data loader reads one more ahead.
    reuse = max(1, int(args.steps_per_generation) * int(getattr(args, "num_iterations", 1)))
    ahead = math.ceil(int(args.gradient_accumulation_steps) / reuse) + 2
    return BatchShape(batch // group, group, ahead)
