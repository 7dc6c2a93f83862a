"""Gradient checkpointing and the KL reference's placement: memory options that leave the update as it was."""
import pytest
import torch

from trainer.config import ConfigError, validate_config
from trainer.recipe.grpo import GRPORecipe
from trainer.update.reference import Reference
from test_lora import settings


def decoder_layer_calls(recipe: GRPORecipe) -> list[int]:
    """Counts of forward calls inside the first decoder layer (transformers keeps the layer's own
    hooks outside the checkpoint), by a pre-hook: a recomputation stops early, once it has what the
    backward needs, before a forward hook would run."""
    calls = [0]
    recipe.model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_gradient_checkpointing_recomputes_the_layers_and_trains_the_same(tmp_path):
    weights, calls = {}, {}
    for checkpointing in (False, True):
        cfg = settings(tmp_path / str(checkpointing), steps=1, model={"gradient_checkpointing": checkpointing}, beta=0.0)
        recipe = GRPORecipe(validate_config(cfg))
        try:
            recipe.setup()
            counted = decoder_layer_calls(recipe)
            recipe.train()
            calls[checkpointing] = counted[0]
            weights[checkpointing] = {k: v.clone() for k, v in recipe.model.state_dict().items()}
        finally:
            recipe.cleanup()
    # the same steps, and the layers' forwards run again in each backward pass
    assert calls[True] > calls[False]
    assert all(torch.allclose(weights[True][k], weights[False][k], atol=1e-6) for k in weights[False])


def test_the_reference_is_placed_where_asked_and_not_loaded_at_beta_zero(tmp_path):
    model = torch.nn.Linear(2, 2)
    gpu = torch.device("cuda")  # placement is decided without touching the device
    on_cpu, offloaded = Reference.copy(model, "cpu", gpu), Reference.copy(model, "offload", gpu)
    assert (on_cpu.home, on_cpu.run_on) == (torch.device("cpu"), torch.device("cpu"))
    assert (offloaded.home, offloaded.run_on) == (torch.device("cpu"), gpu)
    assert not any(p.requires_grad for p in model.parameters())
    recipe = GRPORecipe(validate_config(settings(tmp_path, beta=0.0)))
    try:
        recipe.setup()
        assert recipe.reference is None and recipe.ref_model is None
    finally:
        recipe.cleanup()


def test_a_merged_export_of_a_sharded_model_is_refused_in_one_line(tmp_path):
    raw = settings(tmp_path, model={"lora": {"enabled": True, "export_merged": True}})
    raw["trainer"] = {**raw["trainer"], "system": {**raw["trainer"]["system"], "sharding": "fsdp"}}
    with pytest.raises(ConfigError, match="model.lora.export_merged needs the whole model on one rank"):
        validate_config(raw)
