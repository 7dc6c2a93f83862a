"""Simulator speed against the issue's budgets, measured side by side in one process.

    python bench/sim.py [--steps 2000] [--skip-huge] [--skip-tenk]

Runs ``hundreds`` (200 domains, 64 prompts x 8 completions a step) for ``--steps`` steps four ways,
all through the production ``Curriculum.record_outcomes`` (512 Outcomes a step): with the SQLite store as the
simulator uses it by default (one transaction a step: aggregates, plan, metrics), the same plus one
``results`` row per completion (``store_results``), that with ``write_behind=True``, and without a
store — then ``huge`` (1,000 domains, 2,048 completions a step) and ``tenk`` (10,000 domains,
8,192 completions a step, its own 200 steps whatever ``--steps`` says) with the default store. It prints
CPU seconds of this process (all threads; wall time on a shared machine mostly measures the
neighbours), the store's share, and each budget as a ratio (<= 1 meets it):

- one ``hundreds`` run of 2,000 steps: 30 s on one core;
- one ``huge`` run of 2,000 steps: 20 s;
- one ``tenk`` run of 200 steps: 60 s (building its world included);
- the 7-policy x 8-seed sweep on ``hundreds``: 15 min on 2 cores, projected as 56 runs' CPU / 2.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from curriculum.config import parse_difficulty, parse_policy
from curriculum.sim.config import ScenarioConfig, SimAppConfig
from curriculum.sim.runner import run_sim
from curriculum.store import StatsStore

CONF = Path(__file__).resolve().parents[1] / "conf" / "sim"


def config(scenario: str, steps: int, policy: str = "uniform", write_behind: bool = False,
           store_results: bool = False) -> SimAppConfig:
    sim = yaml.safe_load((CONF / f"{scenario}.yaml").read_text())
    sim["steps"] = steps
    return SimAppConfig(sim=ScenarioConfig(**sim), policy=parse_policy({"type": policy}),
                        difficulty=parse_difficulty({"type": "threshold"}), write_behind=write_behind,
                        store_results=store_results)


def timed(cfg: SimAppConfig, db: Path | None) -> tuple[float, float, float]:
    """(CPU s, wall s, final macro) of one run; a fresh database file per run."""
    store = StatsStore(f"sqlite:///{db}") if db is not None else None
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        result = run_sim(cfg, store)
    finally:
        if store is not None:
            store.close()
    return time.process_time() - cpu, time.perf_counter() - wall, result.final_macro


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--skip-huge", action="store_true")
    parser.add_argument("--skip-tenk", action="store_true")
    args = parser.parse_args()
    scale = 2000 / args.steps  # budgets are for 2,000 steps
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = {
            "hundreds, store": timed(config("hundreds", args.steps), tmp / "a.db"),
            "hundreds, store + results rows": timed(config("hundreds", args.steps, store_results=True), tmp / "b.db"),
            "  the same, write_behind": timed(config("hundreds", args.steps, write_behind=True, store_results=True),
                                                tmp / "c.db"),
            "hundreds, no store": timed(config("hundreds", args.steps), None),
        }
        if not args.skip_huge:
            runs["huge, store"] = timed(config("huge", args.steps), tmp / "d.db")
        if not args.skip_tenk:
            runs["tenk (200 steps), store"] = timed(config("tenk", 200), tmp / "e.db")
    print(f"{'run':32s} {'CPU s':>8s} {'wall s':>8s} {'final macro':>12s}")
    for name, (cpu, wall, final) in runs.items():
        print(f"{name:32s} {cpu:8.2f} {wall:8.2f} {final:12.4f}")
    cpu_store, cpu_bare = runs["hundreds, store"][0], runs["hundreds, no store"][0]
    cpu_rows = runs["hundreds, store + results rows"][0]
    print(f"store share of a hundreds run: {1 - cpu_bare / cpu_store:.2f}; with results rows "
          f"{1 - cpu_bare / cpu_rows:.2f} (CPU ratio rows/aggregates {cpu_rows / cpu_store:.2f})")
    print(f"hundreds 2,000 steps / 30 s budget: {cpu_store * scale / 30:.2f} "
          f"(with results rows {cpu_rows * scale / 30:.2f})")
    if "tenk (200 steps), store" in runs:
        print(f"tenk 200 steps / 60 s budget: {runs['tenk (200 steps), store'][0] / 60:.2f}")
    print(f"7x8 sweep on 2 cores (projected 56 x CPU / 2) / 15 min budget: {56 * cpu_store * scale / 2 / 900:.2f}")
    if "huge, store" in runs:  # last: the headline figure
        print(f"huge 2,000 steps / 20 s budget: {runs['huge, store'][0] * scale / 20:.2f}")


if __name__ == "__main__":
    main()
