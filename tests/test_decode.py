"""The captured sampler (trainer/sampling/decode.py), run eagerly on the CPU: its static-cache loop gives
the eager sampler's greedy tokens, its in-graph draws follow the distribution, and new weight
tensors rebuild what was recorded for the old ones."""
import pytest
import torch

from trainer.config import TrainerConfig
from trainer.models.loading import encode_prompt, load_model, load_tokenizer
from trainer.models.tiny_model import build_tiny_model
from trainer.sampling.decode import CapturedSampler, PrefillTypedCache, Shape, hashed_uniform, pick_tokens
from trainer.sampling.rollout import StopText, generate, positions
from trainer.update.logprobs import sequence_logprobs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", hidden_size=32, layers=2, heads=2,
                                kv_heads=1, intermediate_size=64, seed=1))
    return load_model(path, torch.device("cpu")).eval(), load_tokenizer(path, tiny=True)


def _groups(tokenizer, size=3):
    texts = ("1+1=", "12*34=", "x", "(7-2)*3+11=")  # prompts of different lengths, each repeated as a group
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts for _ in range(size)]


def _kwargs(tok, **more):
    return {"max_new_tokens": 20, "eos_id": tok.eos_token_id, "pad_id": tok.pad_token_id, **more}


def _same(a, b) -> None:
    assert a.completion_ids == b.completion_ids
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.completion_mask, b.completion_mask) and torch.equal(a.truncated, b.truncated)


def test_hashed_noise_is_uniform_and_a_function_of_seed_and_step():
    counter = torch.arange(200_000, dtype=torch.long).view(100, 2000)
    one = lambda seed, step: hashed_uniform(counter, torch.tensor(seed), torch.tensor(step))  # noqa: E731
    u = one(7, 0)
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    assert torch.equal(u, one(7, 0))
    for other in (one(7, 1), one(8, 0)):
        assert abs(float(torch.corrcoef(torch.stack([u.flatten(), other.flatten()]))[0, 1])) < 0.01


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_gumbel_draws_follow_the_tempered_nucleus(top_p):
    rows, logits = 20_000, torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    counter = torch.arange(rows * 5, dtype=torch.long).view(rows, 5)
    picks = pick_tokens(logits.expand(rows, 5), 0.7, top_p, counter, torch.tensor(3), torch.tensor(0))
    probs = torch.softmax(logits / 0.7, dim=-1)
    if top_p < 1.0:  # the smallest set whose mass reaches top_p, renormalised
        keep = probs.cumsum(-1) - probs <= top_p
        probs = torch.where(keep, probs, 0.0) / probs[keep].sum()
    seen = torch.bincount(picks, minlength=5).float() / rows
    assert torch.allclose(seen, probs, atol=0.012), (seen, probs)
    assert float(seen[probs == 0].sum()) == 0.0


def test_greedy_tokens_are_the_eager_samplers(tiny):
    model, tok = tiny
    prompts = _groups(tok)
    eager = generate(model, prompts, **_kwargs(tok, temperature=0.0))
    _same(CapturedSampler(sync_every=4)(model, prompts, **_kwargs(tok, temperature=0.0)), eager)


def test_sampled_tokens_score_as_a_full_forward_scores_them(tiny):
    model, tok = tiny
    rollout = CapturedSampler()(model, _groups(tok), **_kwargs(tok, temperature=0.7),
                                generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=rollout.sequences, attention_mask=rollout.attention_mask,
                   position_ids=positions(rollout.attention_mask)).logits[:, rollout.prompt_width - 1:-1]
    counted = rollout.completion_mask.bool()
    logp, _ = sequence_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.prompt_width, temperature=0.7)
    expected = (logits / 0.7).log_softmax(-1).gather(2, rollout.completion_tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp[counted], expected[counted])
    assert len({tuple(ids) for ids in rollout.completion_ids[:3]}) > 1  # a group's rows differ


