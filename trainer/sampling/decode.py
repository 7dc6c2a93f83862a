"""The trainer's sampler at GPU speed: a static KV cache, and the decode step recorded as a CUDA graph.

On a GPU, decoding a small model one token at a time is bound by kernel launches, not arithmetic:
each step launches about a thousand kernels that finish faster than the host can issue them. Here
each shape bucket (rows rounded up to a power of two, prompt width and token budget to a multiple
of 64) gets a static KV cache and one recorded decode step — forward, sampling and bookkeeping —
replayed once per token. Nothing in that step talks to the host: sampling is Gumbel-max over noise
hashed from (seed, token index, row, token id) instead of ``torch.multinomial``, end tokens are
checked on the device, and the host reads the finished rows (and looks for a stop text in the
decoded tokens) only every ``sync_every`` tokens. A group's prompt is prefilled once.

A recorded step reads the weights by address, so an optimizer step (in place) is seen by the next
replay; anything that gives the model new tensors — a dtype change, a state dict loaded by
assignment, LoRA adapters switched or merged — changes ``weights_key`` and the sampler records its
steps again. On the CPU the same loop runs eagerly (there is nothing to record); the trainer's CPU
default stays ``trainer.sampling.rollout.generate``, whose random draws the main job's results rest on.
"""
from __future__ import annotations

import itertools
import sys
from collections import OrderedDict
from typing import NamedTuple, Sequence

import torch
from transformers import DynamicCache, StaticCache

from trainer.sampling.rollout import (Rollout, StopText, as_ids, assemble, cache_keyword, generate, left_pad, positions,
                                      prefill)

BUCKET = 64  # prompt widths and token budgets are rounded up to a multiple of this
MIN_ROWS = 8  # rows are rounded up to a power of two, at least this
# recorded shapes kept at once, the least recently used dropped first: each holds a KV cache, and tool
# episodes alone visit a few (their prompts grow and their live rows shrink turn by turn)
MAX_BUCKETS = 16
_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply) on int64 tensors holding values below 2**32; the
    multipliers stay below 2**31, so no product leaves int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _MASK32
    return x ^ (x >> 16)


