"""The main job's sampling seconds a GRPO step on CUDA, with the eager and the captured sampler.

Two short runs of the main job (its SFT warm start shortened, a few GRPO steps, the built-in tiny
model, the default SQLite store in a temporary folder) differ only in
``trainer.sampling.rollout_backend``; the mean ``time/generate`` of their GRPO steps after the first
(which records the captured steps) is printed for each, with the ratio. Run by bench/gpu_check.sh.

    .venv/bin/python bench/gpu_main_job.py [--steps 6] [--sft-steps 300]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def sampling_seconds(backend: str, steps: int, sft_steps: int) -> tuple[float, float]:
    """Mean and first-step time/generate of one short run."""
    run = Path(tempfile.mkdtemp(prefix=f"palestra-gpu-{backend}-"))
    subprocess.run([sys.executable, "-m", "trainer.app", "model.device=cuda", f"sft.steps={sft_steps}",
                    f"trainer.steps={steps}", f"trainer.sampling.rollout_backend={backend}", "eval.tasks_per_level=1",
                    f"hydra.run.dir={run}"], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    times = [r["time/generate"] for r in rows if r.get("phase") == "train" and "time/generate" in r]
    return sum(times[1:]) / max(1, len(times) - 1), times[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sft-steps", type=int, default=300)
    args = parser.parse_args()
    seconds = {}
    for backend in ("hf", "captured"):
        seconds[backend], first = sampling_seconds(backend, args.steps, args.sft_steps)
        print(f"main job on CUDA, rollout_backend={backend}: {seconds[backend]:.2f} s of sampling a GRPO step "
              f"(first step {first:.2f} s)")
    print(f"captured / eager sampling time a step: {seconds['captured'] / seconds['hf']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
