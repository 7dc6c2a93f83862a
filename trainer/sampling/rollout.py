"""Batched sampling with a KV cache: prompts in, completions (tokens, masks, text) out.

A plain sampling loop instead of ``model.generate``: it needs only a forward pass with a cache, so
it works with any causal LM, and it skips generate's per-token processor machinery, which
dominates the cost at the small model sizes we train on CPUs.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers import Cache, DynamicCache


@dataclass
class Rollout:
    sequences: torch.Tensor  # [B, T+L] left-padded prompt, then completion (pad after EOS)
    attention_mask: torch.Tensor  # [B, T+L] 1 on real prompt tokens and on every generated slot
    completion_mask: torch.Tensor  # [B, L] 1 on generated tokens up to and including EOS
    prompt_width: int  # T
    truncated: torch.Tensor  # [B] bool: no EOS within the token budget
    completion_ids: list[list[int]]  # per sequence, generated tokens without EOS/padding
    context: "Context | None" = None  # the rows' keys and values, when the sampler was asked to keep them
    # [B, L] each sampled token's log-prob under the sampling policy at the sampling temperature (the
    # behaviour policy; 0 outside completion_mask), when the sampler was asked for them: the async
    # pipeline's importance weights need the policy that sampled, which has moved on by the update
    logprobs: torch.Tensor | None = None

    @property
    def completion_tokens(self) -> torch.Tensor:  # [B, L]
        return self.sequences[:, self.prompt_width:]


class StopText:
    """A stop string matched on the decoded text, so a row ends at it however the tokens split it.

    A tokenizer without a special token for the closing tag splits it one way on its own
    (``</`` ``tool`` ``_call`` ``>``) and another way after the JSON a model writes before it
    (``}}</`` ``tool`` ...): matching its standalone token ids would miss the second. Only rows
    whose newest token holds the string's last character get their tail decoded."""

    def __init__(self, tokenizer, text: str) -> None:
        last = text[-1:]
        if not (last.isascii() and last.isprintable() and not last.isspace()):
            raise ValueError(f"a stop string must end in a visible ASCII character, not {text!r}")
        self.text, self.decode = text, tokenizer.decode
        # raw token strings keep visible ASCII as is, in byte-level BPE and SentencePiece alike;
        # byte-fallback tokens such as <0x3E> are taken too, which costs a decode and misses nothing
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        enders = [i for i, piece in enumerate(vocab) if piece and last in _as_text(piece)]
        self.enders = torch.tensor(enders, dtype=torch.long)  # moved once to the sampling device

    def hits(self, generated: list[torch.Tensor], live: torch.Tensor) -> torch.Tensor:
        """Which rows [B] (among ``live``) have just completed the stop string."""
        hit = torch.zeros_like(live)
        newest = generated[-1]
        if self.enders.device != newest.device:
            self.enders = self.enders.to(newest.device)
        rows = (torch.isin(newest, self.enders) & live).nonzero().flatten().tolist()
        if rows:
            # every token holds at least one byte of the text, so the match lies within this window
            tails = torch.stack(generated[-len(self.text.encode()):], dim=1)[rows].tolist()
            for row, tail in zip(rows, tails):
                hit[row] = self.text in self.decode(tail, skip_special_tokens=False)
        return hit


def _as_text(piece: str | bytes) -> str:
    return piece.decode("latin-1") if isinstance(piece, bytes) else piece  # tiktoken-style vocabularies


@functools.lru_cache(maxsize=8)
def stop_text(tokenizer, text: str) -> StopText:
    """One StopText per tokenizer and string: building it reads the whole vocabulary (a tokenizer
    that gains tokens later needs a new one; ours are complete once loaded)."""
    return StopText(tokenizer, text)


# Anything called like ``generate`` below: the trainer's own sampler, or the vLLM engine
# (trainer/sampling/vllm_engine.py), which ignores the model argument and samples from its pushed weights.
Sampler = Callable[..., "Rollout"]