def hashed_uniform(counter: torch.Tensor, seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """Uniform noise in (0, 1), float32, shaped like ``counter`` (distinct int64 values below
    2**32, one per row and token id): a pure function of the seed and the token index, so it can
    run inside a recorded graph and a seeded call repeats exactly."""
    key = _mix32(_mix32(seed & _MASK32) ^ (step & _MASK32))
    bits = _mix32(_mix32(counter ^ key) ^ _mix32(key ^ 0x2545F491))
    return ((bits >> 8).float() + 0.5) / float(1 << 24)


def pick_tokens(logits: torch.Tensor, temperature: float, top_p: float, counter: torch.Tensor,
                seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> token ids [B], sampled from softmax(logits / T) within the top-p nucleus by
    Gumbel-max: argmax(log p + G) with G = -log(-log U) is an exact draw from p; temperature 0 is
    greedy."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    gumbel = -torch.log(-torch.log(hashed_uniform(counter, seed, step)))
    logits = logits.float() / temperature
    if top_p >= 1.0:
        return (logits + gumbel).argmax(dim=-1)
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p  # the same nucleus as sample_next
    scores = sorted_probs.log().masked_fill(outside, float("-inf")) + gumbel
    return order.gather(-1, scores.argmax(dim=-1, keepdim=True)).squeeze(-1)


def weights_key(model: torch.nn.Module) -> int:
    """What a recorded step depends on besides the values: every parameter's and buffer's address,
    dtype and shape, and the state of LoRA layers (peft's tuner layers carry ``merged``)."""
    tensors = tuple((t.data_ptr(), t.dtype, tuple(t.shape)) for t in itertools.chain(model.parameters(), model.buffers()))
    adapters = tuple((m.merged, m.disable_adapters, str(m.active_adapters))
                     for m in model.modules() if hasattr(m, "merged") and hasattr(m, "disable_adapters"))
    return hash((tensors, adapters))


class Shape(NamedTuple):
    """What a recorded decode step is specialised to."""

    rows: int
    width: int  # prompt columns of the cache
    budget: int  # generated columns of the cache
    kv_dtypes: tuple[torch.dtype, torch.dtype]  # keys', values'
    temperature: float
    top_p: float
    autocast: torch.dtype | None  # the autocast dtype the step was recorded under, if any
    end_ids: tuple[int, ...]
    pad_id: int

    @classmethod
    def of(cls, rows: int, width: int, budget: int, kv_dtypes: tuple[torch.dtype, torch.dtype], temperature: float,
           top_p: float, device: torch.device, end_ids: tuple[int, ...], pad_id: int) -> "Shape":
        up = lambda n: -(-n // BUCKET) * BUCKET  # noqa: E731
        cast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
        return cls(max(MIN_ROWS, 1 << (rows - 1).bit_length()), up(width), up(budget), kv_dtypes, temperature, top_p,
                   cast, end_ids, pad_id)


class PrefillTypedCache(StaticCache):
    """A StaticCache that stores each decode step's keys and values in the dtypes the prefill left.

    Under CUDA autocast the decode step's keys can come out in bf16 while the prefill's are fp32 (seen
    on an H200, transformers 5.17); the eager sampler's DynamicCache concatenates the two, which
    promotes to fp32, but a static cache writes in place and refuses mixed dtypes. Casting on write
    keeps what the eager sampler keeps."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        if isinstance(getattr(layer, "keys", None), torch.Tensor):  # allocated (by the prefill's copy)
            key_states, value_states = key_states.to(layer.keys.dtype), value_states.to(layer.values.dtype)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class DecodeState:
    """Everything one decode step reads and writes, at fixed addresses, for one Shape."""

    def __init__(self, model: torch.nn.Module, shape: Shape, kv: DynamicCache, vocab: int, device: torch.device):
        rows, length, pad_id = shape.rows, shape.width + shape.budget, shape.pad_id
        self.model, self.shape, self.pad_id = model, shape, pad_id
        self.end_ids = torch.tensor(shape.end_ids, device=device)
        self.cache = PrefillTypedCache(config=model.config, max_cache_len=length)
        for static, layer in zip(self.cache.layers, kv.layers):
            # shaped and typed after the prefill's: under autocast the rotary embedding leaves keys in
            # fp32 and values in bf16
            static.lazy_initialization(layer.keys[:1].expand(rows, -1, -1, -1), layer.values[:1].expand(rows, -1, -1, -1))
        self.token = torch.full((rows, 1), pad_id, dtype=torch.long, device=device)
        self.position = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.mask = torch.ones((rows, length), dtype=torch.long, device=device)
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)
        self.out = torch.full((rows, shape.budget), pad_id, dtype=torch.long, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)  # the column the next token goes to
        self.seed = torch.zeros((), dtype=torch.long, device=device)
        self.counter = torch.arange(rows * vocab, dtype=torch.long, device=device).view(rows, vocab)
        self.cache_keyword = cache_keyword(model)
        self.graph: torch.cuda.CUDAGraph | None = None

    def load(self, kv: DynamicCache, rows: torch.Tensor, prompt_mask: torch.Tensor, seed: int) -> None:
        """Start a generation: row b's prompt is ``kv``'s row ``rows[b]``, right-aligned in the
        prompt columns; the rows past the batch repeat its first and start finished."""
        batch, width = prompt_mask.shape
        fill = torch.cat([rows, rows[:1].expand(self.shape.rows - batch)])
        start = self.shape.width - width
        for static, layer in zip(self.cache.layers, kv.layers):
            static.keys[:, :, start:self.shape.width] = layer.keys[fill]
            static.values[:, :, start:self.shape.width] = layer.values[fill]
            static.cumulative_length.fill_(self.shape.width)
        masks = torch.cat([prompt_mask, prompt_mask[:1].expand(self.shape.rows - batch, -1)])
        self.mask.fill_(1)
        self.mask[:, :start] = 0
        self.mask[:, start:self.shape.width] = masks
        self.position.copy_(positions(masks)[:, -1:] + 1)
        self.finished.fill_(False)
        self.finished[batch:] = True
        self.out.fill_(self.pad_id)
        self.step.zero_()
        self.seed.fill_(seed)

    def advance(self, logits: torch.Tensor) -> None:
        """Sample the next token of every row from ``logits`` [rows, V] and record it."""
        token = pick_tokens(logits, self.shape.temperature, self.shape.top_p, self.counter, self.seed, self.step)
        token = torch.where(self.finished, torch.full_like(token, self.pad_id), token)
        self.out.index_copy_(1, self.step.view(1), token.unsqueeze(1))
        self.finished |= torch.isin(token, self.end_ids)
        self.token.copy_(token.unsqueeze(1))
        self.step.add_(1)

    def decode_step(self) -> None:
        """One token for every row: the forward of the last token, then ``advance``."""
        out = self.model(input_ids=self.token, attention_mask=self.mask, position_ids=self.position, use_cache=True,
                         **{self.cache_keyword: self.cache})
        self.position.add_(1)
        self.advance(out.logits[:, -1, :])

    def record(self) -> None:
        """Capture ``decode_step`` as a CUDA graph (after warm-up runs on a side stream, as capture
        requires); autocast's weight-cast cache is off inside, so each replay casts the current
        weights. The warm-up's writes are undone by the next ``load``."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.decode_step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), self._uncached_autocast():
            self.decode_step()

    def _uncached_autocast(self):
        device = self.end_ids.device.type
        return torch.autocast(device, dtype=self.shape.autocast or torch.float32, enabled=self.shape.autocast is not None,
                              cache_enabled=False)

    def run_step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.decode_step()


class CapturedSampler:
    """Called like ``trainer.sampling.rollout.generate``; keeps a few recorded shapes between calls."""

    def __init__(self, sync_every: int = 8, capture: bool | None = None) -> None:
        self.sync_every = sync_every
        self.capture = capture  # None: on CUDA devices
        self.states: OrderedDict[Shape, DecodeState] = OrderedDict()
        self.weights: int | None = None
        self.recordings = 0  # how many states were built (and, on CUDA, captured): tests read it
        self.unrecordable: str | None = None  # why recording failed, after which generate samples

    def __call__(self, model: torch.nn.Module, prompts: list[list[int]], **kwargs) -> Rollout:
        if self.unrecordable is None:
            try:
                return self.sample(model, prompts, **kwargs)
            except CaptureFailed:
                pass
        return generate(model, prompts, **kwargs)

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompts: list[list[int]], *, max_new_tokens: int,
               eos_id: int | Sequence[int], pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
               generator: torch.Generator | None = None, stop: StopText | None = None) -> Rollout:
        device = next(model.parameters()).device
        ids, prompt_mask = (t.to(device) for t in left_pad(prompts, pad_id))
        kv = DynamicCache()
        logits, _, inverse = prefill(model, ids, prompt_mask, kv)
        kv_dtypes = (kv.layers[0].keys.dtype, kv.layers[0].values.dtype)
        shape = Shape.of(len(prompts), ids.shape[1], max_new_tokens, kv_dtypes, temperature, top_p, device,
                         as_ids(eos_id), pad_id)
        state = self._state(model, shape, kv, logits.shape[-1], device)
        state.load(kv, inverse, prompt_mask, _seed_from(generator, device))
        state.advance(torch.cat([logits, logits[:1].expand(shape.rows - len(prompts), -1)]))
        stopped = self._decode(state, len(prompts), max_new_tokens, stop)
        completion = state.out[:len(prompts)]
        lengths, ended = _lengths(completion, stopped, state.end_ids, max_new_tokens)
        width = int(lengths.max()) if bool(ended.all()) else max_new_tokens  # as wide as generate's
        counted = torch.arange(width, device=device) < lengths.unsqueeze(1)
        completion = torch.where(counted, completion[:, :width], torch.full_like(completion[:, :width], pad_id))
        return assemble(ids, prompt_mask, completion, lengths, ended, eos_id)

    def _decode(self, state: DecodeState, batch: int, max_new_tokens: int, stop: StopText | None) -> torch.Tensor:
        """Run decode steps until every row has finished or the budget is spent; returns, per row,
        the length at which the stop text completed (0: never)."""
        stopped = torch.zeros(batch, dtype=torch.long)
        checked = 0
        for made in range(1, max_new_tokens + 1):
            if made % self.sync_every == 0 or made == max_new_tokens:
                if stop is not None:
                    checked = _find_stops(state, stop, stopped, checked, made)
                if bool(state.finished[:batch].all()):
                    break
            if made < max_new_tokens:
                state.run_step()
        return stopped

    def _record(self, state: DecodeState) -> None:
        try:
            state.record()
        except Exception as exc:  # capture fails in many ways (a host sync in a model's forward, ...)
            self.unrecordable = f"{type(exc).__name__}: {exc}".splitlines()[0]
            print(f"note: the captured sampler could not record a decode step ({self.unrecordable}); "
                  "sampling with the eager sampler from now on", file=sys.stderr)
            self.states.clear()
            raise CaptureFailed from exc

    def _state(self, model: torch.nn.Module, shape: Shape, kv: DynamicCache, vocab: int,
               device: torch.device) -> DecodeState:
        key = weights_key(model)
        if key != self.weights:  # new tensors: every recorded step would read the old ones
            self.states.clear()
            self.weights = key
        state = self.states.get(shape)
        if state is None:
            state = DecodeState(model, shape, kv, vocab, device)
            if device.type == "cuda" if self.capture is None else self.capture:
                self._record(state)
            self.recordings += 1
            self.states[shape] = state
            while len(self.states) > MAX_BUCKETS:
                self.states.popitem(last=False)
        self.states.move_to_end(shape)
        return state


class CaptureFailed(Exception):
    """The decode step could not be recorded; the sampler samples eagerly from then on."""


def _seed_from(generator: torch.Generator | None, device: torch.device) -> int:
    """The call's noise seed, drawn from the caller's generator (seeded per generation chunk), so
    successive calls with one generator (the turns of tool episodes) get fresh noise."""
    on = generator.device if generator is not None else device
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=on))


