"""Peak memory of the real-model job with and without the fixed malloc threshold, side by side.

Two processes run the SmolLM2 preset (``palestra-train +experiment=smollm2``: all eight domains,
tool episodes, refills, evaluation before and after) for ``--steps`` GRPO steps at the arithmetic
this CPU gets (``model.dtype=auto``): one with ``trainer.system.malloc_mmap_threshold_kb=null``
(glibc's own threshold, which grows to 32 MB), one with a fixed ``--threshold-kb`` (256 KB;
trainer/runtime.py says why). The resident set grows with the steps without the threshold, so
measure enough of them to see it (the default 8). Prints each row's tokens/s, seconds per step and its phases, the
evaluations, wall time and peak RSS, then the ratios. Rows run minutes apart on one machine:
compare them with each other.

    .venv/bin/python bench/heap.py [--steps 8 --eval-tasks 1 --threshold-kb 256]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-tasks", type=int, default=1)
    parser.add_argument("--threshold-kb", type=int, default=256)
    parser.add_argument("--overrides", default="", help="more palestra-train overrides for both rows")
    args = parser.parse_args()
    common = [f"trainer.steps={args.steps}", f"eval.tasks_per_level={args.eval_tasks}", *args.overrides.split()]
    print(f"CPU: {cpu_bf16() or 'no bf16 instructions'}; {os.cpu_count()} cores")
    workdir = Path(tempfile.mkdtemp(prefix="heap-bench-"))
    try:
        rows = [run_palestra("glibc default", ROOT, common + ["trainer.system.malloc_mmap_threshold_kb=null"], workdir),
                run_palestra(f"{args.threshold_kb} KB", ROOT,
                             common + [f"trainer.system.malloc_mmap_threshold_kb={args.threshold_kb}"], workdir)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows)
    print(ratios(f"{args.threshold_kb} KB against glibc default", *(summary(row) for row in rows)))
    macros = [row["macro"] for row in rows]
    same = "the same" if macros[0] == macros[1] else "DIFFERENT: the threshold changed a result"
    print(f"held-out macro before/after: {macros[0]} and {macros[1]} ({same})")


if __name__ == "__main__":
    main()