def test_a_seeded_call_repeats_and_a_shared_generator_moves_on(tiny):
    model, tok = tiny
    sampler, prompts = CapturedSampler(), _groups(tok)
    draw = lambda gen: sampler(model, prompts, **_kwargs(tok), generator=gen).completion_ids  # noqa: E731
    assert draw(torch.Generator().manual_seed(5)) == draw(torch.Generator().manual_seed(5))
    shared = torch.Generator().manual_seed(5)
    assert draw(shared) != draw(shared)  # the turns of an episode get fresh noise


def test_a_stop_text_ends_rows_between_the_hosts_looks(tiny):
    model, tok = tiny
    prompts = _groups(tok, size=1)
    first = generate(model, prompts, **_kwargs(tok, temperature=0.0))
    stop = StopText(tok, tok.decode(first.completion_ids[0][2:5]))  # completes after token 5, mid-window
    eager = generate(model, prompts, **_kwargs(tok, temperature=0.0), stop=stop)
    captured = CapturedSampler(sync_every=8)(model, prompts, **_kwargs(tok, temperature=0.0), stop=stop)
    _same(captured, eager)
    assert not captured.truncated[0] and len(captured.completion_ids[0]) <= 5


def test_new_weight_tensors_rebuild_the_recorded_step(tiny):
    model, tok = tiny
    model = type(model)(model.config).eval()
    model.load_state_dict(tiny[0].state_dict())
    sampler, prompts = CapturedSampler(), _groups(tok)
    sampler(model, prompts, **_kwargs(tok, temperature=0.0))
    with torch.no_grad():  # an optimizer step: in place, the recorded step reads it
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    _same(sampler(model, prompts, **_kwargs(tok, temperature=0.0)), generate(model, prompts, **_kwargs(tok, temperature=0.0)))
    assert sampler.recordings == 1
    moved = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(moved, assign=True)  # new tensors: what was recorded reads the old ones
    _same(sampler(model, prompts, **_kwargs(tok, temperature=0.0)), generate(model, prompts, **_kwargs(tok, temperature=0.0)))
    assert sampler.recordings == 2


def test_shapes_share_buckets(tiny):
    model, tok = tiny
    cpu = torch.device("cpu")
    assert Shape.of(5, 70, 10, (torch.float32,) * 2, 1.0, 1.0, cpu, (2,), 0)[:3] == (8, 128, 64)
    rows = [Shape.of(n, 1, 1, (torch.float32,) * 2, 1.0, 1.0, cpu, (2,), 0).rows for n in (1, 9, 200)]
    assert rows == [8, 16, 256]
    sampler, prompts = CapturedSampler(), _groups(tok)
    for rows in (5, 7, 8):
        sampler(model, prompts[:rows], **_kwargs(tok))
    assert sampler.recordings == 1 and len(sampler.states) == 1


@pytest.mark.parametrize("sampler", [generate, CapturedSampler()], ids=["eager", "captured"])
def test_a_groups_prompt_is_prefilled_once(tiny, sampler):
    model, tok = tiny
    widths = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    try:
        sampler(model, _groups(tok, size=4), **_kwargs(tok, max_new_tokens=3))
    finally:
        hook.remove()
    assert widths[0][0] == 4 and all(shape[1] == 1 for shape in widths[1:])


def test_the_eager_sampler_gives_the_same_greedy_tokens_with_a_shared_prefill(tiny):
    model, tok = tiny
    prompts = _groups(tok)
    _same(generate(model, prompts, **_kwargs(tok, temperature=0.0)),
          generate(model, prompts, **_kwargs(tok, temperature=0.0), share_prefill=False))


def test_auto_captures_on_cuda_and_samples_eagerly_elsewhere():
    assert TrainerConfig().sampler_kind("cpu") == "hf"  # on the CPU the captured loop runs eagerly, slower
    assert TrainerConfig().sampler_kind("cuda") == "captured"
    assert TrainerConfig(sampling={"rollout_backend": "hf"}).sampler_kind("cuda") == "hf"
    assert TrainerConfig(sampling={"rollout_backend": "captured"}).sampler_kind("cuda") == "captured"
    assert TrainerConfig(system={"sharding": "fsdp"}).sampler_kind("cuda") == "hf"
    with pytest.raises(ValueError, match="fsdp samples with the trainer's own eager sampler"):
        TrainerConfig(system={"sharding": "fsdp"}, sampling={"rollout_backend": "captured"})


