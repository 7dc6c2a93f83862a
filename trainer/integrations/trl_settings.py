"""The settings ``TRLCurriculum.build`` takes, validated as the Hydra apps validate them (an error
is one line naming its key), and what a TRL run stores of TRL's own."""
from __future__ import annotations

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
