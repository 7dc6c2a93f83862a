"""TRL runs with a Palestra curriculum, for tests/test_trl_ranks.py: run in the test's process, or
launched on two processes as ``accelerate launch ... tests/trl_ranks_helpers.py RUNS.json``, which
plays the runs listed in the file one after another in the same processes (each process starts
torch and TRL once: on a 2-core machine that start is most of a short run's time).

A run is a dict: ``model`` (a folder), ``out``, ``domains``, ``options``, ``policy``, ``prompts``
and ``group`` (per generation batch, all processes together), ``steps``, and optionally
``stop_after`` (a step after which training stops, as a crash would stop it), ``resume`` (a
checkpoint folder), ``evaluation`` (held-out evaluation settings), ``rollout`` (tool episodes played by test_trl_rollout's scripted sampler).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # trl_helpers' domains; spawned verifier workers inherit it


def train(run: dict) -> str:
    """One run (or the resumed rest of one); returns its run id."""
    import trl
    from transformers import AutoModelForCausalLM, TrainerCallback

    from trainer.integrations.trl import TRLCurriculum
    from trainer.models.loading import load_tokenizer

    stop_after = run.get("stop_after")

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if stop_after is not None and state.global_step >= stop_after:
                control.should_training_stop = True

    processes = int(os.environ.get("WORLD_SIZE", "1"))
    args = trl.GRPOConfig(
        output_dir=run["out"], per_device_train_batch_size=run["prompts"] * run["group"] // processes,
        num_generations=run["group"], max_completion_length=8, beta=0.0, learning_rate=1e-3, max_steps=run["steps"],
        logging_steps=1, seed=0, shuffle_dataset=False, use_cpu=True, bf16=False, report_to="none",
        save_strategy="steps", save_steps=2, ignore_data_skip=True, dataloader_num_workers=0, disable_tqdm=True)
    tokenizer = load_tokenizer(run["model"], tiny=True)
    resume = run.get("resume")
    with TRLCurriculum.build(run["domains"], args, policy={"type": run["policy"]},
                             difficulty={"type": "threshold", "window": 2}, domain_options=run.get("options"),
                             verifier_workers=1, resume_from_checkpoint=resume,
                             evaluation=run.get("evaluation")) as curriculum:
        rollout = None
        if run.get("rollout"):
            from test_trl_rollout import ScriptedSampler

            rollout = curriculum.rollout_func(sampler=ScriptedSampler(tokenizer))
        trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(run["model"]), args=args,
                                  reward_funcs=curriculum.palestra_reward, train_dataset=curriculum.dataset(),
                                  processing_class=tokenizer, rollout_func=rollout, callbacks=[Stop()])
        curriculum.attach(trainer)
        trainer.train(resume_from_checkpoint=resume)
    return curriculum.run_id


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL warns that rollout_func is experimental
    for planned in json.loads(Path(sys.argv[1]).read_text()):
        train(planned)
