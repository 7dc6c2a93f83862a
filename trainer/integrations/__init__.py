"""Adapters that let other trainers use Palestra's curriculum (scheduler, verifiers, store).

Each adapter lives in its own module and imports its trainer's library lazily, so core Palestra
never needs it installed: ``trainer.integrations.trl`` drives TRL's ``GRPOTrainer``,
``trainer.integrations.verl`` verl's PPO/GRPO trainer (with ``verl_steps`` and ``verl_reward``).
"""
