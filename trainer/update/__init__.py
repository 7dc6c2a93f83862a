"""How the policy learns from the rollouts ``sampling`` made: group advantages and losses, token
log-probabilities, the KL reference, the learning-rate schedule, and the update itself (``step``)."""
