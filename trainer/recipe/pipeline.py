"""The async pipeline (``trainer.system.pipeline=async``): step t+1's rollouts are sampled and
verified while step t's update runs, by a copy of the policy from before that update.

    main thread:    plan(t+1) | sync weights, start t+1 | update(t) ............ | wait | record(t)
    rollout thread:                                    | sample + verify (t+1) |

One step of staleness (``max_staleness`` 1): the rollouts that train at step t+1 were sampled by the
weights after update t-1. The loss corrects for it with the behaviour log-probs the sampler
recorded (``trainer/update/losses.py``: the decoupled objective with a truncated importance weight).

A thread, not a second process. What decided it, on the 2-core CPU this project trains on:

- PyTorch's ops release the GIL, so a thread that samples overlaps an update in the main thread;
  the sampler's per-token Python (a few ops per token at the tiny model's sizes) holds the GIL
  briefly, and that is the part that does not overlap;
- ``torch.set_num_threads`` is process-wide (measured: a thread that sets it changes the main
  thread's count too), so the two sides cannot have their own intra-op budgets; instead the whole
  overlap runs at half the update's share of the cores (one thread each on two cores), so neither
  side's OpenMP team spin-waits on the other's cores;
- a second process would need its own copy of the domains, their tool environments and the
  curriculum's draws (the collector draws refills from the curriculum mid-collection), or a
  round trip to the main process per refill round; the weights would go through shared memory and
  the rollouts back through pickles. The thread shares all of that, and its weight copy is a
  ``copy_`` per parameter;
- measured (``bench/overlap.py``, docs/async.md): the sampler beside an update took 2.72-3.13 s on
  a thread and 2.71-3.29 s in a process fed through shared memory, 3.48-4.07 s one after the other.

The rollout thread touches the curriculum (``draw``), the verifier pool and its own model copy
only; while it runs, the main thread touches none of them (the SFT blend's draw is made before the
thread starts, the record after it ends), so no lock is needed and a run draws the same tasks every
time. The plan for t+1 is made before step t is recorded: it saw the statistics up to step t-1,
which the store keeps as ``plan/seen_step`` in the step's metrics (``curriculum/steps.py``).

A checkpoint after step t holds step t+1's rollouts, sampled ahead, and the plan they were drawn
for (``state_dict``); a resumed run trains on them and records that plan, so it goes on as the
uninterrupted run would have (the curriculum's draw state and the RNGs are saved after that draw).

On CUDA the rollout thread queues its kernels on a stream of its own, so the sampler's decoding and
the update's kernels can run on the one device at once instead of in the order the two threads
happened to queue them on the shared default stream. The stream waits for the weight copy before it
samples, and the thread waits for its stream before it hands the rollouts over.

Not supported (rejected by the config): torchrun with several ranks, FSDP, and the captured and
vLLM samplers (which do not record behaviour log-probs).
"""
from __future__ import annotations

import copy
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from curriculum.types import Plan
from trainer.sampling.collect import RolloutCollector, StepRollouts


@dataclass
class Collected:
    """One step's rollouts, sampled ahead by the rollout thread."""

    plan: Plan
    rollouts: StepRollouts
    timer: dict[str, float] = field(default_factory=dict)  # the thread's generate and verify_wait times


class RolloutPipeline:
    """Holds the sampling copy of the policy and the one collection in flight."""

    def __init__(self, model: torch.nn.Module, make_collector) -> None:
        # the behaviour policy: its own parameters, so the update can change the policy's meanwhile
        self.model = copy.deepcopy(model)
        self.model.requires_grad_(False)
        self.collector: RolloutCollector = make_collector(self.model)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="palestra-rollouts")
        self.flight: tuple[Plan, Future, dict[str, float]] | None = None
        self.ready: Collected | None = None
        self.failed: BaseException | None = None  # raised by the next take(): the step it broke in never started
        self.busy = 0.0  # seconds the rollout thread spent collecting, over the run
        device = next(self.model.parameters()).device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @torch.no_grad()
    def sync_weights(self, policy: torch.nn.Module) -> None:
        """The sampler's copy takes the policy's current parameters and buffers."""
        for mine, theirs in zip(self.model.parameters(), policy.parameters()):
            mine.copy_(theirs)
        for mine, theirs in zip(self.model.buffers(), policy.buffers()):
            mine.copy_(theirs)

    def start(self, plan: Plan, policy: torch.nn.Module, curriculum) -> None:
        """Sample and verify ``plan``'s step in the background with the policy as it is now."""
        self.sync_weights(policy)
        if self.stream is not None:  # the copy was queued on the main thread's stream
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        timer: dict[str, float] = defaultdict(float)
        future = self.executor.submit(self._collect, plan, curriculum, timer)
        self.flight = (plan, future, timer)

    def _collect(self, plan: Plan, curriculum, timer: dict[str, float]) -> StepRollouts:
        start = time.perf_counter()
        try:
            if self.stream is None:
                return self.collector.collect_step(plan, curriculum, timer)
            with torch.cuda.stream(self.stream):
                rollouts = self.collector.collect_step(plan, curriculum, timer)
            self.stream.synchronize()  # nothing of it still queued when the next weight copy comes
            return rollouts
        finally:
            self.busy += time.perf_counter() - start

    def wait(self) -> float:
        """Wait for the collection in flight; returns the seconds waited. Its error is kept for the
        next ``take``, so the step that was training is finished and recorded first."""
        if self.flight is None:
            return 0.0
        plan, future, timer = self.flight
        self.flight = None
        start = time.perf_counter()
        try:
            self.ready = Collected(plan, future.result(), dict(timer))
        except BaseException as exc:  # noqa: BLE001 - handed on whole by take()
            self.failed = exc
        return time.perf_counter() - start

    def take(self, step: int) -> Collected | None:
        """The rollouts sampled ahead for ``step``, or None (the first step, or after a resume)."""
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed
        ready, self.ready = self.ready, None
        return ready if ready is not None and ready.plan.step == step else None

    def state_dict(self) -> dict:
        """For a checkpoint between steps: the rollouts sampled ahead (none after the last step)."""
        return {"pipeline_ahead": self.ready} if self.ready is not None else {}

    def load_state_dict(self, state: dict, curriculum) -> None:
        """Take back a checkpoint's rollouts sampled ahead, and give the curriculum back their plan."""
        ahead = state.get("pipeline_ahead")
        if ahead is not None:
            self.ready = ahead
            curriculum.reissue([ahead.plan])

    def close(self) -> None:
        self.executor.shutdown(wait=True)
