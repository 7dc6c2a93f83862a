"""Peak memory and time of one GRPO update, side by side, for each way of fitting a model.

    .venv/bin/python bench/memory.py                    # SmolLM2-135M (model=smollm2)
    .venv/bin/python bench/memory.py --model tiny       # the tiny model: a quick check
    .venv/bin/python bench/memory.py --model 358m       # Qwen2.5-0.5B's layers, random weights (GPU)

Each setup runs in a fresh process (FSDP: two ranks under torchrun, gloo or NCCL): the policy, its
optimizer and (beta > 0) its KL reference are built, one update warms up (AdamW allocates its
moments), then the peak is reset and a second update is measured: a GRPO update of ``--rows``
sequences of ``--prompt`` + ``--completion`` tokens in micro-batches of ``--micro``, beta 0.1.
The peak is the resident set's high-water mark on the CPU (/proc's VmHWM, reset between the two
updates) and allocated memory on a GPU. Each process runs one torch thread (``--threads``), so
the times of a busy shared machine are not those of threads spin-waiting on each other; FSDP's
two ranks are then two threads. Rows are measured in one run, so compare them with each
other: absolute figures depend on the machine and its load.

| setup (``--only``) | what it is |
|---|---|
| full | full fine-tuning, the reference a second copy on the device (the default) |
| cpu-reference | the same, the reference kept and run on the CPU (model.reference_placement=cpu) |
| lora | adapters only (model.lora.enabled); the reference is the policy with its adapters off |
| lora-checkpointing | and model.gradient_checkpointing |
| fsdp | full fine-tuning sharded over two ranks (trainer.system.sharding=fsdp); the larger rank's peak |
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_check import SMALL_SHAPE  # noqa: E402  (the 358M shape: Qwen2.5-0.5B's layers)

SETUPS = {  # key -> (what the table calls it, model settings, ranks)
    "full": ("full", {}, 1),
    "cpu-reference": ("full, reference on CPU", {"reference_placement": "cpu"}, 1),
    "lora": ("LoRA", {"lora": {"enabled": True}}, 1),
    "lora-checkpointing": ("LoRA + checkpointing", {"lora": {"enabled": True}, "gradient_checkpointing": True}, 1),
    "fsdp": ("FSDP, 2 ranks", {}, 2),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["smollm2", "tiny", "358m"], default="smollm2")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads a process (1: no spin-waiting threads on a busy machine)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", help=f"comma-separated setups of {', '.join(SETUPS)} (default: all that fit)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: measure one setup in this process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args, args.measure)))
        return
    chosen = args.only.split(",") if args.only else list(SETUPS)
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        chosen = [name for name in chosen if SETUPS[name][2] == 1]  # one GPU: single-rank figures
    unit = "allocated" if args.device == "cuda" else "peak RSS"
    print(f"model {args.model} on {args.device}: one update of {args.rows} rows x {args.prompt}+{args.completion} "
          f"tokens, micro-batches of {args.micro}, beta 0.1")
    first = SETUPS[chosen[0]][0]
    print(f"| setup | {unit} (GiB) | vs {first} | update (s) | vs {first} |\n|---|---|---|---|---|")
    model_folder(args.model)  # built (or converted) once, before any rank reads it
    base = None
    for name in chosen:
        result = launch(args, name)
        base = base or result
        print(f"| {SETUPS[name][0]} | {result['peak_gib']:.2f} | {result['peak_gib'] / base['peak_gib']:.2f} | "
              f"{result['seconds']:.2f} | {result['seconds'] / base['seconds']:.2f} |", flush=True)


def launch(args: argparse.Namespace, name: str) -> dict:
    """One setup measured in fresh processes; with several ranks, the largest rank's peak."""
    ranks = SETUPS[name][2]
    keys = ("model", "rows", "prompt", "completion", "micro", "threads", "device")
    argv = [f"--{key}={getattr(args, key)}" for key in keys]
    argv += ["--measure", name]
    script = [str(Path(__file__).resolve()), *argv]
    command = ([sys.executable, *script] if ranks == 1 else
               [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), *script])
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TQDM_DISABLE": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{name}: failed\n{out.stderr[-3000:]}")
    results = [json.loads(line) for line in lines]
    return max(results, key=lambda r: r["peak_gib"])


def measure(args: argparse.Namespace, name: str) -> dict:
    from trainer.config import LoraConfig, TrainerConfig
    from trainer.models.adapters import attach_lora
    from trainer.models.loading import checkpoint_activations, load_model
    from trainer.models.sharding import shard
    from trainer import distributed
    from trainer.runtime import arithmetic, autocast
    from trainer.update.reference import make_reference
    from trainer.update.step import PolicyUpdate

    _, settings, ranks = SETUPS[name]
    world = distributed.init()
    torch.set_num_threads(args.threads)
    device = world.place(torch.device(args.device))
    path = model_folder(args.model)
    model = load_model(path, device)
    if settings.get("gradient_checkpointing"):
        checkpoint_activations(model)
    if "lora" in settings:
        model = attach_lora(model, LoraConfig(**settings["lora"]))
    if ranks > 1:
        shard(model, world, device, bf16=False)
    reference = make_reference(model, path, settings.get("reference_placement", "device"), device, world)
    trainer = TrainerConfig.model_validate({
        "optim": {"mu": 1, "micro_batch_size": args.micro, "lr": 1e-6},
        "loss": {"beta": 0.1, "sft_coef": 0.0, "skip_zero_advantage": False},
        "sampling": {"max_new_tokens": args.completion}})
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    dtype = arithmetic(device, "auto", sum(p.numel() for p in model.parameters()))  # as the trainer chooses
    update = PolicyUpdate(model, optimizer, schedule, trainer, reference=reference, world=world,
                          autocast=lambda: autocast(device, dtype))
    rollout, advantages = synthetic_rows(args, model.config.vocab_size)
    model.train()
    update(rollout, advantages)  # warm-up: AdamW's moments are allocated here
    reset_peak(device)
    start = time.perf_counter()
    update(rollout, advantages)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {"setup": name, "rank": world.rank, "peak_gib": peak_gib(device), "seconds": seconds}
    distributed.shutdown()
    return result


def model_folder(name: str) -> str:
    from trainer.models.pretrained import converted_smollm2
    from trainer.models.tiny_model import build_tiny_model

    if name == "smollm2":
        return str(converted_smollm2(None))
    cache = ROOT / ".bench-models" / name  # built once, by the first process (the same on every rank)
    shape = {"max_positions": 1024} if name == "tiny" else SMALL_SHAPE  # SMALL_SHAPE's is 1024 too
    return str(build_tiny_model(cache, **shape, seed=0))


def synthetic_rows(args: argparse.Namespace, vocab: int):
    """``--rows`` random sequences (completions of full length) with advantages of both signs."""
    from trainer.sampling.rollout import Rollout

    g = torch.Generator().manual_seed(0)
    width = args.prompt + args.completion
    sequences = torch.randint(0, vocab, (args.rows, width), generator=g)
    rollout = Rollout(sequences, torch.ones_like(sequences), torch.ones(args.rows, args.completion, dtype=torch.long),
                      args.prompt, torch.zeros(args.rows, dtype=torch.bool), [[] for _ in range(args.rows)])
    return rollout, torch.randn(args.rows, generator=g)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set


def peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    status = Path("/proc/self/status").read_text()
    kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return kb / 2**20


if __name__ == "__main__":
    main()