def _find_stops(state: DecodeState, stop: StopText, stopped: torch.Tensor, checked: int, made: int) -> int:
    """Look for the stop text ending at each token from ``checked`` to ``made``; rows where it does
    are finished on the device (the tokens they made since are dropped by their length)."""
    batch, first = len(stopped), max(0, checked - len(stop.text.encode()))  # each token holds >= 1 byte of it
    columns = list(state.out[:batch, first:made].cpu().unbind(dim=1))
    live = stopped == 0
    for end in range(checked, made):
        hits = stop.hits(columns[:end + 1 - first], live) & live
        stopped[hits] = end + 1
        live &= ~hits
    rows = (stopped > 0).nonzero().flatten()
    if len(rows):
        state.finished[rows.to(state.finished.device)] = True
    return made


def _lengths(completion: torch.Tensor, stopped: torch.Tensor, end_ids: torch.Tensor,
             max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's counted length (up to and including its end token or stop text) and whether it ended."""
    made = completion[:, :max_new_tokens]
    is_end = torch.isin(made, end_ids)
    first_end = torch.where(is_end.any(dim=1), is_end.float().argmax(dim=1) + 1, max_new_tokens + 1)
    stopped = stopped.to(completion.device)
    by_stop = torch.where(stopped > 0, stopped, max_new_tokens + 1)
    lengths = torch.minimum(first_end, by_stop)
    ended = lengths <= max_new_tokens
    return lengths.clamp(max=max_new_tokens), ended
