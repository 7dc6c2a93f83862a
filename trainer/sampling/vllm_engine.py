"""Rollouts on vLLM (``trainer.sampling.rollout_backend=vllm``): a GPU-only option, never needed by the core.

The engine runs colocated in the trainer's process, holds its own copy of the policy's weights and
gets the trained weights pushed into it after every optimizer step (``push_weights``). It returns
the same ``Rollout`` as ``trainer.sampling.rollout.generate``, so everything downstream (verification, the
loss, the store) is unchanged; the trainer still recomputes the log-probs of the sampled tokens with
its own forward pass, so any numerical difference between the engines changes which tokens are
sampled, never the gradient's formula. ``bench/gpu_check.sh`` checks on a GPU that the two engines
agree on those log-probs and measures both engines' tokens/s.

Why colocated and in-process: it is the simplest set-up that lets weights move by a plain
``load_weights`` call on the engine's model (TRL's "colocate" mode does the same), and it needs no
second GPU. vLLM's engine core must then run in this process, hence
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before vLLM is imported.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch

from trainer.models.adapters import has_adapters, merged_state
from trainer.sampling.rollout import Rollout, StopText, as_ids, assemble, left_pad


class VLLMUnavailable(RuntimeError):
    """vLLM is missing or there is no CUDA device; said in one line before any work."""


def _import_vllm():
    if not torch.cuda.is_available():
        raise VLLMUnavailable("trainer.sampling.rollout_backend=vllm needs a CUDA GPU; use rollout_backend=hf on the CPU")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError:
        raise VLLMUnavailable("trainer.sampling.rollout_backend=vllm needs vLLM: pip install vllm") from None
    return vllm


class VLLMEngine:
    """Batched sampling with vLLM, called like ``trainer.sampling.rollout.generate`` (the model argument is
    ignored: the engine samples from the weights last pushed into it)."""

    def __init__(self, model_path: str | Path, *, gpu_memory_utilization: float = 0.3,
                 max_model_len: int = 1024, seed: int = 0, dtype: str = "auto") -> None:
        vllm = _import_vllm()
        self._sampling_params = vllm.SamplingParams
        self.llm = vllm.LLM(
            model=str(model_path), gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
            seed=seed, dtype=dtype, enforce_eager=True,  # no CUDA-graph capture: weights change every step
        )
        self.tokenizer = self.llm.get_tokenizer()

    def push_weights(self, model: torch.nn.Module) -> None:
        """Copy the trained policy's parameters into the engine and drop its cached prefixes."""
        target = self._engine_model()
        with torch.no_grad():
            # with LoRA the engine serves the base with the adapters merged in
            weights = merged_state(model).items() if has_adapters(model) else model.named_parameters()
            target.load_weights((name, p.detach()) for name, p in weights)
        self.llm.reset_prefix_cache()

    def _engine_model(self) -> torch.nn.Module:
        # Where vLLM keeps the model differs between its engine generations; TRL's colocate mode
        # reaches it through the driver worker, as here.
        executor = self.llm.llm_engine.model_executor
        worker = executor.driver_worker
        runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
        return runner.model

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module | None, prompts: list[list[int]], *, max_new_tokens: int,
                 eos_id: int | Sequence[int], pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, stop: StopText | None = None,
                 logprobs: bool = False) -> Rollout | tuple[Rollout, list[list[float]]]:
        params = self._sampling_params(
            n=1, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop_token_ids=list(as_ids(eos_id)),
            stop=[stop.text] if stop else None, include_stop_str_in_output=True,
            skip_special_tokens=False, logprobs=0 if logprobs else None,
        )
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        rows = [out.outputs[0] for out in outputs]
        completion, lengths, ended = self._pad(rows, max_new_tokens, eos_id, pad_id)
        ids, prompt_mask = left_pad(prompts, pad_id)
        rollout = assemble(ids, prompt_mask, completion, lengths, ended, eos_id)
        if not logprobs:
            return rollout
        # logprobs=0 asks vLLM for the sampled token's log-prob only, one dict per generated token
        sampled = [[step[tok].logprob for tok, step in zip(row.token_ids, row.logprobs)] for row in rows]
        return rollout, sampled

    @staticmethod
    def _pad(rows, max_new_tokens: int, eos_id: int | Sequence[int],
             pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Completions [B, L] padded with ``pad_id``, their lengths (EOS included) and whether they
        ended (EOS or stop sequence) rather than running out of budget."""
        ends = as_ids(eos_id)
        token_rows, ended = [], []
        for row in rows:
            tokens = list(row.token_ids)[:max_new_tokens]
            stopped = row.finish_reason == "stop"
            if stopped and not isinstance(row.stop_reason, str) and (not tokens or tokens[-1] not in ends):
                # ending is a choice the policy made: the end token it chose belongs in the loss
                tokens.append(row.stop_reason if row.stop_reason in ends else ends[0])
            token_rows.append(tokens)
            ended.append(stopped)
        width = max(1, max(len(t) for t in token_rows))
        completion = torch.full((len(rows), width), pad_id, dtype=torch.long)
        for b, tokens in enumerate(token_rows):
            completion[b, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        lengths = torch.tensor([len(t) for t in token_rows], dtype=torch.long)
        return completion, lengths, torch.tensor(ended, dtype=torch.bool)
