"""Scheduler overhead per training step: plan + record (with the SQLite write), 512 outcomes a step.

    python bench/scheduler.py [--steps 20] [--sizes 10,100,1000,10000]

For every policy and 10 … 10,000 domains (3 levels each), it times ``plan(step)`` followed by
``record(step, outcomes)`` — signals, controller, policy update and the one-transaction store
write — on 64 prompts × 8 completions. Outcomes are built before the clock starts. It prints the
median milliseconds per step, the share of it spent without the store (same scheduler, store=None),
the time left on the trainer's thread with ``write_behind=True`` at 1,000 domains, and last, the
worst per-step time at 1,000 domains (target: <= 5 ms).
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from curriculum.config import parse_difficulty, parse_policy
from curriculum.policies import POLICIES
from curriculum.scheduler import Scheduler
from curriculum.store import StatsStore
from curriculum.types import Outcome, Plan

PROMPTS, GROUP = 64, 8  # 512 outcomes per step
GENERATION_S = 0.04  # pause between steps in the write-behind runs (real generation takes seconds)
COMPLETION = "Let x be the unknown. Then 3x + 4 = 19, so 3x = 15 and x = 5. \\boxed{5}\n" * 3


def outcomes_for(plan: Plan, rng: random.Random) -> list[Outcome]:
    out, group = [], 0
    for (domain, level), n in plan.counts.items():
        for _ in range(n):
            p = rng.random()
            rewards = [float(rng.random() < p) for _ in range(GROUP)]
            mean = sum(rewards) / GROUP
            std = (sum((r - mean) ** 2 for r in rewards) / GROUP) ** 0.5
            out += [Outcome(domain, level, f"{domain}/{group}", group, r, r > 0.5, "ok" if r else "wrong",
                            (r - mean) / (std + 1e-4), prompt_hash=f"{group:016x}",
                            completion_hash=f"{group * GROUP + i:016x}", latency_s=0.01,
                            completion=COMPLETION, verifier_version="1")
                    for i, r in enumerate(rewards)]
            group += 1
    return out


def time_policy(kind: str, n_domains: int, steps: int, store: StatsStore | None,
                write_behind: bool = False) -> list[float]:
    domains = {f"domain{i:05d}": (1, 2, 3) for i in range(n_domains)}
    sched = Scheduler(domains, parse_policy({"type": kind}), parse_difficulty({"type": "threshold"}),
                      prompts_per_step=PROMPTS, seed=0, store=store, write_behind=write_behind)
    rng = random.Random(0)
    times = []
    for step in range(steps + 2):  # the first two steps warm caches (compiled SQL, numpy paths)
        outcomes = outcomes_for(sched.plan(step), rng)  # built off the clock; plan() is cached
        sched._pending.clear()  # ...so plan again on the clock, from scratch
        if write_behind:
            time.sleep(GENERATION_S)  # stands in for generation, during which the writer runs
        start = time.perf_counter()
        sched.plan(step)
        sched.record(step, outcomes)
        if step >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    sched.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--sizes", default="10,100,1000,10000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = sorted(POLICIES)
    with_store: dict[tuple[str, int], list[float]] = {}
    without: dict[tuple[str, int], float] = {}
    behind: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = StatsStore(f"sqlite:///{Path(tmp) / 'bench.db'}")
        for n in sizes:
            steps = args.steps if n <= 1000 else max(3, args.steps // 3)
            for kind in kinds:
                with_store[(kind, n)] = time_policy(kind, n, steps, store)
                without[(kind, n)] = statistics.median(time_policy(kind, n, steps, None))
                if n == 1000:
                    behind[(kind, n)] = time_policy(kind, n, steps, store, write_behind=True)
        store.close()
    print(f"plan + record per step, {PROMPTS * GROUP} outcomes, SQLite store: median ms "
          f"(in brackets: share of it without the store)")
    print(f"{'policy':<13}" + "".join(f"{n:>17,}" for n in sizes))
    for kind in kinds:
        cells = []
        for n in sizes:
            med = statistics.median(with_store[(kind, n)])
            cells.append(f"{med:9.2f} ({without[(kind, n)] / med:4.0%})")
        print(f"{kind:<13}" + "".join(f"{c:>17}" for c in cells))
    if 1000 in sizes:
        print(f"\nwrite_behind=True at 1,000 domains (store write on a background thread, {GENERATION_S * 1e3:.0f} ms "
              "pause between steps for generation): ms on the trainer's thread, median / max")
        for kind in kinds:
            times = behind[(kind, 1000)]
            print(f"{kind:<13}{statistics.median(times):9.2f} / {max(times):6.2f}")
        worst_kind = max(kinds, key=lambda k: statistics.median(with_store[(k, 1000)]))
        worst_median = statistics.median(with_store[(worst_kind, 1000)])
        worst_behind = max(kinds, key=lambda k: statistics.median(behind[(k, 1000)]))
        print(f"worst per-step time at 1,000 domains: {worst_median:.2f} ms median with the write in record "
              f"({worst_kind}); {statistics.median(behind[(worst_behind, 1000)]):.2f} ms with write_behind "
              f"({worst_behind}); target <= 5 ms")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
