"""The same tiny job with trainer.system.pipeline=sync and =async, one after the other in one
process: GRPO steps per hour, the busy share of each side and held-out success after GRPO.

Both runs are the main job's settings (conf/), shortened by ``--sft-steps`` and ``--steps``, with the
same seed, so they start from the same warm start and differ only in the pipeline. The update side
is busy for ``time/train`` of each step; the rollout side for ``time/generate`` + ``time/verify_wait``
(under async, on the rollout thread, overlapping the update); shares are of the GRPO steps' wall
time (``time/step``, evaluations left out). The last line compares the two.

    .venv/bin/python bench/pipeline.py [--steps 10] [--sft-steps 100] [--tasks-per-level 4]
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import warnings
from pathlib import Path

from hydra import compose, initialize_config_dir

from trainer.app import run, to_config

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
CONF = Path(__file__).resolve().parent.parent / "conf"


def one_run(pipeline: str, workdir: Path, args: argparse.Namespace) -> dict:
    overrides = [f"trainer.system.pipeline={pipeline}", f"trainer.steps={args.steps}", f"sft.steps={args.sft_steps}",
                 f"eval.tasks_per_level={args.tasks_per_level}", "checkpoint.every=0", f"seed={args.seed}",
                 f"output_dir={workdir / pipeline}", f"name=bench-{pipeline}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        summary = run(to_config(compose("config", overrides=overrides)))
    steps = [json.loads(line) for line in open(workdir / pipeline / "metrics.jsonl")]
    steps = [r for r in steps if r["phase"] == "train"]
    wall = sum(r["time/step"] for r in steps)
    rollout = sum(r["time/generate"] + r["time/verify_wait"] for r in steps)
    return {"pipeline": pipeline, "steps": len(steps), "grpo_wall_s": round(wall, 1),
            "steps_per_hour": round(3600 * len(steps) / wall, 1),
            "update_busy": round(sum(r["time/train"] for r in steps) / wall, 3),
            "rollout_busy": round(rollout / wall, 3),
            "heldout_macro_after": summary["after"]["eval/macro"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sft-steps", type=int, default=100)
    parser.add_argument("--tasks-per-level", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [one_run(mode, Path(tmp), args) for mode in ("sync", "async")]
    for result in results:
        print(json.dumps(result))
    sync, later = results
    print(json.dumps({"async_over_sync_steps_per_hour": round(later["steps_per_hour"] / sync["steps_per_hour"], 3),
                      "heldout_difference": round(later["heldout_macro_after"] - sync["heldout_macro_after"], 4)}))


if __name__ == "__main__":
    main()
