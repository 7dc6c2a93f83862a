"""One GRPO step of Palestra against one of TRL's GRPOTrainer, alternating, in one process.

Same tiny model (built fresh, same weights), same batch shape: 8 prompts x 8 completions, up to
16 new tokens, beta = 0.04 (so both load a reference model), mu = 1, the same math verifier, and
the same torch threads (``--threads``, default this machine's share of the cores) for every phase of
both steps: Palestra's sampling and update, and TRL's whole step. TRL runs its training loop; a
callback times each of its steps and, between two of them, runs and times one Palestra step — so both share the machine's state at every moment. The last line is the
median step-time ratio ours / TRL (below 1.0 means Palestra is faster).

    .venv/bin/pip install -e '.[bench]' && .venv/bin/python bench/step_vs_trl.py [--rounds 12] [--threads N]
"""
from __future__ import annotations

import argparse
import logging
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from trainer.runtime import within_share

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

PROMPTS, GROUP, NEW_TOKENS, BETA = 8, 8, 16, 0.04


def palestra_recipe(workdir: Path, threads: int):
    from trainer.config import validate_config
    from trainer.recipe.grpo import GRPORecipe

    config = validate_config({
        "name": "bench", "seed": 0, "output_dir": str(workdir / "palestra"),
        "domains": ["arithmetic"], "policy": {"type": "uniform"}, "difficulty": {"type": "fixed"},
        # the step TRL takes too: one pass, no refills, no blend, T = 1, every row trained, a constant rate
        "trainer": {"steps": 10_000, "prompts_per_step": PROMPTS, "group_size": GROUP,
                    "sampling": {"max_new_tokens": NEW_TOKENS, "rollout_batch_size": PROMPTS * GROUP,
                                 "temperature": 1.0, "dynamic_sampling": False},
                    "loss": {"beta": BETA, "sft_coef": 0.0, "skip_zero_advantage": False},
                    "optim": {"mu": 1, "lr": 1e-5, "lr_decay": "constant", "micro_batch_size": PROMPTS * GROUP},
                    "system": {"cpu_threads": threads, "update_cpu_threads": threads}},
        "verifier": {"workers": 1}, "sft": {"steps": 0}, "eval": {"tasks_per_level": 1}, "checkpoint": {"every": 0},
    })
    recipe = GRPORecipe(config)
    recipe.setup()
    recipe.logger.bar.disable = True
    return recipe


def trl_trainer(model_dir: str, workdir: Path, between_steps):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from domains.math.answer import grade_answer
    from domains.math.generated import ARITHMETIC
    from trainer.models.loading import load_tokenizer

    tasks = ARITHMETIC.sample(1, 512, random.Random(0))
    data = Dataset.from_list([{"prompt": t.prompt, "answer": t.payload["answer"]} for t in tasks])

    def reward(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [grade_answer(text, gold).reward for text, gold in zip(texts, answer)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.start)
            between_steps()

    timer = Timer()
    tokenizer = load_tokenizer(model_dir, tiny=True)
    args = GRPOConfig(
        output_dir=str(workdir / "trl"), per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
        max_completion_length=NEW_TOKENS, beta=BETA, num_iterations=1, learning_rate=1e-5, use_cpu=True,
        report_to="none", logging_steps=10_000, save_strategy="no", bf16=False, max_steps=10_000,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=reward, args=args,
                          train_dataset=data, processing_class=tokenizer, callbacks=[timer])
    return trainer, timer


class Done(Exception):
    pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both trainers (default: this machine's share of the cores)")
    args = parser.parse_args()
    threads = within_share(args.threads)
    print(f"threads: {threads} for both trainers")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        recipe = palestra_recipe(workdir, threads)
        ours: list[float] = []
        step = iter(range(1, 10**9))

        def one_palestra_step():
            start = time.perf_counter()
            recipe.train_step(next(step))
            ours.append(time.perf_counter() - start)
            torch.set_num_threads(threads)  # TRL's next step runs on what Palestra's left set
            if len(ours) >= args.rounds + args.warmup:
                raise Done

        trainer, timer = trl_trainer(str(workdir / "palestra" / "tiny-model"), workdir, one_palestra_step)
        torch.set_num_threads(threads)
        try:
            trainer.train()
        except Done:
            pass
        finally:
            recipe.cleanup()
    ours, theirs = ours[args.warmup:], timer.times[args.warmup:len(ours) + args.warmup]
    print(f"{'round':>5} {'palestra_s':>11} {'trl_s':>8}")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        print(f"{i:>5} {a:>11.3f} {b:>8.3f}")
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(f"median step time: palestra {statistics.median(ours):.3f}s, trl {statistics.median(theirs):.3f}s")
    print(f"median ratio palestra/trl: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
