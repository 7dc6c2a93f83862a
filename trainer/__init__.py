"""GRPO trainer, in four layers that follow the loop:

- ``trainer.models``: what the policy is (loading, the tiny model, SmolLM2, LoRA adapters, FSDP2);
- ``trainer.sampling``: how rollouts are made (the samplers, tool episodes, a step's collection);
- ``trainer.update``: how the policy learns from them (advantages, losses, log-probs, the supervised
  loss, the update step);
- ``trainer.recipe``: the loop that ties them (``GRPORecipe``, SFT, evaluation, checkpoints).

``app`` (``palestra-train``), ``config``, ``runtime`` and ``distributed`` (torchrun's ranks) stay at
the top, asked by every layer; ``integrations`` drives TRL.
"""
