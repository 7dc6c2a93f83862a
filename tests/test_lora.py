"""LoRA through peft, gradient checkpointing and the reference's placement.

With LoRA the KL reference is the policy with its adapters off: one copy of the base weights in
the process, and reference log-probs equal to those of the post-SFT model loaded on its own. Only
the adapters train and are checkpointed; a resume puts them back on the run's post-SFT base.
"""
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.app import run
from trainer.config import ConfigError, validate_config
from trainer.models.adapters import merged_state
from trainer.recipe.grpo import GRPORecipe
from trainer.update.losses import group_advantages
from trainer.update.step import _Rows
from quick_settings import quick

sys.path.insert(0, str(Path(__file__).parent))  # spawned verifier workers import distributed_helpers from here

TINY = {"type": "tiny", "device": "cpu",
        "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}}
LORA = {"enabled": True, "rank": 4, "alpha": 8}


def settings(tmp_path: Path, steps: int = 2, model: dict | None = None, beta: float = 0.1, **extra) -> dict:
    return quick({
        "name": "lora", "seed": 5, "output_dir": str(tmp_path / "run"), "model": {**TINY, **(model or {})},
        # graded rewards: a gradient from the first step
        "domains": ["distributed_helpers:DIGITS"], "policy": {"type": "uniform"}, "difficulty": {"type": "fixed"},
        "trainer": {"steps": steps, "prompts_per_step": 4, "group_size": 4,
                    "sampling": {"max_new_tokens": 8, "rollout_batch_size": 16},
                    "loss": {"beta": beta}, "optim": {"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 16}},
        "verifier": {"workers": 1}, "sft": {"steps": 3, "batch_size": 8}, "eval": {"tasks_per_level": 1}, **extra,
    })


def storage_bytes(*modules: torch.nn.Module) -> int:
    """Bytes of the distinct storages behind the modules' parameters: a tensor shared twice counts once."""
    seen = {}
    for module in modules:
        for p in module.parameters():
            storage = p.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def some_rows(recipe: GRPORecipe) -> tuple[_Rows, list[slice]]:
    plan = recipe.curriculum.plan(recipe.start_step + 1)
    batch = recipe.collector.collect_step(plan, recipe.curriculum, defaultdict(float)).batch
    rollout = batch.rollout
    rows = _Rows(rollout.sequences, rollout.attention_mask, rollout.completion_mask.float(),
                 group_advantages(batch.rewards, "group").flatten(), rollout.prompt_width)
    return rows, [slice(0, len(rows.seqs))]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LoRA run of two GRPO steps with beta > 0, checkpointed after each."""
    tmp_path = tmp_path_factory.mktemp("lora")
    summary = run(validate_config(settings(tmp_path, model={"lora": {**LORA, "export_merged": True}},
                                           checkpoint={"every": 1})))
    return tmp_path, summary


def test_lora_holds_one_copy_of_the_base_and_its_reference_is_the_post_sft_model(trained):
    tmp_path, _ = trained
    recipe = GRPORecipe(validate_config(settings(tmp_path, steps=3, model={"lora": LORA}, resume="auto")))
    try:
        recipe.setup()
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "sft-model", dtype=torch.float32).eval()
        adapters = sum(p.numel() * 4 for n, p in recipe.model.named_parameters() if "lora_" in n)
        assert 0 < adapters < storage_bytes(base) / 4
        # the policy and its reference together: the base once, plus the adapters
        assert recipe.ref_model is None and recipe.reference.model is recipe.model
        assert storage_bytes(recipe.model, recipe.reference.model) == storage_bytes(base) + adapters
        # only the adapters train
        assert {id(p) for group in recipe.optimizer.param_groups for p in group["params"]} == {
            id(p) for n, p in recipe.model.named_parameters() if "lora_" in n}
        rows, chunks = some_rows(recipe)
        reference = recipe.update.reference_logprobs(rows, chunks)
        separately = recipe.update.frozen_logprobs(base, rows, chunks)
        assert torch.allclose(reference, separately, atol=1e-5)
        # and the trained adapters move the policy away from it
        policy = recipe.update.frozen_logprobs(recipe.model, rows, chunks)
        assert not torch.allclose(policy, reference, atol=1e-3)
        # the merged weights (the merged export's, and what a vLLM engine is sent) are the policy
        base.load_state_dict(merged_state(recipe.model))
        assert torch.allclose(recipe.update.frozen_logprobs(base, rows, chunks), policy, atol=1e-5)
    finally:
        recipe.cleanup()


def test_lora_checkpoints_hold_the_adapters_and_a_merged_export(trained):
    tmp_path, summary = trained
    folder = tmp_path / "run" / "checkpoints" / "step-0000002"
    assert (folder / "adapter_model.safetensors").is_file() and not (folder / "model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(folder / "merged", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "sft-model", dtype=torch.float32)
    moved = [k for k, v in merged.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert moved and all(k.endswith("proj.weight") for k in moved)  # only the adapted layers differ


def test_a_lora_run_resumes_from_its_adapters(trained, tmp_path):
    first_tmp, first = trained
    resumed = run(validate_config(settings(first_tmp, steps=3, model={"lora": LORA}, resume="auto")))
    assert resumed["run_id"] == first["run_id"]
    assert (first_tmp / "run" / "checkpoints" / "step-0000003" / "adapter_model.safetensors").is_file()
    # a LoRA checkpoint cannot be resumed as full fine-tuning (its base weights are not in it)
    with pytest.raises(ConfigError, match="holds LoRA adapters; resume it with model.lora.enabled=true"):
        run(validate_config(settings(first_tmp, steps=4, resume=str(first_tmp / "run" / "checkpoints" / "step-0000003"))))


def test_a_lora_target_the_model_lacks_is_a_one_line_error(tmp_path):
    recipe = GRPORecipe(validate_config(settings(tmp_path, model={"lora": {**LORA, "target_modules": ["nope_proj"]}})))
    try:
        with pytest.raises(ConfigError, match="model.lora.target_modules"):
            recipe.setup()
    finally:
        recipe.cleanup()


@pytest.mark.slow  # three runs, ~75 s on a 2-core machine
def test_two_ranks_train_lora_like_one_process(tmp_path):
    import subprocess

    from safetensors.torch import load_file

    from test_distributed import HERE, OVERRIDES, _env, _rows, _torchrun
    from test_fsdp import one_process

    with_lora = [*OVERRIDES, "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"]
    for name, sharding in (("two", "replicate"), ("sharded", "fsdp")):
        two = subprocess.run(_torchrun("trainer.app", f"hydra.run.dir={tmp_path / name}", *with_lora,
                                       f"trainer.system.sharding={sharding}"), cwd=HERE.parent,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(PALESTRA_DIST_TIMEOUT_S="300"))
        assert two.returncode == 0, two.stdout.decode()[-3000:]
    one_process(tmp_path, "one", with_lora)
    # the same samples, so the same weights up to rounding, at every step (the rehearsal blend included)
    assert _rows(tmp_path / "two") == _rows(tmp_path / "one") == _rows(tmp_path / "sharded")
    adapters = [load_file(tmp_path / run / "checkpoints" / "step-0000002" / "adapter_model.safetensors")
                for run in ("one", "two")]
    assert any(float(v.abs().max()) > 0 for k, v in adapters[0].items() if "lora_B" in k)  # they trained
    torch.testing.assert_close(adapters[1], adapters[0], rtol=0, atol=1e-5)
