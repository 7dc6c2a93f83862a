"""GPU check of the trainer on CUDA and of the vLLM rollout backend (run by bench/gpu_check.sh).

Trainer on CUDA (always):
1. Log-probs: the same sampled tokens are scored on the CPU in fp32 and on the GPU, in fp32 and
   under the bf16 autocast the recipe uses there; mean and max |Δ| per token.
2. Gradients: one GRPO loss, backward on each device from the same weights; the relative
   difference and the cosine of the two gradients.
3. Speed at a 0.5B-parameter shape (random weights, the tiny tokenizer): tokens/s of the trainer's
   sampler and of a training forward+backward under bf16 autocast, and the peak GPU memory.

vLLM (``--vllm auto``, the default: when it can be imported, and the last line says when it was
not; ``require``: a missing vLLM fails the check; ``off``: not checked):
4. vLLM samples completions and the trainer scores the same tokens; the log-probs must agree, with
   fresh weights and again after perturbed weights are pushed into the engine.
5. tokens/s of both samplers on the same prompts, and the ratio.

Exit status 1 when a check fails. Nothing is downloaded: models are built locally unless --model
names a local folder.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainer.models.loading import encode_prompt, load_model, load_tokenizer
from trainer.models.tiny_model import build_tiny_model
from trainer.sampling.rollout import Rollout, generate
from trainer.update.logprobs import sequence_logprobs
from trainer.update.losses import grpo_loss

CUDA = torch.device("cuda")
# Qwen2.5-0.5B's shape without its vocabulary (the tiny tokenizer's is small): ~360M parameters.
SMALL_SHAPE = dict(hidden_size=896, layers=24, heads=14, kv_heads=2, intermediate_size=4864, max_positions=1024)


def prompts_for(tokenizer, n: int) -> list[list[int]]:
    texts = [f"{a}+{b}=" for a in range(10) for b in range(10)][:n]
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def sample_kwargs(tokenizer, max_new_tokens: int) -> dict:
    return dict(max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                temperature=1.0)


def score(model, rollout: Rollout, bf16: bool = False) -> torch.Tensor:
    """The trainer's log-probs of the rollout's completion tokens (on the model's device)."""
    device = next(model.parameters()).device
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = sequence_logprobs(model, rollout.sequences.to(device), rollout.attention_mask.to(device),
                                    rollout.prompt_width)
    return logp.float()


def differences(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    diff = (a.cpu() - b.cpu()).abs()[mask.bool()]
    return float(diff.mean()), float(diff.max())


def gradient(model, rollout: Rollout, advantages: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    """Flattened gradient of one GRPO loss on the rollout (ratio 1: the first step of an update)."""
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    logp = score(model, rollout, bf16)
    mask = rollout.completion_mask.to(device)
    out = grpo_loss(logp, logp.detach(), advantages.to(device), mask, aggregation="token_mean",
                    max_tokens=int(mask.sum()))
    out.loss.backward()
    return torch.cat([p.grad.flatten().cpu() for p in model.parameters() if p.grad is not None])


def check_trainer(path: str, tokenizer, prompts, max_new_tokens: int) -> bool:
    cpu_model = load_model(path, torch.device("cpu")).eval()
    gpu_model = load_model(path, CUDA).eval()  # as the trainer loads it (attention kernels included)
    rollout = generate(gpu_model, prompts, **sample_kwargs(tokenizer, max_new_tokens),
                       generator=torch.Generator(CUDA).manual_seed(0))
    rollout = Rollout(**{k: (v.cpu() if torch.is_tensor(v) else v) for k, v in vars(rollout).items()})
    mask = rollout.completion_mask
    with torch.no_grad():
        on_cpu = score(cpu_model, rollout)
        fp32 = differences(on_cpu, score(gpu_model, rollout), mask)
        bf16 = differences(on_cpu, score(gpu_model, rollout, bf16=True), mask)
    print(f"log-probs, GPU fp32 vs CPU: mean |Δ| {fp32[0]:.1e}, max {fp32[1]:.1e} "
          f"({int(mask.sum())} tokens of {len(prompts)} completions)")
    print(f"log-probs, GPU bf16 autocast vs CPU fp32: mean |Δ| {bf16[0]:.1e}, max {bf16[1]:.1e}")

    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(1))
    g_cpu = gradient(cpu_model, rollout, advantages).double()
    ok = fp32[0] <= 1e-4 and bf16[0] <= 5e-2
    for name, bf in (("fp32", False), ("bf16 autocast", True)):
        g_gpu = gradient(gpu_model, rollout, advantages, bf16=bf).double()
        rel = float((g_gpu - g_cpu).norm() / g_cpu.norm())
        cos = float(torch.nn.functional.cosine_similarity(g_gpu, g_cpu, dim=0))
        print(f"GRPO gradient, GPU {name} vs CPU: relative difference {rel:.1e}, cosine {cos:.6f}")
        ok &= rel <= (1e-3 if not bf else 5e-2)
    return ok


def timed(fn) -> tuple[object, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def trainer_speed(max_new_tokens: int, batch: int) -> None:
    path = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="palestra-gpu-small-")) / "model", **SMALL_SHAPE))
    model, tokenizer = load_model(path, CUDA), load_tokenizer(path, tiny=True)
    n_params = sum(p.numel() for p in model.parameters())
    many = (prompts_for(tokenizer, 100) * (batch // 100 + 1))[:batch]
    kw = sample_kwargs(tokenizer, max_new_tokens)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        generate(model, many[:8], **{**kw, "max_new_tokens": 4})  # warm-up: kernels, allocator
        rollout, seconds = timed(lambda: generate(model, many, **kw))
    tokens = int(rollout.completion_mask.sum())
    print(f"{n_params / 1e6:.0f}M-parameter model: trainer sampler {tokens / seconds:,.0f} tokens/s "
          f"({len(many)} prompts × ≤{max_new_tokens} tokens, bf16 autocast)")

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    torch.cuda.reset_peak_memory_stats()

    def train_step() -> None:
        logp = score(model, rollout, bf16=True)
        mask = rollout.completion_mask.to(CUDA)
        grpo_loss(logp, logp.detach(), torch.ones(len(many), device=CUDA), mask).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train_step()  # warm-up; AdamW allocates its state here
    _, seconds = timed(train_step)
    trained = int(rollout.attention_mask.sum())
    print(f"{n_params / 1e6:.0f}M-parameter model: training forward+backward+AdamW {trained / seconds:,.0f} tokens/s "
          f"({len(many)} sequences, bf16 autocast), peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


def vllm_agreement(policy, engine, prompts, tokenizer, max_new_tokens: int) -> tuple[float, float]:
    rollout, vllm_logps = engine(None, prompts, **sample_kwargs(tokenizer, max_new_tokens), logprobs=True)
    with torch.no_grad():
        ours = score(policy, rollout)
    diffs = [abs(float(ours[b, j]) - lp) for b, row in enumerate(vllm_logps) for j, lp in enumerate(row)]
    return sum(diffs) / max(1, len(diffs)), max(diffs, default=0.0)


def check_vllm(path: str, tokenizer, prompts, max_new_tokens: int, tolerance: float) -> bool:
    from trainer.sampling.vllm_engine import VLLMEngine

    policy = load_model(path, CUDA).eval()
    engine = VLLMEngine(path, dtype="float32", seed=0)
    ok = True
    for when in ("fresh weights", "after a weight push"):
        if when != "fresh weights":
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(0.02 * torch.randn_like(p))
            engine.push_weights(policy)
        mean, worst = vllm_agreement(policy, engine, prompts, tokenizer, max_new_tokens)
        print(f"vLLM vs trainer log-probs ({when}): mean |Δ| {mean:.2e}, max |Δ| {worst:.2e}")
        ok &= mean <= tolerance
    big = prompts * max(1, 512 // len(prompts))
    kw = sample_kwargs(tokenizer, max_new_tokens)
    hf_rollout, hf_s = timed(lambda: generate(policy, big, **kw))
    vl_rollout, vl_s = timed(lambda: engine(None, big, **kw))
    hf = int(hf_rollout.completion_mask.sum()) / hf_s
    vl = int(vl_rollout.completion_mask.sum()) / vl_s
    print(f"tokens/s on {len(big)} prompts: trainer sampler {hf:,.0f}, vLLM {vl:,.0f}, ratio vLLM/trainer {vl / hf:.2f}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="local model folder (default: build the tiny model)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--speed-batch", type=int, default=256, help="prompts per batch in the speed part")
    parser.add_argument("--tolerance", type=float, default=2e-2, help="largest allowed mean |Δ log-prob| for vLLM")
    parser.add_argument("--vllm", choices=("auto", "require", "off"), default="auto",
                        help="check the vLLM backend when installed (auto), fail without it (require), or skip it")
    args = parser.parse_args()
    path = args.model or str(build_tiny_model(tempfile.mkdtemp(prefix="palestra-gpu-check-")))
    tokenizer = load_tokenizer(path, tiny=args.model is None)
    prompts = prompts_for(tokenizer, args.prompts)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")

    ok = check_trainer(path, tokenizer, prompts, args.max_new_tokens)
    trainer_speed(128, args.speed_batch)
    installed = importlib.util.find_spec("vllm") is not None
    if args.vllm == "off" or not installed:
        # a result that left vLLM out says so on its own line, so no one reads it as vLLM's pass
        unchecked = f" (vLLM not checked: {'--vllm off' if args.vllm == 'off' else 'not installed'})"
        ok &= args.vllm != "require"
    else:
        unchecked = ""
        ok &= check_vllm(path, tokenizer, prompts, args.max_new_tokens, args.tolerance)
    print("gpu check: " + ("PASS" if ok else "FAIL") + unchecked)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
