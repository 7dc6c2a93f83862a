"""Data-parallel plumbing for the GRPO recipe: who this process is, and what ranks exchange.

Launched by ``torchrun --nproc_per_node N``, every rank runs the same recipe; the roles split so:

- rank 0 plans and records: it owns the scheduler, the task source, the store, the metrics,
  the checkpoints and the evaluation. It draws each step's tasks and broadcasts them.
- every rank generates and verifies its contiguous share of the tasks; the verified shares are
  gathered to *every* rank, so each holds the whole step's batch. Advantages (batch-wide std
  included), dynamic-sampling decisions and metrics then come out identical everywhere without
  further messages.
- every rank trains on its contiguous share of the groups, scaling its loss by its share of the
  step's normaliser (tokens, sequences); gradients are then *summed* over the ranks, which gives
  exactly the one-process gradient for every aggregation mode, and every rank takes the same
  optimizer step.

Where this departs from ``DistributedDataParallel``: gradients are reduced once per optimizer
step, after all micro-batches, instead of overlapping buckets with the backward pass. DDP needs
every rank to run the same number of forward/backward passes; here shares may be uneven (a step
with fewer groups than ranks, dynamic sampling) and a rank may have nothing to train on.

A single process (no ``torchrun``) gets ``World()``: every method is then a no-op or an identity.
Collectives time out after ``PALESTRA_DIST_TIMEOUT_S`` seconds (default 1800), so a rank that dies
or wedges fails the run instead of hanging it; torchrun then stops the other ranks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist
from tqdm import tqdm

from curriculum.steps import plan_metrics
from trainer.config import ConfigError

T = TypeVar("T")
TIMEOUT_ENV = "PALESTRA_DIST_TIMEOUT_S"
# Gradients are reduced in flat buckets of this many elements: few collectives, bounded extra memory.
BUCKET_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, n: int) -> tuple[int, int]:
        """This rank's contiguous [lo, hi) of ``n`` items, in rank order; shares differ by at most one."""
        return n * self.rank // self.size, n * (self.rank + 1) // self.size

    def place(self, device: torch.device) -> torch.device:
        """One GPU per rank: the local rank's; a CPU stays the CPU."""
        if device.type != "cuda" or self.size == 1:
            return device
        visible = torch.cuda.device_count()
        if self.local_rank >= visible:
            raise ConfigError(f"rank {self.rank} needs GPU {self.local_rank} but {visible} GPU(s) are visible: "
                               f"start at most {visible} rank(s) per machine, or set model.device=cpu")
        return torch.device("cuda", self.local_rank)

    # -- Python objects (pickled, sent over the CPU backend) ------------------------------------
    def broadcast(self, obj: T | None) -> T:
        """Rank 0's ``obj`` on every rank (the others pass None)."""
        if self.size == 1:
            return obj  # type: ignore[return-value]
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def gather_lists(self, items: list[T]) -> list[T]:
        """Every rank's ``items`` joined in rank order, on every rank: each rank's share of a batch
        back in the batch's order."""
        return [item for share in self.gather(items) for item in share]

    def any(self, flag: bool) -> bool:
        """True on every rank if it is true on any (e.g. a stop signal reached one rank)."""
        return flag if self.size == 1 else bool(self.most(int(flag)))

    def most(self, value: int) -> int:
        """The largest of the ranks' ``value`` (e.g. the most passes any rank makes), on every rank."""
        if self.size == 1:
            return value
        largest = torch.tensor([value])
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return int(largest.item())

    def sum_floats(self, values: dict[str, float], keys: list[str]) -> dict[str, float]:
        """``values[key]`` summed over the ranks for each key (missing keys count as 0)."""
        if self.size == 1:
            return {k: values.get(k, 0.0) for k in keys}
        summed = torch.tensor([float(values.get(k, 0.0)) for k in keys], dtype=torch.float64)
        dist.all_reduce(summed)
        return dict(zip(keys, summed.tolist()))

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def main_first(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0, then on the others: rank 0 builds (a model folder, say), the rest read."""
        if self.is_main:
            result = fn()
        self.barrier()
        if not self.is_main:
            result = fn()
        return result

    # -- model tensors (sent over the backend of their device) --------------------------------
    def broadcast_parameters(self, model: torch.nn.Module) -> None:
        """Make every rank's weights rank 0's (after loading or an SFT warm start)."""
        if self.size == 1:
            return
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor, src=0)

    def sum_gradients(self, model: torch.nn.Module) -> None:
        """Sum every parameter's gradient over the ranks, in place.

        A parameter that got a gradient on some rank but not on this one (this rank had no rows,
        say) joins with zeros; one that no rank touched keeps ``grad is None``, exactly as in one
        process, so the optimizer skips it there too."""
        if self.size == 1:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            return
        touched = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
        dist.all_reduce(touched, op=dist.ReduceOp.MAX)
        grads = []
        for p, hit in zip(params, touched.tolist()):
            if hit and p.grad is None:
                p.grad = torch.zeros_like(p)
            if hit:
                grads.append(p.grad)
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()


def _buckets(tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of one dtype and device, each up to BUCKET_ELEMENTS (or one larger tensor)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + t.numel() > BUCKET_ELEMENTS or (t.dtype, t.device) != (bucket[0].dtype, bucket[0].device)):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel()
    if bucket:
        yield bucket


_current: World | None = None


def init() -> World:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1), once; else a one-process World.

    CPU tensors and pickled objects go over gloo, CUDA tensors over NCCL."""
    global _current
    if _current is not None:
        return _current
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        _current = World()
        return _current
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    backend = "gloo"
    if local_rank < torch.cuda.device_count():  # a rank without a GPU of its own trains on the CPU (or says why not)
        torch.cuda.set_device(local_rank)
        backend = "cpu:gloo,cuda:nccl"
    timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "1800")))
    dist.init_process_group(backend=backend, timeout=timeout)
    _current = World(rank=rank, size=size, local_rank=local_rank)
    return _current


