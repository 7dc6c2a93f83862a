"""What the policy is: the model and tokenizer as a run loads them (``loading``), the tiny test model,
SmolLM2 converted from its GGUF file, LoRA adapters and FSDP2 sharding. The ``sampling``, ``update``
and ``recipe`` layers all take their policy from here."""
