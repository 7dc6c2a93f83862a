#!/usr/bin/env bash
# GPU check, meant to finish in under five minutes on one GPU: the trainer on CUDA (log-probs and
# gradients against the CPU, speed at a 0.5B shape), then the vLLM rollout backend when vLLM is
# installed (log-prob agreement with fresh and pushed weights, tokens/s of both samplers).
# Usage: bench/gpu_check.sh [--model LOCAL_FOLDER] [--prompts N] [--max-new-tokens N]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu check: no CUDA device visible to $PY" >&2
    exit 2
fi
exec timeout 290 "$PY" bench/gpu_check.py "$@"
