#!/usr/bin/env bash
# GPU check in parts; with no part named, the first four in turn (about 14 minutes: name fewer when
# the device time left is short; realjob takes about 5 minutes more):
#   trainer  bench/gpu_check.py: log-probs and gradients against the CPU, speed at a 0.5B shape, and
#            the vLLM rollout backend when vLLM is installed (its last line says when it was not;
#            --vllm require makes a missing vLLM a failure)
#   memory   bench/memory.py at the same 358M shape: allocated memory and time of one update for full
#            fine-tuning, the reference on the CPU, LoRA, LoRA + checkpointing (FSDP needs 2 GPUs)
#   sampler  bench/sampler.py --device cuda: the eager and the captured sampler (tokens/s, recording
#            cost, identical fp32 greedy tokens, bf16 rows, weight changes, GPU busy share)
#   mainjob  bench/gpu_main_job.py: the main job's sampling seconds a GRPO step, eager vs captured
#   realjob  bench/real_model.py: the real-model preset's steps (eight domains, tool episodes, refills)
#            at the 358M shape with random weights (SmolLM2's weights do not travel), the phases of a
#            step, evaluation time and peak memory (no base row: the git history does not travel)
#   pipeline bench/pipeline.py: the real-model preset's steps at the 358M shape (random weights, as
#            realjob), sync and then async (trainer.system.pipeline) with sampler and trainer on the
#            one device: steps per hour, each side's busy share and seconds a step
#   trl      examples/trl_grpo.py on CUDA: TRL's GRPOTrainer driven by the curriculum, 4 steps of the
#            tiny model, then the store's per-domain table (needs trl and datasets: gpu_wheels.sh --trl)
#   verl     scripts/verl/run_grpo.sh on this one GPU: 3 steps of verl 0.7.1's GRPO on a fresh tiny model,
#            then the store's per-domain table. verl 0.7.1 rolls out only through vLLM, SGLang or
#            TensorRT-LLM, so without vLLM the part says so in one line and fails (never run yet)
# The machine's image lacks some of Palestra's packages: bench/gpu_wheels.sh prepares them (docs/gpu.md).
# Usage: bench/gpu_check.sh [trainer] [memory] [sampler] [mainjob] [realjob] [pipeline] [trl] [verl] [gpu_check.py options...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu check: no CUDA device visible to $PY" >&2
    exit 2
fi
# the per-domain table of the one run in $1/palestra.db
store_table() {
    "$PY" -m curriculum.cli stats --db "sqlite:///$1/palestra.db" \
        --run "$("$PY" -m curriculum.cli runs --db "sqlite:///$1/palestra.db" | awk 'NR==2{print $1}')"
}
parts=() options=()
for arg in "$@"; do
    case $arg in trainer|memory|sampler|mainjob|realjob|pipeline|trl|verl) parts+=("$arg") ;; *) options+=("$arg") ;; esac
done
[ ${#parts[@]} -gt 0 ] || parts=(trainer memory sampler mainjob)
status=0
for part in "${parts[@]}"; do
    echo "== $part"
    case $part in
        trainer) timeout 290 "$PY" bench/gpu_check.py "${options[@]}" || status=1 ;;
        memory) timeout 240 "$PY" bench/memory.py --model 358m --device cuda --rows 64 --prompt 64 --completion 256 \
                    --micro 16 || status=1 ;;
        sampler) timeout 200 "$PY" bench/sampler.py --device cuda --repeats 2 || status=1 ;;
        mainjob) timeout 240 "$PY" bench/gpu_main_job.py || status=1 ;;
        realjob) timeout 300 "$PY" bench/real_model.py --skip base,bf16,trl --steps 3 --eval-tasks 1 --overrides \
                    "model=tiny model.tiny.hidden_size=896 model.tiny.layers=24 model.tiny.heads=14 model.tiny.kv_heads=2
                     model.tiny.intermediate_size=4864 model.device=cuda" || status=1 ;;
        pipeline) timeout 420 "$PY" bench/pipeline.py --experiment smollm2 --steps 4 --tasks-per-level 1 --overrides \
                    model=tiny model.tiny.hidden_size=896 model.tiny.layers=24 model.tiny.heads=14 model.tiny.kv_heads=2 \
                    model.tiny.intermediate_size=4864 model.device=cuda || status=1 ;;
        trl) out=$(mktemp -d) && timeout 200 "$PY" examples/trl_grpo.py --steps 4 --out "$out" && \
                 store_table "$out" || status=1 ;;
        verl) if ! "$PY" -c "import vllm" 2>/dev/null; then
                  echo "verl: vLLM is not installed for $PY; verl 0.7.1 needs it (or SGLang) to roll out" >&2; status=1
              else
                  out=$(mktemp -d)
                  "$PY" -c "from trainer.models.tiny_model import build_tiny_model as b; b('$out/model', max_positions=1024)"
                  OUT="$out" timeout 420 bash scripts/verl/run_grpo.sh actor_rollout_ref.model.path="$out/model" \
                      trainer.n_gpus_per_node=1 data.palestra.steps=3 data.train_batch_size=16 \
                      actor_rollout_ref.actor.ppo_mini_batch_size=16 data.max_prompt_length=256 \
                      data.max_response_length=64 actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
                      trainer.save_freq=-1 trainer.test_freq=-1 trainer.val_before_train=false && \
                  store_table "$out" || status=1
              fi ;;
    esac
done
exit $status
