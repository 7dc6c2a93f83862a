"""The KL reference of the update: where its log-probs come from.

With LoRA it is the policy itself with its adapters disabled (no weights of its own). Otherwise it
is a frozen copy of the post-SFT policy, placed by ``model.reference_placement``: on the policy's
device; on the CPU and run there (the device holds none of it; its forward is the CPU's); or on
the CPU and moved to the device for its forward only (the device holds it for that pass alone).
At beta = 0 there is no reference at all.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from trainer.models.adapters import adapter_free, has_adapters
from trainer.models.loading import load_model
from trainer.models.sharding import is_sharded, load_full_state_dict, shard
from trainer.distributed import World


def make_reference(policy: torch.nn.Module, post_sft: str, placement: str, device: torch.device,
                   world: World) -> "Reference":
    """The KL reference of ``policy`` (with beta > 0): the adapter-free policy with LoRA; else a
    copy of the post-SFT model at ``post_sft``, placed, and sharded like a sharded policy when it
    lives on the device."""
    if has_adapters(policy):
        return Reference.adapter_free_policy(policy)
    copy = load_model(post_sft, device if placement == "device" else torch.device("cpu"))
    if is_sharded(policy) and placement == "device":
        shard(copy, world, device, bf16=False)
    return Reference.copy(copy, placement, device)


class Reference:
    """A model to take frozen log-probs from: ``running()`` lends it, on the device it runs on."""

    def __init__(self, model: torch.nn.Module, *, home: torch.device | None = None,
                 run_on: torch.device | None = None, adapters_off: bool = False) -> None:
        self.model, self.adapters_off = model, adapters_off
        self.home = home or next(model.parameters()).device  # where it stays between passes
        self.run_on = run_on or self.home  # where its forward runs

    @classmethod
    def copy(cls, model: torch.nn.Module, placement: str, device: torch.device) -> "Reference":
        """A frozen copy, placed: "device", "cpu" (kept and run there) or "offload" (kept there, run on ``device``)."""
        home = device if placement == "device" else torch.device("cpu")
        return cls(model.to(home).eval().requires_grad_(False), home=home,
                   run_on=device if placement == "offload" else home)

    @classmethod
    def adapter_free_policy(cls, policy: torch.nn.Module) -> "Reference":
        return cls(policy, adapters_off=True)

    @property
    def is_copy(self) -> bool:
        return not self.adapters_off

    @contextlib.contextmanager
    def running(self) -> Iterator[torch.nn.Module]:
        """The reference, ready for a forward on ``self.run_on``; put back afterwards."""
        if self.adapters_off:
            with adapter_free(self.model):
                yield self.model
            return
        moved = self.run_on != self.home
        if moved:
            self.model.to(self.run_on)
        try:
            yield self.model
        finally:
            if moved:
                self.model.to(self.home)

    def take_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Become the policy as it is now (``state``: its base weights, after the warm start); the
        adapter-free policy already is."""
        if self.is_copy:
            load_full_state_dict(self.model, state)
