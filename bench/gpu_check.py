"""GPU check of the vLLM rollout backend: correctness first, then speed (run by bench/gpu_check.sh).

1. Log-probs: vLLM samples completions; the trainer's own forward pass scores the same tokens.
   The two must agree (mean and max absolute difference per token, printed) — at temperature 1
   vLLM's log-probs are those of the raw distribution, which is what the trainer computes.
2. Weight push: the policy's weights are perturbed and pushed into vLLM; the agreement must hold
   again, which shows the engine samples from the weights it was given.
3. Speed: tokens/s of both backends on the same prompts, and the ratio.

Exit status 1 when an agreement check fails. Nothing is downloaded: the built-in tiny model is
built locally unless --model names a local folder.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from trainer.models import encode_prompt, load_model, load_tokenizer
from trainer.rollout import generate, sequence_logprobs
from trainer.tiny_model import build_tiny_model
from trainer.vllm_engine import VLLMEngine


def prompts_for(tokenizer, n: int) -> list[list[int]]:
    texts = [f"{a}+{b}=" for a in range(10) for b in range(10)][:n]
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def agreement(policy, engine: VLLMEngine, prompts, tokenizer, max_new_tokens: int) -> tuple[float, float]:
    rollout, vllm_logps = engine(None, prompts, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
                                 pad_id=tokenizer.pad_token_id, temperature=1.0, logprobs=True)
    device = next(policy.parameters()).device
    with torch.no_grad():
        ours, _ = sequence_logprobs(policy, rollout.sequences.to(device), rollout.attention_mask.to(device),
                                    rollout.prompt_width)
    diffs = [abs(float(ours[b, j]) - lp) for b, row in enumerate(vllm_logps) for j, lp in enumerate(row)]
    return sum(diffs) / max(1, len(diffs)), max(diffs, default=0.0)


def tokens_per_s(sample, prompts, tokenizer, max_new_tokens: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    rollout = sample(prompts)
    torch.cuda.synchronize()
    return int(rollout.completion_mask.sum()) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="local model folder (default: build the tiny model)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=2e-2, help="largest allowed mean |Δ log-prob|")
    args = parser.parse_args()
    path = args.model or str(build_tiny_model(tempfile.mkdtemp(prefix="palestra-gpu-check-")))
    tokenizer = load_tokenizer(path, tiny=args.model is None)
    policy = load_model(path, torch.device("cuda")).eval()
    engine = VLLMEngine(path, dtype="float32", seed=0)
    prompts = prompts_for(tokenizer, args.prompts)

    ok = True
    mean, worst = agreement(policy, engine, prompts, tokenizer, args.max_new_tokens)
    print(f"log-prob agreement (fresh weights): mean |Δ| {mean:.2e}, max |Δ| {worst:.2e}")
    ok &= mean <= args.tolerance
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    engine.push_weights(policy)
    mean, worst = agreement(policy, engine, prompts, tokenizer, args.max_new_tokens)
    print(f"log-prob agreement (after a weight push): mean |Δ| {mean:.2e}, max |Δ| {worst:.2e}")
    ok &= mean <= args.tolerance

    kw = dict(max_new_tokens=args.max_new_tokens, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
              temperature=1.0)
    big = prompts * max(1, 512 // len(prompts))
    hf = tokens_per_s(lambda p: generate(policy, p, **kw), big, tokenizer, args.max_new_tokens)
    vl = tokens_per_s(lambda p: engine(None, p, **kw), big, tokenizer, args.max_new_tokens)
    print(f"tokens/s on {len(big)} prompts: trainer sampler {hf:,.0f}, vLLM {vl:,.0f}, ratio vLLM/trainer {vl / hf:.2f}")
    print("gpu check: " + ("PASS" if ok else f"FAIL (mean |Δ log-prob| above {args.tolerance})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
