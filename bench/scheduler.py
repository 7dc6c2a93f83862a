"""Scheduler overhead per training step: plan + record (with the SQLite write), 512 outcomes a step.

    python bench/scheduler.py [--steps 20] [--sizes 10,100,1000,10000] [--reasoning-gym]

For every policy and 10 … 10,000 domains (3 levels each), it times ``plan(step)`` followed by
``record(step, outcomes)`` — signals, controller, policy update and the one-transaction store
write — on 64 prompts × 8 completions. Outcomes are built before the clock starts. It prints the
median CPU and wall milliseconds per step, the same without a store, the time left on the trainer's
thread with ``write_behind=True`` at 1,000 domains, and last, the worst policy's per-step CPU at
1,000 domains without a store and with write_behind, each against its bound (1 and 2 ms) as a
ratio (<= 1 meets it), and with the write in record (no bound: that write compresses and stores
the step's 512 completions, which is what write_behind takes off the trainer's thread); at 10,000
domains without a store against 5 ms. With ``--reasoning-gym`` (needs the extra) it also times every policy on
the reasoning-gym domain set — the names and curriculum levels of the ``rg_*`` domains, as a run
with ``domains=rg_*`` sees them — with the write in record, without a store, and with write_behind
(the trainer's setting).
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
# Per-step CPU bounds at 1,000 domains (the trainer's thread for write_behind) and at 10,000
BOUND_NO_STORE_MS, BOUND_BEHIND_MS, BOUND_10000_MS = 1.0, 2.0, 5.0
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


def synthetic(n_domains: int) -> dict[str, tuple[int, ...]]:
    return {f"domain{i:05d}": (1, 2, 3) for i in range(n_domains)}


def reasoning_gym_domains() -> dict[str, tuple[int, ...]]:
    """Names and levels of every reasoning-gym domain, from the adapter itself."""
    from domains.registry import load_all

    return {name: tuple(d.levels) for name, d in load_all(["rg_*"]).items()}


def time_policy(kind: str, domains: int | dict[str, tuple[int, ...]], steps: int, store: StatsStore | None,
                write_behind: bool = False) -> list[tuple[float, float]]:
    """(wall ms, CPU ms of this thread) per timed step; ``domains`` is a count of synthetic
    domains with 3 levels each, or a {name: levels} dict.

    CPU time is what the step costs; wall time also counts waiting for a core, which on a shared
    machine can be most of it. With write_behind the CPU time is the trainer's thread alone.
    """
    domains = synthetic(domains) if isinstance(domains, int) else domains
    sched = Scheduler(domains, parse_policy({"type": kind}), parse_difficulty({"type": "threshold"}),
                      prompts_per_step=PROMPTS, seed=0, store=store, write_behind=write_behind)
    rng = random.Random(0)
    times = []
    for step in range(steps + 2):  # the first two steps warm caches (compiled SQL, numpy paths)
        outcomes = outcomes_for(sched.plan(step), rng)  # built off the clock; plan() is cached
        sched._pending.clear()  # ...so plan again on the clock, from scratch
        if write_behind:
            time.sleep(GENERATION_S)  # stands in for generation, during which the writer runs
        wall, cpu = time.perf_counter(), time.thread_time()
        sched.plan(step)
        sched.record(step, outcomes)
        if step >= 2:
            times.append(((time.perf_counter() - wall) * 1e3, (time.thread_time() - cpu) * 1e3))
    sched.close()
    return times


def med(times: list[tuple[float, float]], which: int) -> float:
    return statistics.median(t[which] for t in times)


WALL, CPU = 0, 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--reasoning-gym", action="store_true",
                        help="also time the reasoning-gym domain set (pip install 'palestra[reasoning_gym]')")
    args = parser.parse_args()
    try:
        rg = reasoning_gym_domains() if args.reasoning_gym else None  # fails before the timing if missing
    except ValueError as exc:  # DomainError: the extra is not installed
        parser.error(str(exc))
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = sorted(POLICIES)
    synced: dict[tuple[str, int], list] = {}
    memory: dict[tuple[str, int], list] = {}
    behind: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = StatsStore(f"sqlite:///{Path(tmp) / 'bench.db'}")
        for n in sizes:
            steps = args.steps if n <= 1000 else max(3, args.steps // 3)
            for kind in kinds:
                synced[(kind, n)] = time_policy(kind, n, steps, store)
                memory[(kind, n)] = time_policy(kind, n, steps, None)
                if n == 1000:
                    behind[kind] = time_policy(kind, n, steps, store, write_behind=True)
        rg_times = {kind: (time_policy(kind, rg, args.steps, store), time_policy(kind, rg, args.steps, None),
                           time_policy(kind, rg, args.steps, store, write_behind=True))
                    for kind in kinds} if rg else {}
        store.close()
    print(f"plan + record per step, {PROMPTS * GROUP} outcomes, SQLite write inside record: "
          "median CPU ms (wall ms)")
    table(kinds, sizes, synced)
    print("\nthe same without a store (signals, policy, controller, allocation only): median CPU ms (wall ms)")
    table(kinds, sizes, memory)
    if behind:
        print(f"\nwrite_behind=True at 1,000 domains, the write on a background thread during a "
              f"{GENERATION_S * 1e3:.0f} ms pause that stands in for generation: trainer-thread CPU ms "
              "(wall ms), median")
        for kind in kinds:
            print(f"{kind:<13}{med(behind[kind], CPU):9.2f} ({med(behind[kind], WALL):6.2f})")
    if rg:
        print(f"\nreasoning-gym domain set: {len(rg)} domains, {sum(map(len, rg.values()))} (domain, level) cells; "
              "median CPU ms (wall ms) per step")
        print(f"{'policy':<13}{'write in record':>18}{'no store':>18}{'write_behind':>18}")
        for kind in kinds:
            print(f"{kind:<13}" + "".join(f"{med(t, CPU):9.2f} ({med(t, WALL):6.2f})" for t in rg_times[kind]))
    print()
    summary(kinds, sizes, memory, behind, synced, rg, rg_times)

def summary(kinds, sizes, memory, behind, synced, rg, rg_times) -> None:
    """The figures against their bounds; the 1,000-domain line comes last."""
    if 10000 in sizes:
        kind = max(kinds, key=lambda k: med(memory[(k, 10000)], CPU))
        print(f"worst per-step time at 10,000 domains without a store: {med(memory[(kind, 10000)], CPU):.2f} ms CPU "
              f"({kind}), {med(memory[(kind, 10000)], CPU) / BOUND_10000_MS:.2f} of the {BOUND_10000_MS:g} ms bound")
    if rg:
        print(worst_line(f"the reasoning-gym set ({len(rg)} domains)", {k: t[1] for k, t in rg_times.items()},
                         {k: t[2] for k, t in rg_times.items()}, {k: t[0] for k, t in rg_times.items()}))
    if 1000 in sizes:
        print(worst_line("1,000 domains", {k: memory[(k, 1000)] for k in kinds}, behind,
                         {k: synced[(k, 1000)] for k in kinds}))


def worst_line(where: str, no_store: dict, behind: dict, inline: dict) -> str:
    """The worst policy's median per-step CPU in each setting, as a share of its bound."""
    def worst(times: dict) -> tuple[str, float, float]:
        kind = max(times, key=lambda k: med(times[k], CPU))
        return kind, med(times[kind], CPU), med(times[kind], WALL)

    (k0, c0, _), (k1, c1, w1), (k2, c2, w2) = worst(no_store), worst(behind), worst(inline)
    return (f"worst per-step time at {where}: {c0:.2f} ms CPU without a store ({k0}; {c0 / BOUND_NO_STORE_MS:.2f} "
            f"of {BOUND_NO_STORE_MS:g} ms); {c1:.2f} ms CPU ({w1:.2f} ms wall) with write_behind ({k1}; "
            f"{c1 / BOUND_BEHIND_MS:.2f} of {BOUND_BEHIND_MS:g} ms); {c2:.2f} ms CPU ({w2:.2f} ms wall) with the "
            f"write in record ({k2}; no bound)")


def table(kinds: list[str], sizes: list[int], results: dict) -> None:
    print(f"{'policy':<13}" + "".join(f"{n:>18,}" for n in sizes))
    for kind in kinds:
        cells = [f"{med(results[(kind, n)], CPU):7.2f} ({med(results[(kind, n)], WALL):6.2f})" for n in sizes]
        print(f"{kind:<13}" + "".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
