"""A TRL run with a Palestra curriculum on several processes: what each rank does, and what ranks exchange.

    accelerate launch --multi_gpu --num_processes 2 train.py   # on the CPU: GRPOConfig(use_cpu=True), gloo

Every rank runs the same script and builds its own ``TRLCurriculum``; the roles split as in
Palestra's own trainer under torchrun (``trainer.distributed``):

- rank 0 holds the Curriculum — scheduler, task stream, the run's only store connection — and
  plans and draws; ``SharedCurriculum`` broadcasts each plan and its tasks, so every rank holds the
  same plan steps and the tasks of each (the payload a verifier needs), and only rank 0 records;
- the data path: TRL turns accelerate's ``dispatch_batches`` off for an ``IterableDataset``, and
  accelerate then wraps the curriculum's one-shard stream in ``IterableDatasetShard``: every rank
  reads the *whole* stream and keeps its contiguous slice of each global batch. So every rank runs
  ``rows()``, which asks the shared curriculum for each plan at the same point of the loop on
  every rank: the copies are one stream, and each rank's slice holds its share of the prompts
  (a group of ``num_generations`` may straddle two ranks, which TRL allows: it gathers rewards);
- scoring: TRL calls the reward function on every rank with that rank's completions. Each rank
  verifies its own (the verification spreads over the ranks' verifier pools, each completion is
  verified once), then the verdicts are gathered to every rank in rank order — the order one
  process would have scored the batch in. Gathered to every rank, not only to rank 0, because
  every rank must know when a step is complete: it drops the step from what it has handed out
  (the rollout function and the read-ahead check read that). Rank 0 alone writes the step;
- checkpoints: rank 0 writes ``palestra_curriculum.pt`` with every rank's RNG states in it (gathered);
  on resume each rank reads the file and takes its own states back;
- held-out evaluation runs on rank 0 (on its copy of the model, between two steps; the others go on
  and wait for it at TRL's next collective).
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist

from trainer.distributed import World


def world_of(args: Any) -> World:
    """This process's place among the ranks TRL's ``args`` train on (accelerate has joined the
    process group by the time a ``GRPOConfig`` knows its ``world_size``)."""
    size = int(getattr(args, "world_size", 1))
    if size == 1:
        return World()
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"GRPOConfig says {size} processes but no process group is running: start the script "
                         "with accelerate launch (or torchrun)")
    return World(rank=int(args.process_index), size=size, local_rank=int(args.local_process_index))


def own_rng_states(world: World, saved: dict) -> dict:
    """This rank's RNG states from a checkpoint's curriculum file, or a one-line error when the
    checkpoint was saved by another number of processes."""
    ranks = saved.get("rank_rng") or [saved["rng"]]
    if len(ranks) != world.size:
        raise ValueError(f"resume_from_checkpoint: the checkpoint was saved by {len(ranks)} process(es), this run has "
                         f"{world.size}: resume with the number it was saved with")
    return ranks[world.rank]
