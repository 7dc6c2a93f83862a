"""Sharded training with FSDP2 (``trainer.system.sharding=fsdp`` under torchrun).

Each decoder layer, then the whole model, goes through ``fully_shard``: a rank holds 1/N of every
parameter, of its gradient and of the optimizer's moments, and gathers a layer's full weights only
for that layer's forward and backward. The step keeps the replicated ranks' semantics
(trainer/distributed.py): rank 0 plans and records, every rank samples and trains on its share,
and the ranks' gradients are *summed* — the reduce-scatter's divide factor is 1, so each rank's
loss, weighted by its share of the step's normaliser, adds up to the one-process gradient.

Two things differ from replicated ranks, because every forward and backward of a sharded model is
a collective that all ranks must join:

- sampling and evaluation run on the gathered model (``gathered``): its full weights are put
  together once on every rank, and then each rank generates as much as its share needs with no
  collective at all; they are sharded again afterwards;
- in the update, a rank with fewer micro-batches than another (shares differ by a row; a rank
  may have none) joins the others' passes with passes of weight zero (``join_passes``).

The SFT warm start, where every rank computes the same batch's gradient, scales each rank's by
1/N before the reduce-scatter sums them (it sums for the update; gloo has no reduce-scatter
that scales by a factor of one's choosing). A KL
reference copy on the device is sharded like the policy.

Checkpoints of a sharded model are written by every rank with torch.distributed.checkpoint, and
read back by any number of ranks, sharded or not (``save_sharded``, ``load_sharded``).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch

from trainer.distributed import World

SHARDED = "sharded"  # a checkpoint's torch.distributed.checkpoint folder: the model and the optimizer


def _fsdp():
    from torch.distributed import fsdp

    return fsdp


def shard(model: torch.nn.Module, world: World, device: torch.device, bf16: bool) -> torch.nn.Module:
    """``model`` sharded over the world's ranks, layer by layer; ``bf16`` gathers the weights in
    bfloat16 for compute and reduces gradients in float32 (the optimizer's copy stays float32)."""
    from torch.distributed.device_mesh import init_device_mesh

    fsdp = _fsdp()
    mesh = init_device_mesh(device.type, (world.size,))
    precision = fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else fsdp.MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fsdp.fully_shard(layer, mesh=mesh, mp_policy=precision)
    fsdp.fully_shard(model, mesh=mesh, mp_policy=precision)
    for unit in _units(model):  # summed, as the ranks' shares of the loss are weighted to be; a plain
        unit.set_gradient_divide_factor(1.0)  # sum (gloo has no pre-multiplied one)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers model (the units that are gathered one at a time)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, _fsdp().FSDPModule)


def _units(model: torch.nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, _fsdp().FSDPModule)]


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """The sharded model's full weights on every rank for the duration (sampling, evaluation), so
    that ranks may run different numbers of forwards; a plain model as it is."""
    if not is_sharded(model):
        yield
        return
    units = _units(model)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


def join_passes(model: torch.nn.Module, count: int, backward: bool) -> None:
    """``count`` passes of weight zero through the whole model: this rank's part in the other
    ranks' gathers (and, with ``backward``, reduce-scatters) when it has no micro-batch of its own."""
    device = next(model.parameters()).device
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    for _ in range(count):
        with torch.set_grad_enabled(backward):
            logits = model(input_ids=ids).logits
        if backward:
            (logits.float().sum() * 0.0).backward()


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole state dict on every rank (a sharded model's is gathered: all ranks call)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a whole (unsharded) state dict; a sharded model keeps its own shard of each tensor."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def all_finite(model: torch.nn.Module, world: World) -> bool:
    """Whether every weight is finite, on every rank's shards."""
    local = all(bool(torch.isfinite(_local(p)).all()) for p in model.parameters())
    return not world.any(not local) if is_sharded(model) else local


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def total_norm(norm: torch.Tensor) -> float:
    """A gradient norm as a float (a sharded model's is a replicated DTensor)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def save_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The model and optimizer in ``folder``/sharded, each rank writing its shards (all ranks call)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder / SHARDED)


def load_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read ``folder``/sharded into ``model`` and ``optimizer``, whatever the number of ranks (or
    none) that wrote it and that read it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=folder / SHARDED)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
