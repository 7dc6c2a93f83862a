"""The built-in ``tiny`` model: a small Qwen2-architecture LM with a character-level tokenizer.

It is built locally (random weights, no download) and saved as an ordinary Hugging Face model
folder, so everything downstream loads it with ``AutoModelForCausalLM.from_pretrained`` exactly as
it would load a real model. One token per character (bar a few pieces of tool-call markup) keeps the
vocabulary tiny and lets a model of about a million parameters learn short arithmetic and code
answers on a CPU in minutes.
"""
from __future__ import annotations

import json
import re
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from domains.tools.calls import CLOSE, OPEN
from trainer.config import PROMPT_STYLE_KEY

SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
CHARACTERS = list(string.printable.replace("\x0b", "").replace("\x0c", "").replace("\r", ""))
# The fixed markup of a compact tool call gets one token per piece, as real tokenizers give
# ``<tool_call>`` a token of its own and BPE merges JSON punctuation: a call costs ~20 tokens, not ~65.
# The pieces are those of ``render_call``, the compact form the reference transcripts use.
MARKUP_TOKENS = [OPEN, CLOSE, '{"name":"', '","arguments":{', "}}"]

# A plain template the tiny model learns from scratch: role marker, content, end marker.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + MARKUP_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    # Every character is its own token, bar the markup pieces (tried first); the decoder glues
    # them back without spaces.
    pieces = "|".join(re.escape(t) for t in MARKUP_TOKENS)
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pieces + r"|[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|pad|>", eos_token="<|end|>", unk_token="?",
        additional_special_tokens=SPECIAL_TOKENS[2:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


class TinyShapeMismatch(ValueError):
    """A saved tiny model folder of another shape than the one asked for."""


def tiny_shape(*, hidden_size: int, layers: int, heads: int, kv_heads: int, intermediate_size: int) -> dict[str, int]:
    """The settings that fix the weights' shapes, under their Qwen2Config names."""
    return dict(hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=intermediate_size)


def shape_differences(folder: str | Path, shape: dict[str, int]) -> str:
    """What differs between the model saved in ``folder`` and ``shape`` ("hidden_size 32 (asked
    64)"); empty when nothing does."""
    saved = json.loads((Path(folder) / "config.json").read_text())
    return ", ".join(f"{key} {saved.get(key)} (asked {value})" for key, value in shape.items() if saved.get(key) != value)


def build_tiny_model(
    path: str | Path, *, hidden_size: int = 128, layers: int = 4, heads: int = 4,
    kv_heads: int = 2, intermediate_size: int = 384, max_positions: int = 512, seed: int = 0,
) -> Path:
    """Create (or reuse) the tiny model folder at ``path`` and return the path.

    A folder that is reused must have the shape asked for: a run started again in the same
    ``output_dir`` with other ``model.tiny`` settings would otherwise quietly train the old shape."""
    path = Path(path)
    shape = tiny_shape(hidden_size=hidden_size, layers=layers, heads=heads, kv_heads=kv_heads,
                       intermediate_size=intermediate_size)
    if (path / "config.json").exists():
        differ = shape_differences(path, shape)
        if differ:
            raise TinyShapeMismatch(f"the tiny model at {path} has {differ}; use another output_dir for another shape")
        return path
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), **shape, max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, rope_theta=10000.0, **{PROMPT_STYLE_KEY: "compact"},
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
