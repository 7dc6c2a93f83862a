"""The TrainerCallback of a TRL run with a Palestra curriculum (``TRLCurriculum.callback()``).

- ``on_train_begin``: TRL batches as the curriculum was built for; a resumed trainer resumed at
  the checkpoint the curriculum was restored from; checkpoints fall between generation batches;
  the held-out evaluation before the first step (``evaluation.at_start``);
- ``on_save``: the curriculum's state into the checkpoint folder (``trl_checkpoint``), with every
  rank's RNG states (``trl_ranks``);
- ``on_step_begin``: on the first step after a resume, the RNG states of the checkpoint (why: below);
- ``on_step_end``: the held-out evaluation every ``evaluation.every`` steps and at the last one,
  into TRL's logs and the store (``trl_evaluation``);
- ``on_train_end``: records what is left of the steps still open.

It holds the curriculum it was made by without importing its module (``trainer.integrations.trl``
imports this one).
"""
from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from trainer.integrations import trl_checkpoint
from trainer.integrations.trl_evaluation import log_to_trainer
from trainer.recipe.checkpoint import capture_rng, restore_rng


class CurriculumCallback(TrainerCallback):
    """See the module docstring; ``trainer`` (set by ``TRLCurriculum.attach``) is where the
    held-out evaluation's numbers are logged."""

    def __init__(self, curriculum: Any, trainer: Any = None) -> None:
        self.curriculum = curriculum  # a TRLCurriculum
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.curriculum.check_args(args)
        self._check_resume(args, state)
        if state.save_steps and args.save_strategy == "steps" and not trl_checkpoint.at_plan_boundary(
                args, state.save_steps):
            raise ValueError(f"save_steps={state.save_steps} ends checkpoints inside a generation batch "
                             "(steps_per_generation x num_iterations micro-steps), which a resumed run could not "
                             "go on from: make it a multiple of one generation batch's optimizer steps")
        evaluation = self.curriculum.evaluation
        if evaluation is not None and self.trainer is None:
            raise ValueError("held-out evaluation logs through the trainer: call curriculum.attach(trainer) "
                             "before trainer.train()")
        if evaluation is not None and evaluation.config.at_start and state.global_step == 0:
            self._evaluate(state.global_step, kwargs, keep="before")

    def _check_resume(self, args, state) -> None:
        resumed = self.curriculum.resumed_at  # the global step of the checkpoint it was restored from
        if state.global_step == 0 and resumed is None:
            return
        if resumed is None:  # the trainer would replay skipped batches, opening plans nobody scores
            raise ValueError(f"the trainer resumes at step {state.global_step} but the curriculum starts afresh: "
                             "build it with TRLCurriculum.build(..., resume_from_checkpoint=...) too")
        trl_checkpoint.require_resumable(args)
        if state.global_step != resumed:
            raise ValueError(f"the curriculum was restored from step {resumed}'s checkpoint, the trainer starts at "
                             f"step {state.global_step}: pass the same resume_from_checkpoint to trainer.train()")

    def on_save(self, args, state, control, **kwargs):
        world = self.curriculum.world
        rng = world.gather(capture_rng())  # every rank's, in rank order: each resumes with its own
        if world.is_main:  # which holds the Curriculum, and whose file every rank reads on resume
            folder = trl_checkpoint.checkpoint_folder(args, state.global_step)
            trl_checkpoint.save(folder, {**self.curriculum.state_dict(), "global_step": state.global_step,
                                         "rng": rng[0], "rank_rng": rng})

    def on_step_begin(self, args, state, control, **kwargs):
        # TRL restores its RNG states (Trainer._load_rng_state) before it starts the data loader,
        # and torch's DataLoader draws two seeds from the global CPU generator when an iterator over
        # an IterableDataset starts (its shared seed and its base seed), which the uninterrupted
        # run drew at its start. So the resumed run would sample other completions from the second
        # step on (the tests saw half of them differ). Restoring the states saved with the
        # checkpoint again here, after the loader started and before the step generates, gives
        # the sampler the states the uninterrupted run had at this point: nothing between its save
        # and its next step draws from them.
        rng = self.curriculum.take_resumed_rng()
        if rng is not None:
            restore_rng(rng)

    def on_step_end(self, args, state, control, **kwargs):
        evaluation = self.curriculum.evaluation
        if evaluation is not None and evaluation.due(state.global_step, state.max_steps, control.should_training_stop):
            last = state.global_step >= state.max_steps or control.should_training_stop
            self._evaluate(state.global_step, kwargs, keep="after" if last else None)

    def on_train_end(self, args, state, control, **kwargs):
        self.curriculum.finish()

    def _evaluate(self, global_step: int, kwargs: dict, keep: str | None) -> None:
        if not self.curriculum.world.is_main:  # rank 0 evaluates and stores (trl_ranks)
            return
        metrics = self.curriculum.evaluate(kwargs["model"], kwargs["processing_class"], global_step, keep=keep)
        log_to_trainer(self.trainer, metrics)
