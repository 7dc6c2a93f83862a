"""Load the policy model and tokenizer: the built-in ``tiny`` model or any Hugging Face causal LM."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from domains.api import Messages, one_line
from domains.tools.calls import offer_tools
from trainer.config import ConfigError, ModelConfig
from trainer.models.pretrained import converted_smollm2, smollm2_source
from trainer.models.tiny_model import TinyShapeMismatch, build_tiny_model, shape_differences, tiny_shape


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def model_path(cfg: ModelConfig, output_dir: Path, seed: int) -> str:
    """Where the weights come from: a freshly built tiny model folder, or the user's model."""
    if cfg.type == "tiny":
        try:
            return str(build_tiny_model(output_dir / "tiny-model", **cfg.tiny.model_dump(), seed=seed))
        except TinyShapeMismatch as exc:
            raise ConfigError(f"model.tiny: {exc}") from None
    if cfg.type == "smollm2":
        return str(converted_smollm2(cfg.cache_dir))
    assert cfg.name_or_path is not None  # checked by check_model_source before the run's work
    folder = Path(cfg.name_or_path).expanduser()
    return str(folder) if folder.is_dir() else cfg.name_or_path  # transformers does not expand ~


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_source(cfg: ModelConfig) -> None:
    """A user's model folder must exist and hold a Hugging Face model, and a packaged model's
    package must be installed (cheap: run before any work)."""
    if cfg.type == "tiny":
        return
    if cfg.type == "smollm2":
        smollm2_source()
        return
    assert cfg.name_or_path is not None
    folder = Path(cfg.name_or_path).expanduser()
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise ConfigError(f"model.name_or_path: {cfg.name_or_path} has no config.json (not a Hugging Face model folder)")
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer that encodes every prompt to nothing
        raise ConfigError(f"model.name_or_path: {cfg.name_or_path} has no tokenizer "
                          f"(none of {', '.join(TOKENIZER_FILES)}); save the tokenizer beside the model")
    if not folder.is_dir() and (folder.exists() or _names_a_path(cfg.name_or_path)):
        raise ConfigError(f"model.name_or_path: no model folder at {cfg.name_or_path}")


def _names_a_path(name: str) -> bool:
    """A hub id is ``name`` or ``owner/name``; anything else with a slash is meant as a folder."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


def load_policy(path: str, cfg: ModelConfig, device: torch.device) -> tuple[PreTrainedTokenizerBase, torch.nn.Module]:
    """The tokenizer and model at ``path``; a user's model that fails to load is a ConfigError."""
    try:
        return load_tokenizer(path, tiny=cfg.type == "tiny"), load_model(path, device)
    except (OSError, ValueError) as exc:
        if cfg.type == "tiny":
            raise
        raise ConfigError(f"model.name_or_path: cannot load {path}: {one_line(exc)}") from exc


def check_resumable(cfg: ModelConfig, checkpoint: Path) -> None:
    """A resume keeps the run's model: other ``model.tiny`` settings would not fit its weights."""
    if cfg.type != "tiny" or not (checkpoint / "config.json").exists():  # a LoRA checkpoint: adapters alone
        return
    differ = shape_differences(checkpoint, tiny_shape(**cfg.tiny.model_dump()))
    if differ:
        raise ConfigError(f"resume: the model in {checkpoint} has {differ}; "
                          "a run keeps its model's shape (start a new run to change it)")


def load_tokenizer(path: str, tiny: bool) -> PreTrainedTokenizerBase:
    # The tiny tokenizer (also inside our checkpoints) is a plain fast tokenizer; AutoTokenizer
    # would substitute the Qwen2 class named by the model config, which does not know its
    # character-level pre-tokenizer. Folders that declare a plain fast tokenizer load as one.
    plain = tiny or _declared_tokenizer_class(path) in ("PreTrainedTokenizerFast", "TokenizersBackend")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path) if plain else AutoTokenizer.from_pretrained(path)
    # what transformers builds when it finds a config but no vocabulary (special tokens aside: one
    # that adds a BOS would otherwise pass)
    if not tokenizer.encode("Solve 1+1.", add_special_tokens=False):
        raise ValueError("its tokenizer encodes text to no tokens (no vocabulary found)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _declared_tokenizer_class(path: str) -> str | None:
    config = Path(path) / "tokenizer_config.json"
    return json.loads(config.read_text()).get("tokenizer_class") if config.exists() else None


def load_model(path: str, device: torch.device) -> torch.nn.Module:
    # Weights stay in fp32 (the optimizer's master copy); bf16 comes from autocast on CUDA.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if device.type == "cuda":
        avoid_per_shape_attention_plans()
    return model.to(device)


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them
    (non-reentrant checkpointing; transformers 5 renamed the call)."""
    settings = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=settings)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=settings)


def avoid_per_shape_attention_plans() -> None:
    """Leave cuDNN out of scaled-dot-product attention on CUDA.

    With a padding mask, PyTorch picks cuDNN's attention on Hopper GPUs, and cuDNN builds an
    execution plan for every new shape. Sampling makes a new shape at every token (the keys grow
    by one) and every step brings new batch and prompt widths, so most calls paid for a plan: on an
    H200 the main job's first GRPO steps spent 8 s each sampling. The kernels PyTorch falls back
    to (memory-efficient attention, or plain math) need no plan."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def end_token_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Every token that ends a completion, the tokenizer's own first: an instruct model's generation
    config may name more (an end-of-turn token beside the end-of-text one), and sampling must stop
    at each of them, as ``model.generate`` does."""
    named = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    found = [tokenizer.eos_token_id, *(named if isinstance(named, (list, tuple)) else [named])]
    return tuple(dict.fromkeys(int(i) for i in found if i is not None))


def template_takes_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's chat template renders a ``tools=`` list (Qwen's, Llama 3's and
    Hermes' do; SmolLM2's and the tiny model's do not)."""
    template = tokenizer.chat_template
    return "tools" in (" ".join(template.values()) if isinstance(template, dict) else template or "")


def encode_prompt(tokenizer: PreTrainedTokenizerBase, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
    """Chat messages -> token ids, by default ending where the assistant starts to speak. A tool
    domain's schemas go through the template's ``tools=`` argument where it takes one."""
    messages, tools = offer_tools(messages, template_takes_tools(tokenizer))
    if tokenizer.chat_template:
        encoded = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                                tokenize=True)
        return list(encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded)
    # No template (a base model): a plain documented format.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + ("assistant: " if add_generation_prompt else "")
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_completion(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A completion's tokens followed by EOS, as the model should emit it."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
