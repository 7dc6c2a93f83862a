"""Held-out evaluation of a TRL run: Palestra's own (``trainer.recipe.evaluate.HeldoutEvaluation``,
the function the own trainer evaluates with) on the model TRL trains, its numbers in TRL's logs
and in the store as the own trainer stores them, so ``palestra report`` and ``compare`` read them.

    TRLCurriculum.build(..., evaluation={"every": 50, "tasks_per_level": 16})

Settings: the own trainer's ``eval`` section (``every``, 0 for only at the start and the end;
``tasks_per_level``, ``temperature``, ``samples``, ``seed``) and what TRL has no setting for:
``at_start`` (evaluate before the first step, as the own trainer does after its warm start),
``max_new_tokens`` (default: TRL's ``max_completion_length``), ``max_episode_tokens`` and
``batch_size`` (sequences decoded together).
"""
from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel, Field, ValidationError

from curriculum.config import describe_error
from domains.api import Domain
from domains.verify.pool import Pool
from trainer.config import EvalConfig, SamplingConfig
from trainer.recipe.evaluate import HeldoutEvaluation
from trainer.sampling.rollout import generate

_DEFAULTS = SamplingConfig()


class EvaluationConfig(EvalConfig):
    """``TRLCurriculum.build(evaluation=...)``: the own trainer's ``eval`` section and the budgets
    TRL's config does not give."""

    at_start: bool = True
    max_new_tokens: int | None = Field(None, gt=0)  # None: GRPOConfig.max_completion_length
    max_episode_tokens: int = Field(_DEFAULTS.max_episode_tokens, gt=0)
    batch_size: int = Field(64, gt=0)


class _Section(BaseModel):
    evaluation: EvaluationConfig  # nested, so an error names its key: evaluation.every


def evaluation_config(given: EvaluationConfig | Mapping[str, Any]) -> EvaluationConfig:
    """The validated settings, or a one-line ValueError naming the bad key."""
    if isinstance(given, EvaluationConfig):
        return given
    if not isinstance(given, Mapping):
        raise ValueError(f"evaluation must be a dict of settings, not {type(given).__name__}")
    try:
        return _Section.model_validate({"evaluation": dict(given)}).evaluation
    except ValidationError as exc:
        raise ValueError(describe_error(exc)) from None


class TRLEvaluation:
    """When to evaluate, and the held-out set (kept out of training by the curriculum's draws)."""

    def __init__(self, domains: dict[str, Domain], config: EvaluationConfig, max_completion_length: int) -> None:
        sampling = SamplingConfig(max_new_tokens=config.max_new_tokens or int(max_completion_length),
                                  max_episode_tokens=config.max_episode_tokens, rollout_batch_size=config.batch_size)
        self.config = config
        self.heldout = HeldoutEvaluation(domains, config, sampling)
        self.last_step: int | None = None  # the TRL global step evaluated last

    @property
    def heldout_ids(self) -> set[str]:
        return {task.id for task in self.heldout.tasks}

    def due(self, global_step: int, max_steps: int, stopping: bool) -> bool:
        """Every ``every`` steps and at the last one, never twice at one step."""
        if global_step == self.last_step:
            return False
        every = self.config.every
        return (every > 0 and global_step % every == 0) or global_step >= max_steps or stopping

    def run(self, model, tokenizer, pool: Pool, global_step: int, keep: str | None = None) -> dict[str, float]:
        """Held-out success now (``eval/<domain>/level<k>``, ``eval/<domain>``, ``eval/macro``);
        ``keep`` files it as the own trainer does ("before" or "after" training)."""
        metrics = self.heldout.run(model, tokenizer, pool, generate, keep=keep)
        self.last_step = global_step
        return metrics

    def summary(self) -> dict:
        """Held-out success at the start and the end, the macro gain and its paired 95% interval."""
        return self.heldout.summary()

    def state_dict(self) -> dict:
        return {**self.heldout.state_dict(), "last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        # False (and the start's numbers dropped) when the held-out set or its decoding changed
        self.heldout.load_state_dict(state)
        self.last_step = state.get("last_step")


def log_to_trainer(trainer: Any, metrics: dict[str, float]) -> None:
    """Into TRL's logs (its log history and every reporter) as one entry of its own.

    ``GRPOTrainer.log`` folds the training metrics it has gathered since its last log into
    whatever is logged while the model is in training mode, and only its evaluation metrics in
    eval mode, as TRL's own ``evaluate`` logs. So this logs in eval mode: the step's training
    metrics stay for the step's own log entry. Logging also clears the trainer's ``should_log``,
    which would skip that entry (its metrics would join the next one): it is put back."""
    model, control = trainer.model, trainer.control
    training, should_log = model.training, control.should_log
    model.eval()
    try:
        trainer.log(dict(metrics))
    finally:
        model.train(training)
        control.should_log = should_log
