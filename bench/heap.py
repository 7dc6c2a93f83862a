"""Peak memory of the real-model job under its memory settings, side by side.

Each row is a process running the SmolLM2 preset (``palestra-train +experiment=smollm2``: all eight
domains, tool episodes, refills, evaluation before and after) for ``--steps`` GRPO steps at the
arithmetic this CPU gets (``model.dtype=auto``):

- ``glibc default``: every setting off (the preset turns trim and checkpointing on), glibc's own
  mmap threshold, which grows to 32 MB (trainer/runtime.py says why the resident set then grows);
- ``threshold``: a fixed ``trainer.system.malloc_mmap_threshold_kb`` (``--threshold-kb``);
- ``trim``: ``trainer.system.trim_heap``, free heap pages handed back after each phase of a step;
- ``checkpointing``: ``trim`` with ``model.gradient_checkpointing``, for what the update itself holds;
- ``kernels``: ``checkpointing`` with ``trainer.system.kernel_cache_capacity`` (``--kernel-cache``),
  compiled bf16 kernels kept per cache (matters only where the CPU runs bf16).

Prints each row's tokens/s, seconds per step and its phases, the evaluations, wall time and peak
RSS, each row's resident set after every step, then each candidate's ratios against the first row,
whether the held-out macro is the same, and how far its GRPO loss is from the first row's at each step.
Rows run minutes apart on one machine: compare them with each other.

    .venv/bin/python bench/heap.py [--steps 4 --eval-tasks 1 --threshold-kb 4096 --kernel-cache 256 --rows default,threshold,trim]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.real_model import print_table, ratios, run_palestra, summary  # noqa: E402
from trainer.runtime import cpu_bf16  # noqa: E402


def settings(threshold_kb: int | None = None, trim: bool = False, checkpointing: bool = False,
             kernels: int | None = None) -> list[str]:
    """Every memory setting spelled out, so that a row measures what it names whatever the preset sets."""
    def value(x: int | None) -> str:
        return "null" if x is None else str(x)
    return [f"trainer.system.malloc_mmap_threshold_kb={value(threshold_kb)}",
            f"trainer.system.trim_heap={str(trim).lower()}", f"model.gradient_checkpointing={str(checkpointing).lower()}",
            f"trainer.system.kernel_cache_capacity={value(kernels)}"]


def candidates(threshold_kb: int, kernels: int) -> dict[str, tuple[str, list[str]]]:
    """Row key -> (label, overrides)."""
    return {"default": ("glibc default", settings()),
            "threshold": (f"{threshold_kb} KB", settings(threshold_kb=threshold_kb)),
            "trim": ("trim", settings(trim=True)),
            "checkpointing": ("trim, checkpointing", settings(trim=True, checkpointing=True)),
            "kernels": (f"trim, checkpointing, {kernels} kernels", settings(trim=True, checkpointing=True, kernels=kernels))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=1)
    parser.add_argument("--threshold-kb", type=int, default=4096)
    parser.add_argument("--kernel-cache", type=int, default=256, help="the kernels row's kernel_cache_capacity")
    parser.add_argument("--rows", default="default,threshold,trim", help="which rows, in order; the first is the baseline")
    parser.add_argument("--overrides", default="", help="more palestra-train overrides for every row")
    args = parser.parse_args()
    table = candidates(args.threshold_kb, args.kernel_cache)
    keys = args.rows.split(",")
    if unknown := [key for key in keys if key not in table]:
        parser.error(f"unknown row {unknown[0]!r}; rows are {', '.join(table)}")
    common = [f"trainer.steps={args.steps}", f"eval.tasks_per_level={args.eval_tasks}", *args.overrides.split()]
    print(f"CPU: {cpu_bf16() or 'no bf16 instructions'}; {os.cpu_count()} cores")
    workdir = Path(tempfile.mkdtemp(prefix="heap-bench-"))
    try:
        rows = [run_palestra(table[key][0], ROOT, common + table[key][1], workdir) for key in keys]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows)
    for row in rows:
        after_steps = ", ".join(f"{s['memory/rss_gb']:.2f}" for s in row["steps"])
        print(f"{row['name']}: resident GB after each step {after_steps}; held-out macro before/after {row['macro']}")
    base = rows[0]
    for row in rows[1:]:
        print(ratios(f"{row['name']} against {base['name']}", summary(base), summary(row)))
        same = "the same" if row["macro"] == base["macro"] else "DIFFERENT: a memory setting changed a result"
        print(f"  held-out macro: {row['macro']} against {base['macro']} ({same}); {loss_agreement(base, row)}")


def loss_agreement(base: dict, row: dict) -> str:
    """How far ``row``'s GRPO losses are from ``base``'s, step by step: a setting that only moves
    memory leaves them equal, one that recomputes (checkpointing) may round differently."""
    differences = [abs(a["loss"] - b["loss"]) for a, b in zip(base["steps"], row["steps"])]
    return "|loss difference| by step: " + ", ".join(f"{d:.1e}" for d in differences)


if __name__ == "__main__":
    main()
