"""Speed and memory of the real model (model=smollm2, SmolLM2-135M-Instruct) on this machine.

One GRPO step's two phases, as the trainer runs them, on chat-style arithmetic prompts:

- sampling: ``--prompts`` prompts x ``--group`` completions of at most ``--tokens`` tokens
  (temperature 0.7, the trainer's KV-cached sampler): generated tokens per second;
- update: one ``PolicyUpdate`` pass over those rows (micro-batches of ``--micro``), without and with
  a KL reference model (beta > 0 keeps a second copy of the weights);

and the peak resident memory after each. Absolute figures: they depend on the machine and its
load, so run it on an idle one and compare rows of one run with each other.

    .venv/bin/python bench/real_model.py [--prompts 8 --group 4 --tokens 128 --micro 8]
"""
from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from domains.registry import load  # noqa: E402
from trainer.config import ModelConfig, TrainerConfig  # noqa: E402
from trainer.losses import group_advantages  # noqa: E402
from trainer.models import encode_prompt, end_token_ids, load_policy  # noqa: E402
from trainer.pretrained import converted_smollm2  # noqa: E402
from trainer.distributed import World  # noqa: E402
from trainer.reference import make_reference  # noqa: E402
from trainer.rollout import generate  # noqa: E402
from trainer.update import PolicyUpdate  # noqa: E402


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kilobytes on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--micro", type=int, default=8)
    args = parser.parse_args()
    start = time.perf_counter()
    folder = str(converted_smollm2(None))
    tokenizer, model = load_policy(folder, ModelConfig(type="smollm2"), torch.device("cpu"))
    print(f"load (converted folder): {time.perf_counter() - start:.1f} s, peak RSS {peak_rss_gb():.2f} GB")

    domain = load("arithmetic").configure({"prompt_style": "chat"})
    tasks = domain.sample(2, args.prompts, random.Random(0))
    prompts = [encode_prompt(tokenizer, t.prompt) for t in tasks for _ in range(args.group)]
    model.eval()
    start = time.perf_counter()
    rollout = generate(model, prompts, max_new_tokens=args.tokens, eos_id=end_token_ids(model, tokenizer),
                       pad_id=tokenizer.pad_token_id, temperature=0.7, generator=torch.Generator().manual_seed(0))
    seconds = time.perf_counter() - start
    tokens = int(rollout.completion_mask.sum())
    print(f"sampling: {len(prompts)} rows, {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.0f} tokens/s, "
          f"peak RSS {peak_rss_gb():.2f} GB")

    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=False)
    rewards = torch.tensor([domain.verify(t, x).reward for t, x in zip([t for t in tasks for _ in range(args.group)],
                                                                         texts)]).view(args.prompts, args.group)
    advantages = group_advantages(rewards + torch.rand_like(rewards) * 0.1, "group").flatten()  # a gradient to take
    for beta in (0.0, 0.1):
        settings = TrainerConfig.model_validate({"optim": {"mu": 1, "micro_batch_size": args.micro, "lr": 1e-6},
                                                 "loss": {"beta": beta, "sft_coef": 0.0,
                                                          "skip_zero_advantage": False},
                                                 "sampling": {"max_new_tokens": args.tokens}})
        ref = make_reference(model, folder, "device", torch.device("cpu"), World()) if beta else None
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        model.train()
        start = time.perf_counter()
        PolicyUpdate(model, optimizer, schedule, settings, reference=ref)(rollout, advantages)
        print(f"update, beta {beta}: {time.perf_counter() - start:.1f} s for {len(prompts)} rows, "
              f"peak RSS {peak_rss_gb():.2f} GB")


if __name__ == "__main__":
    main()
