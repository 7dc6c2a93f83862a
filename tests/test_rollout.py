"""Sampling with a KV cache agrees with a full forward pass; masks, stops and truncation are right."""
from types import SimpleNamespace

import pytest
import torch

from domains.tools.calls import CLOSE as TOOL_CALL_END
from trainer.models.loading import encode_prompt, load_model, load_tokenizer
from trainer.models.tiny_model import build_tiny_model
from trainer.sampling.rollout import StopText, generate, left_pad, positions
from trainer.update.logprobs import sequence_logprobs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", hidden_size=32, layers=2, heads=2,
                                kv_heads=1, intermediate_size=64, seed=1))
    return load_model(path, torch.device("cpu")), load_tokenizer(path, tiny=True)


def _prompts(tokenizer):
    return [encode_prompt(tokenizer, [{"role": "user", "content": text}]) for text in ("1+1=", "12*34=", "x")]


def test_models_for_cuda_leave_cudnn_attention_out():
    # cuDNN's attention plans every new shape, and sampling makes one per token (trainer/models/loading.py)
    from trainer.models.loading import avoid_per_shape_attention_plans

    torch.backends.cuda.enable_cudnn_sdp(True)
    avoid_per_shape_attention_plans()
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.mem_efficient_sdp_enabled()  # a fallback stays


def test_left_pad_and_positions():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_cached_greedy_matches_full_forward(tiny):
    model, tok = tiny
    rollout = generate(model, _prompts(tok), max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                       temperature=0.0)
    logits = model(input_ids=rollout.sequences, attention_mask=rollout.attention_mask,
                   position_ids=positions(rollout.attention_mask)).logits[:, rollout.prompt_width - 1:-1]
    counted = rollout.completion_mask.bool()
    assert torch.equal(logits.argmax(-1)[counted], rollout.completion_tokens[counted])
    # the log-probs the trainer computes are those of the sampled tokens under the same forward
    logp, _ = sequence_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.prompt_width)
    expected = logits.log_softmax(-1).gather(2, rollout.completion_tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp[counted], expected[counted])


def test_logprobs_are_those_of_the_sampling_temperature(tiny):
    # the loss must score the distribution the rows were sampled from: softmax(logits / T)
    model, tok = tiny
    rollout = generate(model, _prompts(tok), max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                       temperature=0.7, generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=rollout.sequences, attention_mask=rollout.attention_mask,
                   position_ids=positions(rollout.attention_mask)).logits[:, rollout.prompt_width - 1:-1]
    counted = rollout.completion_mask.bool()
    logp, entropy = sequence_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.prompt_width,
                                      with_entropy=True, temperature=0.7)
    tempered = (logits / 0.7).log_softmax(-1)
    expected = tempered.gather(2, rollout.completion_tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp[counted], expected[counted])
    torch.testing.assert_close(entropy[counted], -(tempered.exp() * tempered).sum(-1)[counted])
    untempered, _ = sequence_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.prompt_width)
    assert not torch.allclose(logp[counted], untempered[counted])