def left_pad(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> ids [B, T] and attention mask [B, T], padded on the left."""
    width = max(len(ids) for ids in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, tokens in enumerate(batch):
        ids[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
        mask[row, width - len(tokens):] = 1
    return ids, mask


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on each row's first real token (left padding)."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] -> token ids [B]; temperature 0 means greedy."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p  # keep the smallest nucleus
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return order.gather(-1, choice).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass
class Context:
    """Rows' keys and values kept between two calls of ``generate``: the next turn of a tool
    episode appends the tool's answer to them instead of encoding the whole transcript again."""

    kv: Cache
    mask: torch.Tensor  # [R, S] 1 on the columns that hold one of the row's tokens
    held: list[int]  # [R] how many of the row's transcript tokens the columns hold

    def select(self, rows: list[int]) -> "Context":
        """The context of ``rows`` alone (the episodes still going), in that order; the cache is
        narrowed in place, so this context is not to be used after."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.kv.reorder_cache(index)
        return Context(self.kv, self.mask[index], [self.held[r] for r in rows])


# Finished rows leave the decoding batch once this share of it has finished: dropping them copies
# every layer's keys and values, so it is done in a few large steps rather than one per row.
COMPACT_SHARE = 0.25


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_id: int | Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    stop: StopText | None = None,
    share_prefill: bool = True,
    context: Context | None = None,
    keep_context: bool = False,
    with_logprobs: bool = False,
) -> Rollout:
    """Sample until an end token (``eos_id``: one, or all a model's generation config names), the
    ``stop`` text (e.g. a closing tool-call tag) or the budget. Rows with the same prompt (a
    group's G completions) share one prefill unless ``share_prefill`` is off.

    With ``context`` (rows aligned with ``prompts``) only the tokens of each prompt past what the
    context holds are encoded, and the rollout's prompt part is those new tokens; with
    ``keep_context`` the rollout carries the context for the next call. Rows that finish leave
    the batch (unless the context is kept, which needs them) — the random draws stay those of the
    whole batch, so a seeded call samples the same tokens either way. ``with_logprobs``: the rollout
    carries each sampled token's log-prob, taken from the logits it was drawn from."""
    device = next(model.parameters()).device
    end_ids = torch.tensor(as_ids(eos_id), device=device)
    if context is None:
        ids, prompt_mask = (t.to(device) for t in left_pad(prompts, pad_id))
        kv: Cache = DynamicCache()
        logits, distinct, inverse = prefill(model, ids, prompt_mask, kv, share=share_prefill)
        if len(distinct) < len(prompts):
            kv.reorder_cache(inverse)  # every row gets its prompt's keys and values
        mask = prompt_mask
    else:
        ids, prompt_mask, logits = extend(model, context, prompts, pad_id)
        kv, mask = context.kv, torch.cat([context.mask, prompt_mask], dim=1)
    decoded = _decode(model, kv, mask, logits, end_ids, pad_id, max_new_tokens, temperature, top_p, generator, stop,
                      compact=not keep_context, with_logprobs=with_logprobs)
    rollout = assemble(ids, prompt_mask, decoded.completion, decoded.lengths, decoded.finished, eos_id)
    if decoded.logprobs is not None:
        rollout.logprobs = decoded.logprobs * rollout.completion_mask
    if keep_context:
        rollout.context = _carried(decoded, prompt_mask, context)
    return rollout


@dataclass
class _Decoded:
    completion: torch.Tensor  # [B, L] sampled tokens, pad after each row's end
    lengths: torch.Tensor  # [B] counted tokens per row
    finished: torch.Tensor  # [B] bool: ended within the budget
    kv: Cache
    mask: torch.Tensor  # [B, S] the cache's columns (without compaction)
    logprobs: torch.Tensor | None = None  # [B, L] the sampled tokens' log-probs, when asked for


def _decode(model: torch.nn.Module, kv: Cache, mask: torch.Tensor, logits: torch.Tensor, end_ids: torch.Tensor,
            pad_id: int, max_new_tokens: int, temperature: float, top_p: float, generator: torch.Generator | None,
            stop: StopText | None, compact: bool, with_logprobs: bool = False) -> _Decoded:
    """The sampling loop from the prompts' next-token ``logits`` [B, V]. The cache holds the rows
    in ``live``; sampling always draws for all B rows (a finished row's draw is thrown away), so
    the generator's stream does not depend on when rows leave."""
    batch, device = logits.shape[0], logits.device
    cache = {cache_keyword(model): kv}
    live = torch.arange(batch, device=device)  # the full batch's rows that the cache holds
    next_pos = positions(mask)[:, -1] + 1  # [live]
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    lengths = torch.full((batch,), max_new_tokens, dtype=torch.long, device=device)
    generated: list[torch.Tensor] = []
    chosen_logp: list[torch.Tensor] = []
    for t in range(max_new_tokens):
        token = sample_next(logits, temperature, top_p, generator)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        generated.append(token)
        if with_logprobs:  # the update's own formula (logprobs.pick): log-softmax of logits / T, top_p not applied
            scaled = logits.float() / (temperature if temperature > 0 else 1.0)
            chosen_logp.append(scaled.log_softmax(dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1))
        ends = torch.isin(token, end_ids)
        if stop is not None:
            ends |= stop.hits(generated, ~finished)
        newly = ends & ~finished
        lengths = torch.where(newly, torch.full_like(lengths, t + 1), lengths)
        finished |= newly
        if bool(finished.all()) or len(generated) == max_new_tokens:
            break
        if compact and int(finished[live].sum()) >= max(1, COMPACT_SHARE * len(live)):
            keep = (~finished[live]).nonzero().flatten()
            kv.reorder_cache(keep)
            live, mask, next_pos = live[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=device)], dim=1)
        out = model(input_ids=token[live].unsqueeze(1), attention_mask=mask, position_ids=next_pos.unsqueeze(1),
                    use_cache=True, **cache)
        if len(live) == batch:
            logits = out.logits[:, -1, :]
        else:  # the rows that left keep their last logits: their draws are thrown away
            logits[live] = out.logits[:, -1, :]
        next_pos = next_pos + 1
    completion = torch.stack(generated, dim=1)  # [B, L]
    logprobs = torch.stack(chosen_logp, dim=1) if with_logprobs else None
    return _Decoded(completion, lengths.clamp(max=completion.shape[1]), finished, kv, mask, logprobs)


def extend(model: torch.nn.Module, context: Context, transcripts: list[list[int]], pad_id: int,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode each transcript's tokens past what ``context`` holds into its cache; returns those
    new tokens [R, W] and their mask (left-padded), and each row's next-token logits [R, V]."""
    new = [tokens[held:] for tokens, held in zip(transcripts, context.held)]
    if not all(new):
        raise ValueError("a transcript continued from a context must add at least one token")
    device = context.mask.device
    ids, new_mask = (t.to(device) for t in left_pad(new, pad_id))
    mask = torch.cat([context.mask, new_mask], dim=1)
    logits = last_logits(model, ids, mask, positions(mask)[:, -ids.shape[1]:], context.kv)
    return ids, new_mask, logits


def _carried(decoded: _Decoded, new_mask: torch.Tensor, before: Context | None) -> Context:
    """The context after a call: the sampled tokens that were fed to the model (all but the last
    sampled column) count up to each row's length; a finished row's later columns are masked out."""
    fed = decoded.completion.shape[1] - 1  # the last sampled token never went through the model
    base = decoded.mask.shape[1] - fed
    columns = torch.arange(fed, device=decoded.mask.device)
    mask = decoded.mask.clone()
    mask[:, base:] = (columns.unsqueeze(0) < decoded.lengths.unsqueeze(1)).to(mask.dtype)
    previously = before.held if before is not None else [0] * len(new_mask)
    held = [h + new + min(length, fed) for h, new, length in
            zip(previously, new_mask.sum(dim=1).tolist(), decoded.lengths.tolist())]
    return Context(decoded.kv, mask, held)


def distinct_rows(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first row of each distinct prompt [U], and for every row the index of its prompt among
    them [B]: ``ids[distinct][inverse] == ids``."""
    index: dict[tuple[int, ...], int] = {}
    distinct, inverse = [], []
    for row, tokens in enumerate(map(tuple, ids.tolist())):
        if tokens not in index:
            index[tokens] = len(distinct)
            distinct.append(row)
        inverse.append(index[tokens])
    return torch.tensor(distinct, device=ids.device), torch.tensor(inverse, device=ids.device)


def prefill(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, kv: Cache, share: bool = True,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over the prompts into ``kv``, each distinct prompt once (``share``): the G rows
    of a group repeat one prompt, so a group's prefill costs one row instead of G. Returns every
    row's next-token logits [B, V], the rows ``kv`` holds [U] and each row's index among them [B]."""
    distinct, inverse = distinct_rows(ids) if share else (torch.arange(len(ids), device=ids.device),) * 2
    rows = mask[distinct]
    return last_logits(model, ids[distinct], rows, positions(rows), kv)[inverse], distinct, inverse


def last_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                kv: Cache) -> torch.Tensor:
    """Encode ``ids`` [R, W] into ``kv`` (``mask`` covers the cache's columns and these); the
    next-token logits [R, V], the head run at the last position only where the model allows."""
    keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                **{cache_keyword(model): kv}, **keep)
    return out.logits[:, -1, :]


def cache_keyword(model: torch.nn.Module) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache``; accept either generation."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the model's forward computes logits for the last positions only when asked (most
    transformers models since 4.45 do; a peft wrapper passes the keyword through)."""
    forward = getattr(model, "get_base_model", lambda: model)().forward
    return "logits_to_keep" in inspect.signature(forward).parameters


def as_ids(eos_id: int | Sequence[int]) -> tuple[int, ...]:
    """End tokens given as one id or several."""
    return (int(eos_id),) if isinstance(eos_id, int) else tuple(int(i) for i in eos_id)


def assemble(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor, lengths: torch.Tensor,
             ended: torch.Tensor, eos_id: int | Sequence[int]) -> Rollout:
    """Package sampled tokens: the first ``lengths[b]`` tokens of row b count (EOS included —
    ending is a choice the policy made); rows that never ``ended`` are truncated."""
    ends = set(as_ids(eos_id))
    width = completion.shape[1]
    completion_mask = (torch.arange(width, device=completion.device).unsqueeze(0) < lengths.unsqueeze(1)).long()
    attention = torch.cat([prompt_mask, torch.ones_like(completion)], dim=1)
    token_lists = [
        [tok for tok in row[:n] if tok not in ends]
        for row, n in zip(completion.tolist(), lengths.tolist())
    ]
    return Rollout(
        sequences=torch.cat([prompt_ids, completion], dim=1), attention_mask=attention,
        completion_mask=completion_mask, prompt_width=prompt_ids.shape[1], truncated=~ended,
        completion_ids=token_lists,
    )
