"""Sharded training (FSDP2, gloo on the CPU): two sharded ranks train as one process does, and their
checkpoint, written shard by shard, resumes in one process.

The runs are those of tests/test_distributed.py's data-parallel test, with the model, its
gradients and the optimizer's moments sharded over the two ranks.
"""
import subprocess
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM

from trainer.app import CONF_DIR, run, to_config
from trainer.models.sharding import load_sharded
from test_distributed import HERE, OVERRIDES, _env, _rows, _torchrun, _weights

SHARDED = [*OVERRIDES, "trainer.system.sharding=fsdp"]


def sharded_weights(output_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """A sharded checkpoint's weights, read into one plain model (as a one-process resume does)."""
    model = AutoModelForCausalLM.from_pretrained(output_dir / "sft-model", dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters())
    load_sharded(output_dir / "checkpoints" / f"step-{step:07d}", model, optimizer)
    # as safetensors files hold them: a tied output head once, under the embedding's name
    tied = model.config.tie_word_embeddings
    return {k: v.clone() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


def one_process(tmp_path: Path, name: str, overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"output_dir={tmp_path / name}"])
    return run(to_config(cfg))


# three runs: 13 s on an idle 2-core machine, ~55 s on a busy one
def test_two_sharded_ranks_train_like_one_process_and_one_process_resumes_them(tmp_path):
    started = time.perf_counter()
    two = subprocess.Popen(_torchrun("trainer.app", f"hydra.run.dir={tmp_path / 'two'}", *SHARDED),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=HERE.parent,
                           env=_env(PALESTRA_DIST_TIMEOUT_S="300"))
    one_process(tmp_path, "one", OVERRIDES)  # meanwhile, the unsharded one-process run
    out, _ = two.communicate(timeout=400)
    assert two.returncode == 0, out.decode()[-3000:]
    print(f"torchrun 2 sharded ranks: {time.perf_counter() - started:.1f} s")

    checkpoint = tmp_path / "two" / "checkpoints" / "step-0000002"
    assert (checkpoint / "sharded").is_dir() and not (checkpoint / "model.safetensors").exists()
    assert _rows(tmp_path / "two") == _rows(tmp_path / "one")  # the same tasks, completions and advantages
    for step in (1, 2):
        # as in the data-parallel test: the gradients agree to float rounding, which Adam shows on
        # its tiniest elements
        torch.testing.assert_close(sharded_weights(tmp_path / "two", step), _weights(tmp_path / "one", step),
                                   rtol=0, atol=1e-5)
    two_at_2 = sharded_weights(tmp_path / "two", 2)

    # one process resumes the two ranks' step-1 checkpoint and makes their step 2
    one_process(tmp_path, "resumed", [*SHARDED, f"resume={tmp_path / 'two' / 'checkpoints' / 'step-0000001'}"])
    # the run goes on in its own folder, and one process saves it unsharded
    assert (tmp_path / "two" / "checkpoints" / "step-0000002" / "model.safetensors").is_file()
    torch.testing.assert_close(_weights(tmp_path / "two", 2), two_at_2, rtol=0, atol=1e-5)
    assert _rows(tmp_path / "two") == _rows(tmp_path / "one")  # step 2 recorded again, the same
