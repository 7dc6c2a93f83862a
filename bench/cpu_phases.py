"""CPU savings of the trainer, each measured side by side with what it replaced.

1. Rollouts batched by kind: one training step's tasks (16 prompts x 8 completions over the default
   mix, tool domains included) sampled as the trainer samples them, in generation batches of
   at most 16 tasks of one rollout kind (single completions or tool episodes, one token budget) —
   against batches of one domain, as before.
2. The SFT warm start on this rank's share of the cores — against one thread.
3. SFT micro-batches of examples of similar length (trainer/update/supervised.py ``length_buckets``) — against
   one micro-batch per domain, as before.
4. The GRPO update (forward and backward of the clipped loss over one step's rollouts) on this
   rank's share of the cores — against one thread, as before: the verifiers are idle by then.
5. Sampling (as in 1) on two threads, the main job's setting — against one, as before.
6. The update (as in 4) when every other group agrees on its reward (the main job sees 51-57%
   such groups), leaving their rows out (``trainer.loss.skip_zero_advantage``) — against training on
   every row, as before.

Rounds alternate the two sides so that load from anything else on the machine hits both alike.
All use the built-in tiny model with random weights: it never stops early, so every batch runs to
its token budget (the worst case for both sides). The last six lines are the time ratios
new/old (below 1 is faster).

    python bench/cpu_phases.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from domains.registry import load_all  # noqa: E402
from trainer.models.loading import load_model, load_tokenizer  # noqa: E402
from trainer.models.tiny_model import build_tiny_model  # noqa: E402
from trainer.distributed import core_share  # noqa: E402
from trainer.update.supervised import length_buckets, reference_pairs, supervised_loss  # noqa: E402
from trainer.sampling.batch import generation_chunks  # noqa: E402
from trainer.sampling.episodes import by_rollout, sample_rows  # noqa: E402
from trainer.update.logprobs import sequence_logprobs  # noqa: E402
from trainer.update.losses import grpo_loss  # noqa: E402

DOMAINS = ["arithmetic", "linear_equations", "fractions", "code_functions", "code_lists",
           "tool_calculator", "tool_kv_store", "tool_lookup"]  # the main job's
PROMPTS, GROUP, SFT_BATCH, SFT_STEPS = 16, 8, 64, 10
CHUNK = 128 // GROUP  # tasks per generation batch: the main job's rollout_batch_size // group_size


def step_tasks(domains, rng: random.Random) -> list:
    names = sorted(domains)
    return [domains[name].sample(1, 1, rng)[0] for name in rng.choices(names, k=PROMPTS)]


def chunks_by_kind(tasks, domains) -> list[list]:
    """What the trainer samples now: runs of one rollout kind, cut at CHUNK tasks."""
    ordered = [task for kind in by_rollout(tasks, domains) for task in kind]
    return [chunk for _, chunk in generation_chunks(ordered, CHUNK, domains)]


def chunks_by_domain(tasks, domains) -> list[list]:
    """What it sampled before: runs of one domain, cut at CHUNK tasks."""
    runs: dict[str, list] = {}
    for task in tasks:
        runs.setdefault(task.domain, []).append(task)
    return [run[i:i + CHUNK] for run in runs.values() for i in range(0, len(run), CHUNK)]


def time_rollouts(model, tokenizer, domains, tasks, chunking, rollouts: list | None = None) -> float:
    start = time.perf_counter()
    for chunk in chunking(tasks, domains):
        rows = [task for task in chunk for _ in range(GROUP)]
        rollout, _ = sample_rows(model, tokenizer, rows, domains, max_new_tokens=16, max_episode_tokens=256,
                                 temperature=1.0, generator=torch.Generator().manual_seed(0))
        if rollouts is not None:
            rollouts.append(rollout)
    return time.perf_counter() - start


def by_domain(tokenizer, tasks, domains) -> list[list]:
    """The SFT micro-batches before: one per domain."""
    runs: dict[str, list] = {}
    for task in tasks:
        runs.setdefault(task.domain, []).append(task)
    return [reference_pairs(tokenizer, run, domains) for run in runs.values()]


def by_length(tokenizer, tasks, domains) -> list[list]:
    """What the warm start does now: examples of similar length together, up to 1024 tokens."""
    return length_buckets(reference_pairs(tokenizer, tasks, domains), 1024)


def time_sft(model, tokenizer, domains, rng: random.Random, threads: int, batching=by_length) -> float:
    torch.set_num_threads(threads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    slots = [(name, level) for name in sorted(domains) for level in domains[name].levels]
    start = time.perf_counter()
    for _ in range(SFT_STEPS):
        tasks = [domains[name].sample(level, 1, rng)[0] for name, level in rng.choices(slots, k=SFT_BATCH)]
        optimizer.zero_grad(set_to_none=True)
        for part in batching(tokenizer, tasks, domains):
            (supervised_loss(model, part, tokenizer.pad_token_id) * len(part) / SFT_BATCH).backward()
        optimizer.step()
    return (time.perf_counter() - start) / SFT_STEPS


def time_update(model, rollouts: list, threads: int, agreeing: bool = False, skip: bool = False) -> float:
    """Forward and backward of the clipped objective over every rollout batch of a step; with
    ``agreeing``, every other group has zero advantage, and ``skip`` leaves those rows out."""
    torch.set_num_threads(threads)
    start = time.perf_counter()
    for r in rollouts:
        seqs, attn, mask = r.sequences, r.attention_mask, r.completion_mask
        advantages = torch.linspace(-1, 1, seqs.shape[0])
        if agreeing:
            advantages.view(-1, GROUP)[::2] = 0.0
        if skip:
            keep = advantages != 0
            seqs, attn, mask, advantages = seqs[keep], attn[keep], mask[keep], advantages[keep]
        logp, _ = sequence_logprobs(model, seqs, attn, r.prompt_width, with_entropy=True)
        grpo_loss(logp, logp.detach(), advantages, mask.float(), aggregation="token_mean",
                  max_tokens=16).loss.backward()
    return time.perf_counter() - start


def ratio_line(label: str, new: list[float], old: list[float], unit: str) -> str:
    n, o = statistics.median(new), statistics.median(old)
    return f"{label}: {n:.3f} vs {o:.3f} {unit} -> ratio new/old {n / o:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    domains = load_all(DOMAINS)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(Path(tmp) / "tiny"))
        tokenizer, model = load_tokenizer(path, tiny=True), load_model(path, torch.device("cpu"))
        share = core_share()  # what the warm start uses by default

        grouped, per_domain, two_threads, rollouts = [], [], [], []
        for round_ in range(args.rounds):
            tasks = step_tasks(domains, random.Random(round_))
            torch.set_num_threads(1)
            grouped.append(time_rollouts(model, tokenizer, domains, tasks, chunks_by_kind, rollouts if round_ == 0 else None))
            per_domain.append(time_rollouts(model, tokenizer, domains, tasks, chunks_by_domain))
            torch.set_num_threads(min(2, share))
            two_threads.append(time_rollouts(model, tokenizer, domains, tasks, chunks_by_kind))

        shared, single, domain_batches = [], [], []
        for round_ in range(args.rounds):
            shared.append(time_sft(model, tokenizer, domains, random.Random(round_), share))
            single.append(time_sft(model, tokenizer, domains, random.Random(round_), 1))
            domain_batches.append(time_sft(model, tokenizer, domains, random.Random(round_), share, by_domain))

        update_shared, update_single, update_every_row, update_skipping = [], [], [], []
        for _ in range(args.rounds):
            update_shared.append(time_update(model, rollouts, share))
            update_single.append(time_update(model, rollouts, 1))
            update_every_row.append(time_update(model, rollouts, share, agreeing=True))
            update_skipping.append(time_update(model, rollouts, share, agreeing=True, skip=True))

    print(ratio_line(f"rollouts of one step ({PROMPTS}x{GROUP}), by kind vs by domain", grouped, per_domain, "s"))
    print(ratio_line(f"SFT step ({SFT_BATCH} examples), {share} threads vs 1", shared, single, "s"))
    print(ratio_line(f"SFT step ({SFT_BATCH} examples), length buckets vs one batch per domain", shared,
                     domain_batches, "s"))
    print(ratio_line(f"GRPO update of one step ({PROMPTS}x{GROUP}), {share} threads vs 1", update_shared,
                     update_single, "s"))
    print(ratio_line(f"rollouts of one step ({PROMPTS}x{GROUP}), {min(2, share)} threads vs 1", two_threads, grouped, "s"))
    print(ratio_line("GRPO update, half the groups agreeing, their rows skipped vs trained", update_skipping,
                     update_every_row, "s"))


if __name__ == "__main__":
    main()