def test_truncation_and_stop_sequence(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    first = generate(model, prompts, max_new_tokens=5, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                     temperature=0.0)
    # an untrained model rarely says EOS within 5 tokens: rows without EOS are truncated, all counted
    for row in range(len(prompts)):
        if tok.eos_token_id not in first.completion_tokens[row].tolist():
            assert first.truncated[row] and first.completion_mask[row].sum() == first.completion_tokens.shape[1]
    stop = first.completion_tokens[0, :2].tolist()
    stopped = generate(model, prompts, max_new_tokens=5, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                       temperature=0.0, stop=StopText(tok, tok.decode(stop)))
    assert not stopped.truncated[0]
    assert int(stopped.completion_mask[0].sum()) == 2  # the stop tokens count, nothing after them
    assert stopped.completion_ids[0] == stop


class Scripted(torch.nn.Module):
    """A 'model' that writes a fixed token sequence per row, whatever it is fed."""

    def __init__(self, scripts: list[list[int]], vocab: int) -> None:
        super().__init__()
        self.scripts, self.vocab, self.calls = scripts, vocab, 0
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # so the sampler can find the device

    def forward(self, input_ids, cache=None, **_):
        logits = torch.full((*input_ids.shape, self.vocab), -1e9)
        for row, script in enumerate(self.scripts):
            logits[row, :, script[min(self.calls, len(script) - 1)]] = 0.0
        self.calls += 1
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize("tag_as", ["one special token", "its characters"])
def test_the_closing_tag_stops_a_row_however_it_is_tokenised(tiny, tag_as, monkeypatch):
    import trainer.sampling.rollout

    # the scripted rows cannot follow a row that leaves
    monkeypatch.setattr(trainer.sampling.rollout, "COMPACT_SHARE", 2.0)
    _, tok = tiny
    stop = StopText(tok, TOOL_CALL_END)
    call = tok('{"name":"add"}}', add_special_tokens=False)["input_ids"]
    tag = tok(TOOL_CALL_END, add_special_tokens=False)["input_ids"] if tag_as == "one special token" else [tok.convert_tokens_to_ids(c) for c in TOOL_CALL_END]
    assert len(tag) == (1 if tag_as == "one special token" else len(TOOL_CALL_END))
    after = tok("<|tool|>", add_special_tokens=False)["input_ids"]  # what a model would go on to imagine
    chatty = tok("no call here", add_special_tokens=False)["input_ids"]
    rollout = generate(Scripted([call + tag + after, chatty], len(tok)), [[1, 2], [1, 3]], max_new_tokens=40,
                       eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=0.0, stop=stop)
    assert not rollout.truncated[0]
    assert rollout.completion_ids[0] == call + tag
    # the other row of the batch goes on to its budget
    assert rollout.truncated[1] and len(rollout.completion_ids[1]) == 40


def test_a_row_that_never_closes_the_tag_runs_to_its_budget(tiny):
    _, tok = tiny
    almost = [tok.convert_tokens_to_ids(c) for c in "</tool_call"] + tok("x>", add_special_tokens=False)["input_ids"]
    rollout = generate(Scripted([almost * 3], len(tok)), [[1, 2]], max_new_tokens=30, eos_id=tok.eos_token_id,
                       pad_id=tok.pad_token_id, temperature=0.0, stop=StopText(tok, TOOL_CALL_END))
    assert rollout.truncated[0] and len(rollout.completion_ids[0]) == 30


def test_a_stop_string_must_end_in_a_visible_character(tiny):
    with pytest.raises(ValueError, match="visible ASCII"):
        StopText(tiny[1], "</tool_call>\n")


def test_sampling_is_reproducible_with_a_generator(tiny):
    model, tok = tiny
    runs = [generate(model, _prompts(tok), max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                     generator=torch.Generator().manual_seed(9)).completion_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_sampling_stops_at_every_end_token_the_generation_config_names(tiny):
    """An instruct model may end its turn with a token other than its tokenizer's end-of-text one
    (SmolLM2's <|im_end|>): generation stops at each end token the model's generation config names."""
    from trainer.models.loading import end_token_ids

    model, tok = tiny
    other_end = tok.convert_tokens_to_ids("x")
    digits = tok("12", add_special_tokens=False)["input_ids"]
    scripted = Scripted([digits + [other_end] + digits * 5], len(tok))
    scripted.generation_config = SimpleNamespace(eos_token_id=[tok.eos_token_id, other_end])
    ends = end_token_ids(scripted, tok)
    assert ends == (tok.eos_token_id, other_end)
    rollout = generate(scripted, [[1, 2]], max_new_tokens=10, eos_id=ends, pad_id=tok.pad_token_id, temperature=0.0)
    assert not rollout.truncated[0] and int(rollout.completion_mask[0].sum()) == len(digits) + 1  # the end counts
    assert rollout.completion_ids[0] == digits  # and is not part of the text
    only_its_own = generate(Scripted([digits + [other_end] + digits * 5], len(tok)), [[1, 2]], max_new_tokens=10,
                            eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=0.0)
    assert only_its_own.truncated[0]  # the tokenizer's end token alone would not have stopped it
    assert end_token_ids(model, tok) == (tok.eos_token_id,)  # the tiny model names one: the same as before


def test_finished_rows_leave_the_batch_without_changing_the_draws(tiny, monkeypatch):
    # rows that end early stop being decoded; every draw is still made for the whole batch, so a
    # seeded call samples exactly what it did with every row kept to the end
    import trainer.sampling.rollout

    model, tok = tiny
    prompts = _prompts(tok) * 4
    kwargs = dict(max_new_tokens=30, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=1.0)
    rows_decoded = []
    hook = model.register_forward_pre_hook(lambda _, args, kw: rows_decoded.append(kw["input_ids"].shape),
                                           with_kwargs=True)

    def sample():
        rows_decoded.clear()
        rollout = generate(model, prompts, generator=torch.Generator().manual_seed(7), **kwargs)
        return rollout, [rows for rows, width in rows_decoded if width == 1]  # the decode steps' batches

    try:
        monkeypatch.setattr(trainer.sampling.rollout, "COMPACT_SHARE", 0.0)  # a row leaves as soon as it ends
        leaving, leaving_rows = sample()
        monkeypatch.setattr(trainer.sampling.rollout, "COMPACT_SHARE", 2.0)  # never: every row to the end
        staying, staying_rows = sample()
    finally:
        hook.remove()
    lengths = leaving.completion_mask.sum(dim=1)
    assert lengths.min() < lengths.max()  # some rows did end early ...
    assert min(leaving_rows) < len(prompts) and set(staying_rows) == {len(prompts)}  # ... and left the batch
    assert torch.equal(leaving.sequences, staying.sequences)
    assert torch.equal(leaving.completion_mask, staying.completion_mask)
