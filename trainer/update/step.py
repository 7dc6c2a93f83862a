"""The policy update of one GRPO step: ``mu`` passes of the clipped objective over the step's rows
in micro-batches, plus the SFT blend's supervised loss; one optimizer step per pass.

It owns the whole loss normaliser. With several ranks each trains on its contiguous share of the
rows and weights every loss term by its share of the *whole step's* normaliser — tokens for
token_mean, sequences for seq_mean and constant, reference tokens for the SFT blend — so the
gradients summed over the ranks are the one-process gradient, and so are the summed statistics.
Needs a model and an optimizer, no store or verifier pool, so a test can call it on its own.

Rows that carry their sampler's log-probs (``Rollout.logprobs``: the async pipeline's, sampled by a
policy one update old) are weighted by the truncated importance weight of ``losses.grpo_loss``, and
the update reports the spread of log(pi_old / pi_behaviour) over the trained tokens (``async/*``).
"""
from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

from domains.api import Domain, Task
from trainer.config import TrainerConfig
from trainer.models.sharding import is_sharded, join_passes, total_norm
from trainer.distributed import World
from trainer.update.supervised import reference_pairs, supervised_loss
from trainer.sampling.rollout import Rollout
from trainer.update.logprobs import sequence_logprobs
from trainer.update.losses import behaviour_gap, grpo_loss
from trainer.update.reference import Reference
from trainer.update.shared_prefix import grouped_logprobs

# A row whose |advantage| is below this adds nothing to the policy loss (see rows_to_train).
_NO_ADVANTAGE = 1e-6


@dataclass
class SFTBlend:
    """This rank's reference examples for the SFT blend and their share of the step's reference
    tokens (the supervised loss is a token mean over all of them)."""

    pairs: list
    share: float
    pad_id: int  # the tokenizer's, for the examples' batches


def blend_for_rank(tokenizer, domains: dict[str, Domain], tasks: list[Task], lo: int, hi: int) -> SFTBlend | None:
    """The blend of tasks[lo:hi] — the blend splits the step's tasks, not its rows, so each task's
    references go to one rank — or None when no task of the step has a reference."""
    per_task = [reference_pairs(tokenizer, [task], domains) for task in tasks]
    tokens = [sum(sum(mask) for *_, mask in pairs) for pairs in per_task]
    if not sum(tokens):
        return None
    return SFTBlend([pair for pairs in per_task[lo:hi] for pair in pairs], sum(tokens[lo:hi]) / sum(tokens),
                    tokenizer.pad_token_id)


def rows_to_train(advantages: torch.Tensor, skip_zero_advantage: bool) -> torch.Tensor:
    """Which rows of the step enter the update (a bool per row).

    A row whose advantage is zero (mostly: its group's rewards all agree) adds nothing to the
    policy loss; with ``skip_zero_advantage`` it is left out, and so is its forward, backward and
    reference pass. The loss keeps the whole step's normaliser, so the gradient is unchanged when
    beta and entropy_coef are 0; otherwise those rows' KL and entropy terms go too, and the KL
    anchor holds only where the policy is still learning. The tolerance catches rows of a varied
    group of partial rewards whose advantage is zero up to float error."""
    if not skip_zero_advantage:
        return torch.ones_like(advantages, dtype=torch.bool)
    return advantages.abs() > _NO_ADVANTAGE


def padding_bounds(attn: torch.Tensor, mask: torch.Tensor | None, prompt_width: int) -> tuple[int, int]:
    """Columns a micro-batch can drop: the prompt padding every row shares on the left, and (given
    the loss mask) the completion columns after its last counted token. Batches that mix short
    math answers with long tool episodes would otherwise pay for the longest row everywhere."""
    real = attn[:, :prompt_width].any(dim=0).nonzero()
    left = int(real[0]) if len(real) else 0
    if mask is None:
        return left, attn.shape[1] - prompt_width
    counted = mask.any(dim=0).nonzero()
    right = int(counted[-1]) + 1 if len(counted) else 1
    return left, right


