"""The real-model job side by side: the SmolLM2 preset's own steps, today's path against this one.

Each row is a process of its own running ``palestra-train +experiment=smollm2`` for ``--steps``
GRPO steps — all eight domains, tool episodes, dynamic sampling with its refills, held-out
evaluation before and after (``--eval-tasks`` per level) — and the bench reads its steps'
metrics and its peak resident memory:

- ``base``: the code of commit ``--base`` (a git worktree of it; default: the commit before the
  speed work), run with this checkout's virtual environment;
- ``new``: this checkout, the preset in fp32 (``model.dtype=float32``: as it ships on a CPU without bf16);
- ``new, bf16``: the same with ``model.dtype=bfloat16`` — only where the CPU has AVX512-BF16 or AMX,
  where the preset ships it (``model.dtype=auto``);
- ``single-turn``: this checkout on the batch TRL can take (the five single-turn domains, no
  refills, no evaluation to speak of), beside ``trl``: TRL's ``GRPOTrainer`` on the same model,
  batch, token budget, learning rate and threads (``[bench]`` extra).

Per row: generated tokens per second; median seconds per step split into generation, waiting for
the verifiers, the update and the store; seconds of the two evaluations; wall time; peak RSS.
Then the ratios base / new. Both rows of a pair run on the same machine minutes apart: compare
them with each other, not with another day's.

    .venv/bin/python bench/real_model.py [--steps 2 --eval-tasks 1 --base 0ae633c] [--skip base,trl]
                                         [--overrides "model.device=cuda ..."]
                                         [--new-overrides "trainer.sampling.oversample=2 ..."]

``--new-overrides`` go to this checkout's rows only: a setting the base commit does not know,
measured against it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.runtime import cpu_bf16  # noqa: E402

SINGLE_TURN = ["arithmetic", "linear_equations", "fractions", "code_functions", "code_lists"]
PHASES = ("time/generate", "time/verify_wait", "time/train", "time/record")


def run_palestra(name: str, code: Path, overrides: list[str], workdir: Path) -> dict:
    """One training process at ``code``; its step metrics, evaluation times, wall time and peak RSS."""
    out = workdir / name.replace(" ", "_").replace(",", "")
    command = [sys.executable, "-c", "from trainer.app import main; main()", "+experiment=smollm2",
               f"hydra.run.dir={out}", f"store.url=sqlite:///{out}/palestra.db", "checkpoint.every=0", *overrides]
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{name} failed:\n{log[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["phase"] == "train"]
    evals = [r.get("time/eval", float("nan")) for r in records if r["phase"] == "eval"]
    last = json.loads(log.strip().splitlines()[-1])
    return {"name": name, "steps": steps, "evals": evals, "wall": wall, "rss_gb": usage.ru_maxrss / 2**20,
            "macro": (last.get("macro_before"), last.get("macro_after"))}


def run_trl(steps: int, workdir: Path) -> dict:
    """TRL's GRPOTrainer on the single-turn batch, in a process of its own (the code below, as a script)."""
    script = workdir / "trl_run.py"
    script.write_text(TRL_SCRIPT)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(script), str(steps), str(workdir / "trl")], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    log = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise SystemExit(f"trl failed:\n{log[-3000:]}")
    times = json.loads(log.strip().splitlines()[-1])
    return {"name": "trl", "trl_steps": times, "wall": time.perf_counter() - start,
            "rss_gb": usage.ru_maxrss / 2**20}


# TRL on what Palestra's single-turn row trains: 8 prompts x 4 completions of at most 128 tokens at
# T = 0.7, lr 2e-5, beta 0, one pass, chat prompts of the five single-turn domains scored by their
# own verifiers (the code domains' in the sandbox), both CPU threads.
TRL_SCRIPT = r'''
import json, random, sys, time, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from domains.registry import load_all
from trainer.models.loading import load_tokenizer
from trainer.models.pretrained import converted_smollm2

steps, out = int(sys.argv[1]), sys.argv[2]
names = ["arithmetic", "linear_equations", "fractions", "code_functions", "code_lists"]
domains = load_all(names, {}, shared={"prompt_style": "chat"})
rng = random.Random(0)
tasks = [t for name in names for t in domains[name].sample(1, 64, rng)]
rng.shuffle(tasks)
by_id = {t.id: t for t in tasks}
data = Dataset.from_list([{"prompt": t.prompt, "task_id": t.id} for t in tasks])

def reward(completions, task_id, **_):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [domains[by_id[i].domain].verify(by_id[i], text).reward for text, i in zip(texts, task_id)]

class Timer(TrainerCallback):
    times = []
    def on_step_begin(self, args, state, control, **kw):
        self.start = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.start)

folder = str(converted_smollm2(None))
torch.set_num_threads(2)
args = GRPOConfig(output_dir=out, per_device_train_batch_size=32, num_generations=4, max_completion_length=128,
                  temperature=0.7, beta=0.0, num_iterations=1, learning_rate=2e-5, use_cpu=True, report_to="none",
                  logging_steps=10_000, save_strategy="no", bf16=False, max_steps=steps, dataloader_num_workers=0,
                  disable_tqdm=True)
timer = Timer()
trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(folder), reward_funcs=reward, args=args,
                      train_dataset=data, processing_class=load_tokenizer(folder, tiny=False), callbacks=[timer])
trainer.train()
print(json.dumps(timer.times))
'''


def base_worktree(rev: str, workdir: Path) -> Path:
    path = workdir / "base-code"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    return path


def summary(row: dict) -> dict:
    if "trl_steps" in row:
        return {"s_per_step": statistics.median(row["trl_steps"]), "wall": row["wall"], "rss_gb": row["rss_gb"]}
    steps = row["steps"]
    generated = sum(s["tokens_per_s"] * s["time/generate"] for s in steps)
    phases = {key: statistics.median(s[key] for s in steps) for key in PHASES}
    return {"tokens_per_s": generated / sum(s["time/generate"] for s in steps),
            "s_per_step": statistics.median(sum(s[k] for k in PHASES) for s in steps), **phases,
            "eval_s": sum(row["evals"]), "wall": row["wall"], "rss_gb": row["rss_gb"]}


def print_table(rows: list[dict]) -> None:
    print(f"{'':<14}{'tok/s':>7}{'s/step':>8}{'generate':>9}{'verify':>8}{'update':>8}{'record':>8}"
          f"{'eval s':>8}{'wall s':>8}{'RSS GB':>8}")
    for row in rows:
        s = summary(row)
        cells = [s.get("tokens_per_s"), s["s_per_step"], *(s.get(k) for k in PHASES), s.get("eval_s"), s["wall"],
                 s["rss_gb"]]
        print(f"{row['name']:<14}" + "".join(f"{c:>8.1f} " if c is not None else f"{'-':>8} " for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--eval-tasks", type=int, default=1)
    parser.add_argument("--base", default="0ae633c")
    parser.add_argument("--skip", default="", help="rows to leave out: base, bf16, trl")
    parser.add_argument("--overrides", default="", help="more palestra-train overrides for every row, e.g. the "
                        "GPU check's 358M shape (bench/gpu_check.sh realjob)")
    parser.add_argument("--new-overrides", default="", help="overrides for this checkout's rows only")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    common = [f"trainer.steps={args.steps}", f"eval.tasks_per_level={args.eval_tasks}", *args.overrides.split()]
    print(f"CPU: {cpu_bf16() or 'no bf16 instructions'}; {os.cpu_count()} cores")
    workdir = Path(tempfile.mkdtemp(prefix="real-bench-"))
    rows = []
    try:
        if "base" not in skip:
            rows.append(run_palestra("base", base_worktree(args.base, workdir), common, workdir))
        new = common + args.new_overrides.split()
        fp32 = new + ["model.dtype=float32"]  # like the base commit and TRL's row (bf16=False)
        rows.append(run_palestra("new", ROOT, fp32, workdir))
        if "bf16" not in skip and cpu_bf16():
            rows.append(run_palestra("new, bf16", ROOT, new + ["model.dtype=bfloat16"], workdir))
        if "trl" not in skip:
            single = [f"domains=[{','.join(SINGLE_TURN)}]", "trainer.sampling.dynamic_sampling=false"]
            rows.append(run_palestra("single-turn", ROOT, fp32 + single, workdir))
            rows.append(run_trl(args.steps, workdir))
    finally:
        if (workdir / "base-code").exists():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(workdir / "base-code")])
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows)
    by_name = {row["name"]: summary(row) for row in rows}
    for title, before, after in (("new against base", "base", "new"), ("bf16 against fp32", "new", "new, bf16")):
        if before in by_name and after in by_name:
            print(ratios(title, by_name[before], by_name[after]))
    if "trl" in by_name:
        print(f"single-turn step: palestra / trl = {by_name['single-turn']['s_per_step'] / by_name['trl']['s_per_step']:.2f} "
              "(below 1: Palestra faster)")


def ratios(title: str, before: dict, after: dict) -> str:
    """One line of speed-ups (above 1: ``after`` faster) and both peak RSS figures."""
    return (f"{title}: {after['tokens_per_s'] / before['tokens_per_s']:.2f}x tokens/s, "
            f"{before['time/train'] / after['time/train']:.2f}x update speed, "
            f"{before['s_per_step'] / after['s_per_step']:.2f}x step speed, {before['wall'] / after['wall']:.2f}x wall, "
            f"peak RSS {after['rss_gb']:.1f} against {before['rss_gb']:.1f} GB")


if __name__ == "__main__":
    main()
