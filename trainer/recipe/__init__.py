"""The GRPO loop that ties ``models``, ``sampling`` and ``update`` together (``grpo``), with what runs
around it: the SFT warm start, evaluation, checkpoints, health alarms, metrics and audits."""
