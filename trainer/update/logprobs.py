"""Log-probabilities (and entropies) of completion tokens, with logits only where they are used.

A causal LM's head turns every position's hidden state into a row of vocabulary logits: for
SmolLM2 that is 49,152 floats per token. The update needs them at the completion positions only,
and only long enough to take a log-softmax, so here the decoder runs once over prompt and
completion, and the head runs over the completion positions in chunks of ``CHUNK_TOKENS``. Under
autograd each chunk is checkpointed: its logits are recomputed in the backward pass instead of
kept, so no [B, L, V] tensor exists for a whole micro-batch, in the forward or the backward (the
head's matrix product runs twice; it is a fifth of a small model's work and less of a larger one's).

Where the head cannot be run apart from the model — a sharded (FSDP) model, whose root gathers the
head's weights in its own forward, or a model without ``get_decoder`` — the model's forward
computes the logits, with ``logits_to_keep`` sparing the prompt positions where the model takes it.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from trainer.models.sharding import is_sharded
from trainer.sampling.rollout import positions, takes_logits_to_keep

CHUNK_TOKENS = 1024  # completion positions per head chunk: 1024 x 49,152 fp32 logits = 200 MB


def sequence_logprobs(
    model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
    with_entropy: bool = False, temperature: float = 1.0, chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, L] of the completion tokens ``sequences[:, prompt_width:]`` (and their
    entropies [B, L] if asked) under the model's distribution at ``temperature``: the one the
    sampler draws from at that temperature. ``chunk_tokens=0`` takes the model's own forward."""
    targets = sequences[:, prompt_width:]  # [B, L]
    split = decoder_and_head(model) if chunk_tokens > 0 else None
    if split is None:
        return _from_logits(model, sequences, attention_mask, prompt_width, with_entropy, temperature)
    decoder, head = split
    hidden = decoder(input_ids=sequences, attention_mask=attention_mask,
                     position_ids=positions(attention_mask)).last_hidden_state  # [B, W + L, H]
    # position t predicts token t+1: completion token j is predicted at prompt_width - 1 + j
    hidden = hidden[:, prompt_width - 1:-1]  # [B, L, H]
    logp, entropy = chunked_head(head, hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1), temperature,
                                 with_entropy, chunk_tokens)
    return logp.view_as(targets), (entropy.view_as(targets) if entropy is not None else None)


def chunked_head(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                 with_entropy: bool, chunk_tokens: int = CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hidden [N, H], targets [N] -> the targets' log-probs [N] (and entropies [N]), the head run
    ``chunk_tokens`` rows at a time; under autograd each chunk's logits are recomputed in the backward."""
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    logps, entropies = [], []
    for start in range(0, max(1, hidden.shape[0]), chunk_tokens):  # one empty chunk when nothing counts
        piece = (head, hidden[start:start + chunk_tokens], targets[start:start + chunk_tokens], temperature,
                 with_entropy)
        logp, entropy = checkpoint(_head_chunk, *piece, use_reentrant=False) if recompute else _head_chunk(*piece)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def _head_chunk(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [N, H], targets [N] -> the targets' log-probs [N] and entropies [N] (empty when not
    asked for)."""
    logp, entropy = pick(head(hidden), targets, temperature, with_entropy)
    return logp, (entropy if entropy is not None else logp.new_empty(0))


def pick(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [..., V], targets [...] -> each target's log-prob [...] under softmax(logits / T), in
    fp32, and each position's entropy [...] if asked."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = logits.log_softmax(dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen, (-(logp.exp() * logp).sum(dim=-1) if with_entropy else None)


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The model's decoder (hidden states out) and its LM head, or None where they cannot be run
    apart. A peft model hands both through to the model it wraps, adapters in place."""
    if is_sharded(model) or not hasattr(model, "get_decoder"):
        return None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except AttributeError:  # a model class without the lookups transformers' models have
        return None
    if decoder is None or decoder is model or not isinstance(head, torch.nn.Module):
        return None
    return decoder, head


def _from_logits(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
                 with_entropy: bool, temperature: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's own forward, its logits kept from the last prompt position on where it can."""
    completion = sequences.shape[1] - prompt_width
    keep = {"logits_to_keep": completion + 1} if takes_logits_to_keep(model) else {}
    logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=positions(attention_mask),
                   **keep).logits
    return pick(logits[:, -(completion + 1):-1, :], sequences[:, prompt_width:], temperature, with_entropy)
