#!/usr/bin/env bash
# GPU check, meant to finish in under nine minutes on one GPU: the trainer on CUDA (log-probs and
# gradients against the CPU, speed at a 0.5B shape), then the vLLM rollout backend when vLLM is
# installed (log-prob agreement with fresh and pushed weights, tokens/s of both samplers); then the
# memory benchmark at the same 358M shape (bench/memory.py: allocated memory and time of one update
# for full fine-tuning, the reference on the CPU, LoRA, LoRA + checkpointing; FSDP needs 2 GPUs).
# Usage: bench/gpu_check.sh [--model LOCAL_FOLDER] [--prompts N] [--max-new-tokens N]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu check: no CUDA device visible to $PY" >&2
    exit 2
fi
timeout 290 "$PY" bench/gpu_check.py "$@"
exec timeout 240 "$PY" bench/memory.py --model 358m --device cuda --rows 64 --prompt 64 --completion 256 --micro 16
