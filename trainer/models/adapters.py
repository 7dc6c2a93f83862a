"""LoRA adapters through ``peft`` (``model.lora``).

The policy is the base model with low-rank adapters on its linear layers; only the adapters train,
so the optimizer holds two moments of the adapters alone, and a checkpoint holds the adapters (the
base is the run's ``sft-model`` folder, written after the warm start). The warm start trains the
base itself with the adapters switched off: peft starts every adapter at zero, so the post-SFT
policy is the adapter-free model, which is exactly the KL reference GRPO wants — with beta > 0 the
reference log-probs come from the same weights with the adapters disabled, and no second copy of
the model is loaded.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch

from trainer.config import ConfigError, LoraConfig
from trainer.models.sharding import full_state_dict

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # what peft's save_pretrained writes
PEFT_PREFIX = "base_model.model."  # how peft's wrapper prefixes the base model's names
MERGED = "merged"  # a checkpoint's subfolder with the adapters merged into the base (export_merged)


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora.enabled needs the peft package: pip install -e '.[lora]' "
                          "(make installs it)") from None
    return peft


def attach_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """``model`` with fresh (zero-output) adapters; its own weights are frozen."""
    peft = _peft()
    settings = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                               target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, settings)
    except ValueError as exc:  # target modules that the model does not have
        raise ConfigError(f"model.lora.target_modules: {exc}".splitlines()[0]) from None


def has_adapters(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def adapter_free(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """The policy as its base model (adapters off) for the duration; a plain model as it is."""
    return model.disable_adapter() if has_adapters(model) else contextlib.nullcontext()


@contextlib.contextmanager
def training_the_base(model: torch.nn.Module) -> Iterator[None]:
    """Adapters off and the base's weights trainable (the warm start): what it learns is in the
    base, which the adapters then start from. A plain model is left as it is."""
    if not has_adapters(model):
        yield
        return
    base = [p for name, p in model.named_parameters() if "lora_" not in name]
    with model.disable_adapter():
        for p in base:
            p.requires_grad_(True)
        try:
            yield
        finally:
            for p in base:
                p.requires_grad_(False)


def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base's own weights, named as a plain model names them (the adapters left out): the KL
    reference, and the base a resume attaches the adapters to. Every rank calls it (a sharded
    model's weights are gathered)."""
    state = full_state_dict(model)
    if not has_adapters(model):
        return state
    return {name.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."): tensor
            for name, tensor in state.items() if "lora_" not in name}


def merged_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights with each adapter's update added to its layer, named as a plain model names them
    (what the merged export and an inference engine load); layer by layer, no copy of the model."""
    base = model.get_base_model()
    state = {}
    for name, module in base.named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight"):  # a layer with adapters
            with torch.no_grad():
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
                state[f"{name}.weight"] = module.base_layer.weight.detach() + delta
            if module.base_layer.bias is not None:
                state[f"{name}.bias"] = module.base_layer.bias.detach()
    for name, tensor in base.state_dict().items():
        if "lora_" not in name and ".base_layer." not in name:
            state[name] = tensor.detach()
    return state


def save_plain(model: torch.nn.Module, folder: Path, state: dict[str, torch.Tensor]) -> None:
    """An ordinary model folder of ``state`` (``base_state`` or ``merged_state``)."""
    plain = model.get_base_model() if has_adapters(model) else model
    plain.save_pretrained(folder, state_dict=dict(state))  # a copy: it drops tied weights' keys from the one given


def load_adapters(model: torch.nn.Module, folder: Path) -> None:
    """The adapters saved in a checkpoint ``folder``; a checkpoint without them is a ConfigError."""
    from safetensors.torch import load_file

    path = folder / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ConfigError(f"resume: {folder} holds no LoRA adapters ({ADAPTER_WEIGHTS}); it was saved "
                          "without model.lora.enabled")
    result = _peft().set_peft_model_state_dict(model, load_file(path))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ConfigError(f"resume: {folder}'s adapters do not fit this model.lora "
                          f"({len(unexpected)} unexpected, e.g. {unexpected[0]})")
