"""GRPO trainer: rollouts, advantages and losses, the training recipe, checkpoints."""
