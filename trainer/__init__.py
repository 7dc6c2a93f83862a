"""GRPO trainer, in four layers that follow the loop:

- ``trainer.models``: what the policy is (loading, the tiny model, SmolLM2, LoRA adapters, FSDP2);
- ``trainer.sampling``: how rollouts are made (the samplers, tool episodes, a step's collection);
- ``trainer.update``: how the policy learns from them (advantages, losses, log-probs, the update step);
- ``trainer.recipe``: the loop that ties them (``GRPORecipe``, SFT, evaluation, checkpoints, torchrun).

``app`` (``palestra-train``), ``config`` and ``runtime`` stay at the top; ``integrations`` drives TRL.
"""
