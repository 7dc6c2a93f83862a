"""Mixing policies: per-domain signals in, mixture weights over domains out (docs/policy-workbench.md).

Build one from a validated config with ``curriculum.config.build_policy``; the registry below maps
each config ``type`` to its class.
"""
from curriculum.policies.bandits import DumpPolicy, Exp3Policy, SecPolicy, ThompsonPolicy, TsclPolicy
from curriculum.policies.base import MixingPolicy, Wrapped, normalise, softmax
from curriculum.policies.headroom import HeadroomPolicy
from curriculum.policies.simple import FixedPolicy, LearnabilityPolicy, PrioritizedPolicy, UniformPolicy

POLICIES: dict[str, type[MixingPolicy]] = {
    cls.name: cls
    for cls in (UniformPolicy, FixedPolicy, PrioritizedPolicy, LearnabilityPolicy, DumpPolicy,
                SecPolicy, ThompsonPolicy, TsclPolicy, Exp3Policy, HeadroomPolicy)
}

__all__ = [
    "POLICIES", "MixingPolicy", "Wrapped", "normalise", "softmax", "UniformPolicy", "FixedPolicy",
    "PrioritizedPolicy", "LearnabilityPolicy", "DumpPolicy", "SecPolicy", "ThompsonPolicy",
    "TsclPolicy", "Exp3Policy", "HeadroomPolicy",
]
