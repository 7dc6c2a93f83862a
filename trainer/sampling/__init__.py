"""How rollouts are made: the samplers that draw completions from a ``models`` policy (eager, captured,
vLLM), multi-turn tool episodes, and the collection of a step's verified groups (``collect``). What
this layer returns is what the ``update`` layer learns from."""