class PolicyUpdate:
    """Applies GRPO updates to ``model`` with ``optimizer``; ``reference`` anchors the KL term."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_schedule, settings: TrainerConfig,
                 *, reference: Reference | None = None, world: World | None = None,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 alarm: Callable[[str], None] = print) -> None:
        self.model, self.optimizer, self.lr_schedule, self.settings = model, optimizer, lr_schedule, settings
        self.reference, self.world, self.autocast, self.alarm = reference, world or World(), autocast, alarm

    def __call__(self, rollout: Rollout, advantages: torch.Tensor, blend: SFTBlend | None = None) -> dict[str, float]:
        """Train on ``rollout`` ([B, L] rows) with ``advantages`` [B]; returns the update's statistics."""
        t, device = self.settings, next(self.model.parameters()).device
        mask = rollout.completion_mask.float()
        if t.loss.mask_truncated:
            mask[rollout.truncated] = 0.0
        step_rows, total_tokens = mask.shape[0], float(mask.sum().clamp(min=1.0))  # the whole step's
        trained = rows_to_train(advantages, t.loss.skip_zero_advantage).nonzero().flatten()
        # kl, entropy and the clip fractions are reported as means over the rows trained on
        stat_rows, stat_tokens = max(1, len(trained)), float(mask[trained].sum().clamp(min=1.0))
        first, last = self.world.share(len(trained))
        mine = trained[first:last]  # this rank's rows: an even share of those trained on
        rows = _Rows(rollout.sequences[mine].to(device), rollout.attention_mask[mine].to(device),
                     mask[mine].to(device), advantages[mine].to(device), rollout.prompt_width,
                     rollout.logprobs[mine].to(device) if rollout.logprobs is not None else None)
        chunks = [slice(i, min(i + t.optim.micro_batch_size, len(mine))) for i in range(0, len(mine), t.optim.micro_batch_size)]
        old_logp = self.frozen_logprobs(self.model, rows, chunks) if t.optim.mu > 1 else None
        ref_logp = self.reference_logprobs(rows, chunks) if self.reference is not None else None
        norm = _Normaliser(t.loss.aggregation, step_rows, total_tokens, stat_rows, stat_tokens)
        stats: dict[str, float] = defaultdict(float)
        grad_norm = 0.0
        gap = [0.0, 0.0, 0.0, 0]  # sum, sum of squares, max |.| and count of log(pi_old / pi_behaviour)
        for rep in range(t.optim.mu):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in chunks:
                self._policy_loss(rows, mb, old_logp, ref_logp, norm, stats, gap if rep == 0 else None)
            self._join_others(self.model, len(chunks), backward=True)
            blended = blend is not None and bool(blend.pairs)
            if blended:
                sft = supervised_loss(self.model, blend.pairs, blend.pad_id)
                (t.loss.sft_coef * blend.share * sft).backward()
                stats["sft_loss"] += sft.item() * blend.share / t.optim.mu
            self._join_others(self.model, int(blended), backward=True)
            grad_norm += self.optimizer_step() / t.optim.mu
        # a step that trained no row measured no KL or entropy: those keys stay out (not zeros)
        keys = ["loss", "policy_loss"] + (["kl", "clip_low_frac", "clip_high_frac", "entropy"] if len(trained) else [])
        update = self.world.sum_floats(stats, keys + (["sft_loss"] if blend is not None else []))
        update.update(grad_norm=grad_norm, lr=self.lr_schedule.get_last_lr()[0], trained_row_share=len(trained) / step_rows)
        if rows.behav is not None:
            update.update(_gap_metrics(gap, stats))
        self.lr_schedule.step()
        return update

    def _policy_loss(self, rows: "_Rows", mb: slice, old_logp, ref_logp, norm: "_Normaliser",
                     stats: dict[str, float], gap: list | None = None) -> None:
        """One micro-batch's clipped-objective loss, backpropagated with its weight in the step."""
        t = self.settings
        weight, stat_weight = norm.weights(rows.mask[mb])
        left, right = padding_bounds(rows.attn[mb], rows.mask[mb], rows.prompt_width)
        columns = slice(left, rows.prompt_width + right)
        with self.autocast():
            logp, entropy = self.logprobs(self.model, rows.seqs[mb, columns], rows.attn[mb, columns],
                                          rows.prompt_width - left, rows.mask[mb, :right], with_entropy=True)
        # pi_old, the policy at the update's start: computed before the passes when there are several
        old = old_logp[mb, :right] if old_logp is not None else logp.detach()
        behav = rows.behav[mb, :right] if rows.behav is not None else None
        out = grpo_loss(
            logp, old, rows.adv[mb], rows.mask[mb, :right],
            eps_low=t.loss.eps_low, eps_high=t.loss.eps_high, aggregation=t.loss.aggregation, max_tokens=t.sampling.max_new_tokens,
            ref_logp=ref_logp[mb, :right] if ref_logp is not None else None, beta=t.loss.beta,
            entropy=entropy if t.loss.entropy_coef > 0 else entropy.detach(), entropy_coef=t.loss.entropy_coef,
            behaviour_logp=behav, is_cap=t.loss.behaviour_is_cap,
        )
        if behav is not None:
            stats["is_truncated_frac"] += out.is_truncated_frac * stat_weight / t.optim.mu
            if gap is not None:  # measured once, on the first pass, where pi_old is the policy itself
                for i, value in enumerate(behaviour_gap(old, behav, rows.mask[mb, :right])):
                    gap[i] = max(gap[i], value) if i == 2 else gap[i] + value
        (out.loss * weight).backward()
        for key in ("kl", "clip_low_frac", "clip_high_frac", "entropy"):
            stats[key] += getattr(out, key) * stat_weight / t.optim.mu
        stats["policy_loss"] += out.policy_loss * weight / t.optim.mu
        stats["loss"] += out.loss.item() * weight / t.optim.mu

    def optimizer_step(self) -> float:
        """Sum the ranks' gradients, clip, step; a non-finite gradient norm skips the step (and says so)."""
        if not is_sharded(self.model):  # a sharded model's backward has summed them already
            self.world.sum_gradients(self.model)  # each rank's share of the step's gradient -> the whole
        grad_norm = total_norm(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.optim.grad_clip))
        if not math.isfinite(grad_norm):
            # A NaN/inf gradient would poison the weights; skip this update and say so.
            self.alarm(f"alarm: non-finite gradient norm ({grad_norm}); update skipped")
            self.optimizer.zero_grad(set_to_none=True)
            return float("nan")
        self.optimizer.step()
        return grad_norm

    def reference_logprobs(self, rows: "_Rows", chunks: list[slice]) -> torch.Tensor:
        with self.reference.running() as model:
            return self.frozen_logprobs(model, rows, chunks)

    @torch.no_grad()
    def frozen_logprobs(self, model: torch.nn.Module, rows: "_Rows", chunks: list[slice]) -> torch.Tensor:
        """Log-probs [B, L] under a frozen model (old policy or reference), micro-batch by micro-batch."""
        out = torch.zeros(rows.seqs.shape[0], rows.seqs.shape[1] - rows.prompt_width, device=rows.seqs.device)
        runs_on = next(model.parameters()).device  # a reference kept on the CPU runs there
        with self.autocast():
            for mb in chunks:
                left = padding_bounds(rows.attn[mb], None, rows.prompt_width)[0]
                out[mb] = self.logprobs(model, rows.seqs[mb, left:].to(runs_on), rows.attn[mb, left:].to(runs_on),
                                        rows.prompt_width - left, rows.mask[mb].to(runs_on))[0].to(out.device)
        self._join_others(model, len(chunks), backward=False)
        return out

    def logprobs(self, model: torch.nn.Module, seqs: torch.Tensor, attn: torch.Tensor, prompt_width: int,
                 counted: torch.Tensor, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [b, L] (and entropies) of a micro-batch's completion tokens at the sampling
        temperature; with ``shared_prefix`` each group's prompt is encoded once."""
        temperature = self.settings.sampling.temperature
        if self.settings.optim.shared_prefix:
            return grouped_logprobs(model, seqs, attn, prompt_width, counted, with_entropy=with_entropy,
                                    temperature=temperature)
        return sequence_logprobs(model, seqs, attn, prompt_width, with_entropy=with_entropy, temperature=temperature)

    def _join_others(self, model: torch.nn.Module, passes: int, backward: bool) -> None:
        """A sharded model's forwards (and backwards) are collectives: after its own ``passes``,
        this rank joins as many more as the busiest rank made (a no-op for a plain model)."""
        if is_sharded(model) and self.world.size > 1:
            join_passes(model, self.world.most(passes) - passes, backward)


@dataclass
class _Rows:
    """This rank's rows of the step, on the model's device."""

    seqs: torch.Tensor  # [B, W + L] prompt and completion ids
    attn: torch.Tensor  # [B, W + L]
    mask: torch.Tensor  # [B, L] completion tokens that count in the loss
    adv: torch.Tensor  # [B]
    prompt_width: int  # W
    behav: torch.Tensor | None = None  # [B, L] the sampler's log-probs (async pipeline), else None


def _gap_metrics(gap: list, stats: dict[str, float]) -> dict[str, float]:
    """The step's ``async/*`` metrics: the spread of log(pi_old / pi_behaviour) over the trained
    tokens, the share of weights that hit the cap, and the share of tokens the clip held."""
    total, squares, largest, n = gap
    mean = total / n if n else 0.0
    return {"async/log_ratio_mean": mean, "async/log_ratio_std": math.sqrt(max(squares / n - mean * mean, 0.0)) if n else 0.0,
            "async/log_ratio_max": largest, "async/is_truncated_frac": stats.get("is_truncated_frac", 0.0),
            "async/clip_frac": stats.get("clip_low_frac", 0.0) + stats.get("clip_high_frac", 0.0)}


@dataclass
class _Normaliser:
    """A micro-batch's weight in the step's loss and in its reported statistics."""

    aggregation: str
    step_rows: int  # rows of the whole step (all ranks)
    total_tokens: float  # counted completion tokens of the whole step
    stat_rows: int  # rows trained on
    stat_tokens: float  # their counted tokens

    def weights(self, mask: torch.Tensor) -> tuple[float, float]:
        if self.aggregation == "token_mean":
            tokens = float(mask.sum())
            return tokens / self.total_tokens, tokens / self.stat_tokens
        rows = mask.shape[0]
        return rows / self.step_rows, rows / self.stat_rows
