"""The vLLM rollout backend: its conversion of vLLM outputs into a Rollout runs everywhere; the
engine itself needs a CUDA GPU and vLLM; bench/gpu_check.sh checks it, and the trainer on CUDA, on a GPU machine."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trainer.config import TrainerConfig
from trainer.sampling.rollout import assemble, left_pad
from trainer.sampling.vllm_engine import VLLMEngine, VLLMUnavailable, _import_vllm

ROOT = Path(__file__).resolve().parents[1]
EOS, PAD = 1, 0


def row(tokens, finish, stop_reason=None):
    return SimpleNamespace(token_ids=tokens, finish_reason=finish, stop_reason=stop_reason)


def test_vllm_outputs_become_a_rollout_with_eos_in_the_loss():
    rows = [row([5, 6, EOS], "stop"),       # EOS reported in the tokens
            row([7], "stop"),               # EOS stop without the token: it is added back
            row([8, 9, 10, 11], "length"),  # ran out of budget: truncated, nothing added
            row([12, 13], "stop", "</x>")]  # a stop string ends the turn; its tokens are the text
    completion, lengths, ended = VLLMEngine._pad(rows, max_new_tokens=4, eos_id=EOS, pad_id=PAD)
    assert completion.tolist() == [[5, 6, EOS, PAD], [7, EOS, PAD, PAD], [8, 9, 10, 11], [12, 13, PAD, PAD]]
    assert lengths.tolist() == [3, 2, 4, 2] and ended.tolist() == [True, True, False, True]
    ids, mask = left_pad([[2, 3], [4]], PAD)
    rollout = assemble(ids[[0, 1, 0, 1]], mask[[0, 1, 0, 1]], completion, lengths, ended, EOS)
    assert rollout.truncated.tolist() == [False, False, True, False]
    assert rollout.completion_ids == [[5, 6], [7], [8, 9, 10, 11], [12, 13]]
    assert rollout.completion_mask.sum(dim=1).tolist() == [3, 2, 4, 2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_without_cuda_the_backend_says_so_in_one_line():
    with pytest.raises(VLLMUnavailable, match="needs a CUDA GPU; use rollout_backend=hf"):
        _import_vllm()
    with pytest.raises(ValueError, match="rollout_backend=vllm needs a CUDA GPU"):
        TrainerConfig(rollout_backend="vllm")


def _gpu_check(*args: str) -> subprocess.CompletedProcess:
    # each part of bench/gpu_check.sh has its own time limit there, all well inside this suite's 600 s
    done = subprocess.run(["bash", str(ROOT / "bench/gpu_check.sh"), *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU check needs a CUDA GPU")
def test_the_trainer_passes_its_gpu_check():
    done = _gpu_check("trainer", "--vllm", "off", "--prompts", "16", "--max-new-tokens", "16", "--speed-batch", "32")
    assert "gpu check: PASS (vLLM not checked: --vllm off)" in done.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU check needs a CUDA GPU")
def test_the_vllm_backend_passes_its_gpu_check():
    pytest.importorskip("vllm", reason="vLLM is not installed here (pip install vllm): its GPU check cannot run")
    done = _gpu_check("trainer", "--vllm", "require", "--prompts", "16", "--max-new-tokens", "16",
                      "--speed-batch", "32")
    assert "gpu check: PASS\n" in done.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU check needs a CUDA GPU")
@pytest.mark.parametrize("part", ["memory", "sampler", "mainjob"])
def test_each_other_part_of_the_gpu_check_passes(part):
    done = _gpu_check(part)
    assert f"== {part}" in done.stdout