def core_share() -> int:
    """This process's share of the cores it may use (CPU affinity, not the machine's count),
    split between the ranks torchrun started on this machine."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, usable // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def shutdown() -> None:
    """Leave the process group (no-op if there is none); ``init`` may join again afterwards."""
    global _current
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _current = None


class QuietLogger:
    """The metrics logger of ranks > 0: rank 0 alone writes metrics, tables and alarms."""

    def __init__(self) -> None:
        self.bar = tqdm(disable=True)

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def advance(self, *args: Any) -> None:
        pass

    def write(self, text: str) -> None:
        pass

    def close(self) -> None:
        self.bar.close()


class SharedCurriculum:
    """The curriculum as every rank sees it. Rank 0 holds the real one — the run's only store
    connection — and plans and draws; every rank gets the same plan and tasks. Only rank 0 records:
    the others return their metrics with the plan's per-domain ones, as rank 0 stores them."""

    def __init__(self, world: World, curriculum: Any | None) -> None:
        if world.is_main != (curriculum is not None):
            raise ValueError("rank 0, and only rank 0, holds the curriculum")
        self.world, self.inner = world, curriculum
        self._plans: dict[int, Any] = {}

    def plan(self, step: int):
        plan = self.world.broadcast(self.inner.plan(step) if self.inner is not None else None)
        # kept until the step is recorded: a trainer may plan ahead of what it records (TRL's data
        # loader reads the next generation batch before it scores this one)
        self._plans[step] = plan
        return plan

    def draw(self, counts: dict, **kwargs: Any) -> list:
        return self.world.broadcast(self.inner.draw(counts, **kwargs) if self.inner is not None else None)

    def reissue(self, plans: list) -> None:
        """Plans handed out before a resume, handed out again as they were (and recorded later)."""
        if self.inner is not None:
            self.inner.reissue(plans)
        self._plans.update((plan.step, plan) for plan in plans)

    def record(self, step: int, groups: list, metrics: dict) -> dict:
        plan = self._plans.pop(step, None)
        if self.inner is not None:
            return self.inner.record(step, groups, metrics)
        if plan is None:
            raise ValueError(f"plan step {step} is recorded but was not planned on this rank")
        return {**metrics, **plan_metrics(plan, groups)}
