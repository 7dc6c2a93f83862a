"""Set-up failures and interruptions of a training run: one clear line, the run's state kept."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from curriculum.store import StatsStore, StoreUnavailable
from domains.registry import DomainError
from trainer.app import run
from trainer.config import ConfigError, ModelConfig, validate_config
from trainer.models.loading import load_policy
from quick_settings import quick

BROKEN_PLUGIN = '''
from domains import Domain, Task, VerifyResult, user_prompt


class Exploding(Domain):
    name = "exploding"
    levels = (1,)

    def sample(self, level, n, rng):
        raise RuntimeError("sample exploded")

    def verify(self, task, completion):
        return VerifyResult.failure("error", "never called")


DOMAIN = Exploding()
'''


def config(tmp_path, **extra):
    raw = {
        "name": "setup", "seed": 0, "output_dir": str(tmp_path / "run"), "domains": ["arithmetic"],
        "policy": {"type": "uniform"}, "difficulty": {"type": "fixed"},
        "model": {"type": "tiny", "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1,
                                            "intermediate_size": 64}},
        "trainer": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "verifier": {"workers": 1}, "sft": {"steps": 0}, "eval": {"tasks_per_level": 1}, **extra,
    }
    return validate_config(quick(raw))


def test_a_file_that_is_not_a_database_fails_before_the_model_is_built(tmp_path):
    notes = tmp_path / "notes.db"
    notes.write_text("my notes\n")
    with pytest.raises(StoreUnavailable, match=r"^cannot open the stats store sqlite:///\S+notes\.db: "
                                               r"file is not a database$"):
        run(config(tmp_path, store={"url": f"sqlite:///{notes}"}))
    assert notes.read_text() == "my notes\n" and not (tmp_path / "run" / "tiny-model").exists()


def test_a_plugin_that_cannot_draw_tasks_is_named_before_the_model_is_built(tmp_path, monkeypatch):
    (tmp_path / "exploding_plugin.py").write_text(textwrap.dedent(BROKEN_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DomainError, match=r"^domain 'exploding' could not draw its held-out tasks at level 1: "
                                          r"RuntimeError: sample exploded$"):
        run(config(tmp_path, domains=["exploding_plugin:DOMAIN"]))
    assert not (tmp_path / "run").exists()


def test_a_users_model_folder_that_is_missing_or_empty_is_a_config_error(tmp_path):
    missing, empty = tmp_path / "no-such-model", tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(ConfigError, match=rf"^model\.name_or_path: no model folder at {missing}$"):
        run(config(tmp_path, model={"type": "hf", "name_or_path": str(missing)}))
    with pytest.raises(ConfigError, match=rf"^model\.name_or_path: {empty} has no config\.json "
                                          r"\(not a Hugging Face model folder\)$"):
        run(config(tmp_path, model={"type": "hf", "name_or_path": str(empty)}))
    untokenized = tmp_path / "weights-only"
    untokenized.mkdir()
    (untokenized / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=rf"^model\.name_or_path: {untokenized} has no tokenizer \(none of "):
        run(config(tmp_path, model={"type": "hf", "name_or_path": str(untokenized)}))
    assert not (tmp_path / "run").exists()  # refused before the run folder or its store was written


def test_a_model_folder_whose_tokenizer_has_no_vocabulary_is_a_config_error(tmp_path):
    from transformers import Qwen2Config

    folder = tmp_path / "vocabless"
    Qwen2Config(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=32).save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text("{}")  # transformers builds a tokenizer of one token from this
    with pytest.raises(ConfigError, match=rf"^model\.name_or_path: cannot load {folder}: its tokenizer encodes "
                                          r"text to no tokens"):
        load_policy(str(folder), ModelConfig(type="hf", name_or_path=str(folder)), torch.device("cpu"))


# SIGTERM in the default run: _interrupt turns it into the KeyboardInterrupt that Ctrl-C raises, so
# both end in one except clause; the SIGINT case (19 s on a 2-core machine) runs with --runslow
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])
def test_a_signal_during_the_warm_start_ends_the_run_in_one_line_marked_interrupted(tmp_path, sig):
    args = [sys.executable, "-m", "trainer.app", f"hydra.run.dir={tmp_path}", "domains=[arithmetic]",
            "sft.steps=100000", "sft.batch_size=4", "verifier.workers=1", "model.tiny.hidden_size=32",
            "model.tiny.layers=2", "model.tiny.heads=2", "model.tiny.kv_heads=1", "model.tiny.intermediate_size=64"]
    with open(tmp_path / "stderr.txt", "w") as err_file:
        # its own process group, signalled whole, as a terminal's Ctrl-C reaches the verifier workers too
        # (and with Ctrl-C's default action: a test run started in the background inherits it ignored)
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err_file, text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                                cwd=Path(__file__).parents[1], env={**os.environ, "TQDM_DISABLE": "1"})
        watchdog = threading.Timer(180, proc.kill)  # a hung run fails the test instead of hanging it
        watchdog.start()
        try:
            for line in proc.stdout:  # signal once the warm start runs
                if line.startswith("SFT warm start"):
                    break
            os.killpg(proc.pid, sig)
            proc.communicate(timeout=60)
        finally:
            watchdog.cancel()
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 128 + sig and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("interrupted: ")
    with StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}", create=False) as store:
        assert [r["status"] for r in store.runs()] == ["interrupted"]
