"""Pure functions for GRPO: group-relative advantages, the clipped policy loss, KL, aggregation.

Shapes: P prompts, G completions per prompt, B = P*G sequences, L completion tokens (padded).

Departures from the GRPO paper (Shao et al. 2024), each an option the user can turn back:
- the clip range is asymmetric (``eps_low``/``eps_high``, DAPO's "clip-higher"); equal values give
  the paper's symmetric clip;
- the loss can be aggregated three ways (see ``aggregate``); ``seq_mean`` is the paper's;
- advantages can be scaled by the group std (paper), the batch std, or not at all (Dr. GRPO, which
  argues the group std biases updates towards too-easy and too-hard prompts).

Off-policy rollouts (``trainer.system.pipeline=async``, docs/async.md) use the decoupled objective of
AReaL (Fu et al. 2025, after Hilton et al.'s decoupled PPO) with a truncated importance weight (verl's
TIS): per token  -min(w, C) * min(r*A, clip(r, 1-eps_low, 1+eps_high)*A),  r = pi_theta / pi_old,
w = pi_old / pi_behaviour. pi_old is the policy at the start of this update (the "proximal" policy the
clip is about), pi_behaviour the stale copy that sampled, whose log-probs the sampler recorded. Why
this form rather than putting pi_behaviour in the ratio itself: there the clip would be about how far
the sampler lagged, and a token whose stale ratio already lies outside [1-eps, 1+eps] would get no
gradient at all, so staleness would silently throw away learning signal; here the clip bounds this
update alone and the lag is corrected by a weight whose variance the cap C bounds. It costs nothing
here: with mu > 1 pi_old is computed anyway, and with mu = 1 it is the current policy, detached.
With on-policy rollouts pi_old = pi_behaviour, w = 1, and no weight is applied at all. A token no
sampler chose (a lead the trainer wrote for a cold tool domain) has no pi_behaviour: its recorded
log-prob is NaN, its weight 1, and it is left out of the reported lag.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

StdMode = Literal["group", "batch", "none"]
Aggregation = Literal["seq_mean", "token_mean", "constant"]


def group_advantages(rewards: torch.Tensor, std_mode: StdMode = "group", eps: float = 1e-4) -> torch.Tensor:
    """rewards [P, G] -> advantages [P, G]: (r - group mean) / (std + eps) per the chosen std."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if std_mode == "group":
        return centred / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)
    if std_mode == "batch":
        return centred / (rewards.std(unbiased=False) + eps)
    if std_mode == "none":
        return centred
    raise ValueError(f"unknown std_mode {std_mode!r}")


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1, always >= 0."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: Aggregation, max_tokens: int) -> torch.Tensor:
    """Reduce a per-token loss [B, L] to a scalar.

    seq_mean:   mean over each sequence's tokens, then over sequences (original GRPO);
    token_mean: sum over all tokens / number of tokens in the batch (DAPO);
    constant:   sum over all tokens / (B * max_tokens), a fixed normaliser (Dr. GRPO), so no
                sequence's tokens weigh more because the sequence is short.
    """
    mask = mask.to(per_token.dtype)
    if mode == "seq_mean":
        per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_seq.mean()
    if mode == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if mode == "constant":
        return (per_token * mask).sum() / (per_token.shape[0] * max_tokens)
    raise ValueError(f"unknown aggregation {mode!r}")


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    policy_loss: float
    kl: float  # mean per-token k3 KL (0 when beta == 0)
    clip_low_frac: float  # share of tokens whose ratio hit the lower clip with A < 0
    clip_high_frac: float  # share of tokens whose ratio hit the upper clip with A > 0
    entropy: float
    is_truncated_frac: float = 0.0  # share of tokens whose behaviour weight hit the cap (0 when on-policy)


def grpo_loss(
    logp: torch.Tensor,  # [B, L] log-probs of the sampled tokens under the current policy
    old_logp: torch.Tensor,  # [B, L] under the policy that generated them (detached)
    advantages: torch.Tensor,  # [B] one advantage per sequence
    mask: torch.Tensor,  # [B, L] 1 for completion tokens that count in the loss
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    aggregation: Aggregation = "seq_mean",
    max_tokens: int = 1,
    ref_logp: torch.Tensor | None = None,  # [B, L] under the frozen reference model
    beta: float = 0.0,
    entropy: torch.Tensor | None = None,  # [B, L] per-token entropy of the current policy
    entropy_coef: float = 0.0,
    behaviour_logp: torch.Tensor | None = None,  # [B, L] under the (stale) policy that sampled them
    is_cap: float = 2.0,
) -> LossOutput:
    """Clipped surrogate: per token -min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A) (+ beta*KL);
    with ``behaviour_logp``, weighted by min(pi_old / pi_behaviour, is_cap) (see the module's docstring)."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)  # [B, 1] broadcast over tokens
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.min(unclipped, clipped)
    truncated_frac = 0.0
    if behaviour_logp is not None:
        sampled = ~torch.isnan(behaviour_logp)  # NaN: written, not sampled (a lead): weight 1
        weight = torch.where(sampled, torch.exp(old_logp.detach() - behaviour_logp), torch.ones_like(old_logp))
        truncated_frac = _masked_mean((weight > is_cap).to(logp.dtype), mask)
        per_token = weight.clamp(max=is_cap) * per_token
    policy_term = per_token.detach()  # the (weighted) clipped objective alone, before KL and entropy
    kl_value = 0.0
    if beta > 0.0 and ref_logp is not None:
        kl = kl_k3(logp, ref_logp)
        per_token = per_token + beta * kl
        kl_value = _masked_mean(kl, mask)
    if entropy is not None and entropy_coef > 0.0:
        per_token = per_token - entropy_coef * entropy
    loss = aggregate(per_token, mask, aggregation, max_tokens)
    with torch.no_grad():
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).to(logp.dtype)
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).to(logp.dtype)
        policy_only = policy_term
        return LossOutput(
            loss=loss,
            policy_loss=float(aggregate(policy_only, mask, aggregation, max_tokens)),
            kl=kl_value,
            clip_low_frac=_masked_mean(low, mask),
            clip_high_frac=_masked_mean(high, mask),
            entropy=_masked_mean(entropy, mask) if entropy is not None else 0.0,
            is_truncated_frac=truncated_frac,
        )


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    mask = mask.to(values.dtype)
    return float((values.detach() * mask).sum() / mask.sum().clamp(min=1.0))


def behaviour_gap(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float, int]:
    """Sums over the counted tokens of d = log(pi_old / pi_behaviour): (sum d, sum d^2, max |d|, tokens),
    from which a step's spread of the importance log-ratio is reported (and alarmed on)."""
    counted = mask.bool() & ~torch.isnan(behaviour_logp)  # a written token (NaN) did not lag
    d = (old_logp.detach() - behaviour_logp)[counted].double()
    if d.numel() == 0:
        return 0.0, 0.0, 0.0, 0
    return float(d.sum()), float((d * d).sum()), float(d.abs().max()), int(d.numel())
