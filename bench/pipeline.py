"""The same job with trainer.system.pipeline=sync and =async, one after the other in one process:
GRPO steps per hour, the busy share of each side and held-out success after GRPO.

Both runs are the main job's settings (conf/) or a preset's (``--experiment``), shortened by
``--sft-steps`` and ``--steps``, with the same seed, so they start from the same warm start and
differ only in the pipeline; ``--seeds`` repeats the pair for each seed and gives a paired t
interval of the held-out difference. The update side
is busy for ``time/train`` of each step; the rollout side for ``time/generate`` + ``time/verify_wait``
(under async, on the rollout thread, overlapping the update); shares are of the GRPO steps' wall
time (``time/step``, evaluations left out). The last line compares the two.

Each side's mean seconds a step (``generate_s``, ``update_s``, ``rollout_wait_s``) say where the time
goes: under async the two sides share the cores while they overlap, so each runs slower than alone.

    .venv/bin/python bench/pipeline.py [--steps 10] [--sft-steps 100] [--tasks-per-level 4]
    .venv/bin/python bench/pipeline.py --steps 0 --sft-steps 0 --tasks-per-level 16 --seeds 0 1 2 \
        --overrides model=hf model.name_or_path=<run>/sft-model   # the main job from one saved warm start
    .venv/bin/python bench/pipeline.py --experiment smollm2 --steps 4 --tasks-per-level 1   # the real-model preset
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from curriculum.compare import paired_ci
from trainer.app import run, to_config

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
CONF = Path(__file__).resolve().parent.parent / "conf"


def mean(values) -> float:
    values = list(values)
    return round(sum(values) / len(values), 2)


def one_run(pipeline: str, workdir: Path, args: argparse.Namespace, seed: int) -> dict:
    overrides = [f"+experiment={args.experiment}"] if args.experiment else []
    overrides += [f"trainer.system.pipeline={pipeline}", f"eval.tasks_per_level={args.tasks_per_level}",
                  "checkpoint.every=0", f"seed={seed}",
                  f"output_dir={workdir / pipeline}", f"name=bench-{pipeline}"]
    overrides += args.overrides + ([f"trainer.steps={args.steps}"] if args.steps else [])
    if not args.experiment:  # the main job, with a shorter warm start; a preset keeps its own
        overrides.append(f"sft.steps={args.sft_steps}")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        summary = run(to_config(compose("config", overrides=overrides)))
    steps = [json.loads(line) for line in open(workdir / pipeline / "metrics.jsonl")]
    steps = [r for r in steps if r["phase"] == "train"]
    wall = sum(r["time/step"] for r in steps)
    rollout = sum(r["time/generate"] + r["time/verify_wait"] for r in steps)
    return {"pipeline": pipeline, "seed": seed, "steps": len(steps), "grpo_wall_s": round(wall, 1),
            "steps_per_hour": round(3600 * len(steps) / wall, 1),
            "update_busy": round(sum(r["time/train"] for r in steps) / wall, 3),
            "rollout_busy": round(rollout / wall, 3),
            "generate_s": mean(r["time/generate"] for r in steps), "update_s": mean(r["time/train"] for r in steps),
            "rollout_wait_s": mean(r.get("time/rollout_wait", 0.0) for r in steps),
            "heldout_macro_before": summary["before"]["eval/macro"],
            "heldout_macro_after": summary["after"]["eval/macro"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps (0: the job's own)")
    parser.add_argument("--sft-steps", type=int, default=100, help="the main job's warm start (a preset keeps its own)")
    parser.add_argument("--experiment", default=None, help="a preset under conf/experiment, e.g. smollm2")
    parser.add_argument("--tasks-per-level", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="paired: each seed runs sync, then async")
    parser.add_argument("--overrides", nargs="*", default=[], help="more Hydra overrides for both, e.g. a saved model")
    args = parser.parse_args()
    pairs = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            pair = [one_run(mode, Path(tmp), args, seed) for mode in ("sync", "async")]
        for result in pair:
            print(json.dumps(result), flush=True)
        pairs.append(pair)
    per_hour = [3600 * sum(p[i]["steps"] for p in pairs) / sum(p[i]["grpo_wall_s"] for p in pairs) for i in (0, 1)]
    diffs = np.array([later["heldout_macro_after"] - sync["heldout_macro_after"] for sync, later in pairs])
    summary = {"seeds": args.seeds, "async_over_sync_steps_per_hour": round(per_hour[1] / per_hour[0], 3),
               "heldout_difference": [round(float(d), 4) for d in diffs]}
    if len(diffs) > 1:  # a paired t interval over seeds: async - sync on the same seed
        mean_diff, low, high = paired_ci(diffs)
        summary["heldout_difference_mean_ci95"] = [round(mean_diff, 4), round(low, 4), round(high, 4)]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
