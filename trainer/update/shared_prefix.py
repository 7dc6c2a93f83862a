"""The update's forward with each group's prompt encoded once (the idea of Prefix Grouper, arXiv
2506.05433, in our own layout).

The G completions of a group share one prompt. The plain forward lays out G rows of prompt and
completion and so encodes the prompt G times, forward and backward. Here a micro-batch's rows are
packed by prompt instead: one row per distinct prompt, holding the prompt once and then each
completion after it, with an attention mask that lets a completion see the prompt and its own
earlier tokens and nothing of its siblings, and position ids that restart after the prompt for
each completion. Every completion token then sees exactly the keys and values it sees in the plain
layout, so its log-prob is the same; the prompt's hidden states are computed once and receive the
sum of the gradients the G copies would have received, which is the same gradient. What differs
is float rounding (other matrix shapes), and the cost: a prompt of T tokens with G completions of L
costs T + G·L positions instead of G·(T + L).

Departures from the paper's implementation: completions are cut at their last counted token (the
padding after it predicts nothing that counts), and the mask is an explicit boolean (sdpa) or
additive (eager) tensor, so it needs no attention kernel of its own; models on other attention
implementations take the plain forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.sampling.rollout import distinct_rows
from trainer.update.logprobs import CHUNK_TOKENS, decoder_and_head, chunked_head, sequence_logprobs

PROMPT = -1  # segment id of the prompt's columns
PADDING = -2  # of the columns after a packed row's end


def grouped_logprobs(
    model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
    counted: torch.Tensor, with_entropy: bool = False, temperature: float = 1.0, chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As ``sequence_logprobs`` for the counted tokens (``counted`` [B, L], the loss mask); tokens
    past a row's last counted one get log-prob 0 (and entropy 0)."""
    split = decoder_and_head(model)
    mask_kind = _mask_kind(model)
    if split is None or mask_kind is None:
        return sequence_logprobs(model, sequences, attention_mask, prompt_width, with_entropy, temperature,
                                 chunk_tokens)
    decoder, head = split
    packed = pack_by_prompt(sequences, attention_mask, prompt_width, counted)
    hidden = decoder(input_ids=packed.ids, attention_mask=packed.attention(mask_kind, _dtype(model)),
                     position_ids=packed.positions).last_hidden_state  # [F, S, H]
    picked = hidden.reshape(-1, hidden.shape[-1])[packed.source]  # [N, H]: each predicted token's hidden state
    logp, entropy = chunked_head(head, picked, packed.targets, temperature, with_entropy, chunk_tokens)
    rows, width = counted.shape
    out = logp.new_zeros(rows * width).index_put((packed.slots,), logp).view(rows, width)
    if not with_entropy:
        return out, None
    return out, entropy.new_zeros(rows * width).index_put((packed.slots,), entropy).view(rows, width)


@dataclass
class Packed:
    """A micro-batch packed one row per distinct prompt."""

    ids: torch.Tensor  # [F, S] prompt, then each completion, then padding
    positions: torch.Tensor  # [F, S] 0.. over the prompt, continuing from it in each completion
    segments: torch.Tensor  # [F, S] PROMPT, the completion's index in the row, or PADDING
    source: torch.Tensor  # [N] flat index into [F * S] of the hidden state predicting each token
    targets: torch.Tensor  # [N] those tokens
    slots: torch.Tensor  # [N] flat index into [B * L] of each token in the plain layout

    def attention(self, kind: str, dtype: torch.dtype) -> torch.Tensor:
        """[F, 1, S, S]: a query sees the keys at or before it in the prompt or in its own segment;
        a padding query sees itself only (so no row of the softmax is empty)."""
        width = self.ids.shape[1]
        index = torch.arange(width, device=self.ids.device)
        causal = index.view(1, -1) <= index.view(-1, 1)  # [S, S] key j at or before query i
        query, key = self.segments.unsqueeze(2), self.segments.unsqueeze(1)  # [F, S, 1], [F, 1, S]
        allowed = causal & (key != PADDING) & ((key == PROMPT) | (key == query))
        allowed |= torch.eye(width, dtype=torch.bool, device=self.ids.device) & (query == PADDING)
        allowed = allowed.unsqueeze(1)
        if kind == "bool":
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed,
                                                                                           torch.finfo(dtype).min)


def pack_by_prompt(sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
                   counted: torch.Tensor) -> Packed:
    """Lay the rows out one packed row per distinct prompt (see the module's docstring)."""
    first, family = distinct_rows(sequences[:, :prompt_width])
    seqs, attn, extents = sequences.cpu(), attention_mask.cpu(), _extents(counted)
    packed_ids, packed_pos, packed_seg = [], [], []
    predicted_at, targets, slots = [], [], []  # per completion: (family, columns), tokens, plain-layout slots
    for f, lead in enumerate(first.tolist()):
        prompt = seqs[lead, :prompt_width][attn[lead, :prompt_width].bool()]
        ids, pos, seg = [prompt], [torch.arange(len(prompt))], [torch.full((len(prompt),), PROMPT)]
        column = len(prompt)
        for k, row in enumerate((family.cpu() == f).nonzero().flatten().tolist()):
            n = extents[row]
            if n == 0:
                continue
            completion = seqs[row, prompt_width:prompt_width + n]
            # token j is predicted at the prompt's last column (j = 0), else at the completion's token j - 1
            predicted_at.append((f, torch.cat([torch.tensor([len(prompt) - 1]), torch.arange(column, column + n - 1)])))
            targets.append(completion)
            slots.append(torch.arange(n) + row * counted.shape[1])
            ids.append(completion)
            pos.append(torch.arange(len(prompt), len(prompt) + n))
            seg.append(torch.full((n,), k))
            column += n
        packed_ids.append(torch.cat(ids))
        packed_pos.append(torch.cat(pos))
        packed_seg.append(torch.cat(seg))
    width = max(len(row) for row in packed_ids)
    source = [f * width + columns for f, columns in predicted_at]
    device = sequences.device
    return Packed(_stacked(packed_ids, width, 0).to(device), _stacked(packed_pos, width, 0).to(device),
                  _stacked(packed_seg, width, PADDING).to(device), _joined(source).to(device),
                  _joined(targets).to(device), _joined(slots).to(device))


def _extents(counted: torch.Tensor) -> list[int]:
    """Per row, the columns up to and including its last counted token (0: none counts)."""
    width = counted.shape[1]
    last = torch.where(counted.bool().any(dim=1), width - counted.bool().flip(1).float().argmax(dim=1), 0)
    return last.tolist()


def _stacked(rows: list[torch.Tensor], width: int, fill: int) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def _joined(pieces: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(pieces).long() if pieces else torch.zeros(0, dtype=torch.long)


def _mask_kind(model: torch.nn.Module) -> str | None:
    """The explicit mask the model's attention takes: boolean for sdpa, additive for eager; None
    for other implementations (flash attention takes no such mask)."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    return {"sdpa": "bool", "eager": "additive"}.get(implementation)


def _dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype
