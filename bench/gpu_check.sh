#!/usr/bin/env bash
# GPU check of the vLLM rollout backend, meant to finish in under five minutes on one GPU:
# log-prob agreement between vLLM and the trainer (fresh and pushed weights), then tokens/s of both.
# Usage: bench/gpu_check.sh [--model LOCAL_FOLDER] [--prompts N] [--max-new-tokens N]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu check: no CUDA device visible to $PY" >&2
    exit 2
fi
if ! "$PY" -c "import vllm" 2>/dev/null; then
    echo "gpu check: vLLM is not installed for $PY (pip install vllm)" >&2
    exit 2
fi
exec timeout 290 "$PY" bench/gpu_check.py "$@"