def test_lora_adapters_switched_off_rebuild_the_recorded_step(tiny):
    from trainer.config import LoraConfig
    from trainer.models.adapters import adapter_free, attach_lora

    base, tok = tiny
    model = type(base)(base.config).eval()
    model.load_state_dict(base.state_dict())
    model = attach_lora(model, LoraConfig(rank=4))
    with torch.no_grad():  # adapters that change the output (fresh ones add zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5 * torch.randn_like(p))
    sampler, prompts, greedy = CapturedSampler(), _groups(tok), _kwargs(tok, temperature=0.0)
    with_adapters = generate(model, prompts, **greedy)
    _same(sampler(model, prompts, **greedy), with_adapters)
    with adapter_free(model):
        without = generate(model, prompts, **greedy)
        assert without.completion_ids != with_adapters.completion_ids
        _same(sampler(model, prompts, **greedy), without)
    _same(sampler(model, prompts, **greedy), with_adapters)
    assert sampler.recordings == 3


def test_under_bf16_autocast_keys_and_values_keep_their_own_dtypes(tiny):
    # the rotary embedding leaves keys in fp32 and values in bf16: one cache dtype for both failed
    model, tok = tiny
    prompts, greedy = _groups(tok), _kwargs(tok, temperature=0.0)
    sampler = CapturedSampler()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        captured, eager = sampler(model, prompts, **greedy), generate(model, prompts, **greedy)
    (shape, state), = sampler.states.items()
    assert shape.kv_dtypes == (torch.float32, torch.bfloat16) and shape.autocast == torch.bfloat16
    assert state.cache.layers[0].keys.dtype == torch.float32 and state.cache.layers[0].values.dtype == torch.bfloat16
    same = sum(a == b for a, b in zip(captured.completion_ids, eager.completion_ids))
    assert same >= 0.75 * len(prompts)  # padded attention lengths may round a near-tie the other way


def test_a_step_that_cannot_be_recorded_falls_back_to_the_eager_sampler(tiny, capsys):
    # recording on the CPU fails as a model whose forward syncs with the host would on CUDA
    model, tok = tiny
    sampler, prompts, greedy = CapturedSampler(capture=True), _groups(tok), _kwargs(tok, temperature=0.0)
    _same(sampler(model, prompts, **greedy), generate(model, prompts, **greedy))
    assert sampler.unrecordable and "sampling with the eager sampler from now on" in capsys.readouterr().err
    _same(sampler(model, prompts, **greedy), generate(model, prompts, **greedy))
    assert capsys.readouterr().err == ""  # said once


def test_a_decode_step_in_another_dtype_is_stored_in_the_prefills(tiny):
    # on an H200 (transformers 5.17) the decode step's keys came out in bf16 against the prefill's fp32
    # under autocast; the eager sampler's DynamicCache promotes them, a static cache must cast them
    model, _ = tiny
    cache = PrefillTypedCache(config=model.config, max_cache_len=4)
    heads, width = model.config.num_key_value_heads, model.config.hidden_size // model.config.num_attention_heads
    prefill = torch.randn(2, heads, 1, width)
    for layer in cache.layers:
        layer.lazy_initialization(prefill, prefill.to(torch.bfloat16))
        layer.cumulative_length.fill_(1)  # the prefill's one position, as DecodeState.load leaves it
    step = torch.randn(2, heads, 1, width)
    keys, values = cache.update(step.to(torch.bfloat16), step, 0, {"cache_position": torch.tensor([1])})
    assert keys.dtype == torch.float32 and values.dtype == torch.bfloat16
    assert torch.equal(keys[:, :, 1:2], step.to(torch.bfloat16).float())
