"""Tool-use domains: multi-turn episodes against stateful environments (see ``environment``).

``calls`` reads Hermes-style tool calls, ``environment`` holds the episode loop and the ToolDomain
base, ``builtin`` the procedural domains and ``bfcl`` the single-call function-calling dataset.
"""
