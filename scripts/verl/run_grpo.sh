#!/usr/bin/env bash
# GRPO with verl 0.7.1 on Palestra's curriculum (docs/verl.md). NOT RUN HERE: written for one node of
# 8 GPUs with vLLM, and never started (no GPU cluster was available). Only its config was checked on
# the CPU: verl composes it and builds Palestra's dataset and sampler from it.
#
#   bash scripts/verl/run_grpo.sh [verl overrides ...]
#   bash scripts/verl/run_grpo.sh actor_rollout_ref.model.path=/models/my-model trainer.n_gpus_per_node=4
#
# Needs, on every node: Palestra installed with verl (make's .venv has verl 0.7.1; or pip install -e
# '.[verl,ray,test,lora]' and pip install --no-deps verl==0.7.1), vLLM for the rollout, bubblewrap for
# the code domains' sandbox. Palestra's modules are imported by verl's Ray actors (pkg://...), so the
# project must be importable there: an editable install, or PYTHONPATH pointing at this checkout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/outputs/verl/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY="${PY:-$ROOT/.venv/bin/python}"

"$PY" -m verl.trainer.main_ppo \
    --config-path="$ROOT/scripts/verl" --config-name=palestra_grpo \
    data.palestra.store_url="sqlite:///$OUT/palestra.db" \
    trainer.default_local_dir="$OUT/checkpoints" \
    "$@"

echo "store: sqlite:///$OUT/palestra.db"
echo "inspect: $ROOT/.venv/bin/palestra runs --db sqlite:///$OUT/palestra.db"
