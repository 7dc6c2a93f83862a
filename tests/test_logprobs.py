"""Completion log-probs with the head run over completion positions only, in checkpointed chunks:
the same values and gradients as a whole-vocabulary forward over every position."""
import math

import pytest
import torch
from torch.testing import assert_close

from trainer.config import LoraConfig
from trainer.models.adapters import attach_lora
from trainer.models.loading import encode_prompt, load_model, load_tokenizer
from trainer.models.tiny_model import build_tiny_model
from trainer.sampling.rollout import generate, positions
from trainer.update.logprobs import decoder_and_head, pick, sequence_logprobs
from trainer.update.shared_prefix import grouped_logprobs, pack_by_prompt


@pytest.fixture(scope="module")
def rollout_and_model(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", hidden_size=32, layers=2, heads=2,
                                kv_heads=1, intermediate_size=64, seed=3))
    model, tok = load_model(path, torch.device("cpu")), load_tokenizer(path, tiny=True)
    prompts = [encode_prompt(tok, [{"role": "user", "content": text}]) for text in ("1+1=", "12*34=", "x", "ab")]
    rollout = generate(model, prompts, max_new_tokens=12, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                       temperature=1.0, generator=torch.Generator().manual_seed(0))
    return model, rollout


def _whole_logits(model, rollout, temperature):
    """Today's path, written out: logits at every position, the completion's sliced out."""
    logits = model(input_ids=rollout.sequences, attention_mask=rollout.attention_mask,
                   position_ids=positions(rollout.attention_mask)).logits[:, rollout.prompt_width - 1:-1]
    logp = (logits.float() / temperature).log_softmax(-1)
    chosen = logp.gather(2, rollout.completion_tokens.unsqueeze(-1)).squeeze(-1)
    return chosen, -(logp.exp() * logp).sum(-1)


def _gradient(model, fn) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    logp, entropy = fn()
    (logp.sum() + 0.3 * entropy.sum()).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("chunk", [0, 5, 1024])  # the model's own forward; chunks that split rows; one chunk
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_head_matches_whole_logits(rollout_and_model, chunk, temperature):
    model, rollout = rollout_and_model
    expected_logp, expected_entropy = _whole_logits(model, rollout, temperature)
    logp, entropy = sequence_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.prompt_width,
                                      with_entropy=True, temperature=temperature, chunk_tokens=chunk)
    assert logp.shape == rollout.completion_tokens.shape
    assert_close(logp, expected_logp, atol=1e-5, rtol=1e-5)
    assert_close(entropy, expected_entropy, atol=1e-5, rtol=1e-5)
    # and the gradients, through the recomputed chunks, are those of the whole forward
    whole = _gradient(model, lambda: _whole_logits(model, rollout, temperature))
    chunked = _gradient(model, lambda: sequence_logprobs(model, rollout.sequences, rollout.attention_mask,
                                                         rollout.prompt_width, with_entropy=True,
                                                         temperature=temperature, chunk_tokens=chunk))
    assert_close(chunked, whole, atol=1e-5, rtol=1e-4)
    assert chunked.abs().max() > 1e-3  # a real gradient was compared


def test_chunks_keep_no_whole_vocabulary_tensor_for_the_backward(rollout_and_model):
    # the tensors autograd keeps for the backward: with chunks none holds logits (each chunk's are
    # recomputed in the backward); the whole-logits path keeps [B, L, V] ones
    model, rollout = rollout_and_model
    vocab = model.get_output_embeddings().weight.shape[0]
    rows = rollout.completion_tokens.numel()

    def vocabulary_rows_saved(chunk):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
            sequence_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.prompt_width,
                              with_entropy=True, chunk_tokens=chunk)
        return max((math.prod(shape[:-1]) for shape in saved if shape and shape[-1] == vocab), default=0)

    assert vocabulary_rows_saved(0) >= rows
    assert vocabulary_rows_saved(8) == 0


def test_a_lora_model_runs_its_decoder_and_head_apart_with_adapters_in_place(rollout_and_model):
    model, rollout = rollout_and_model
    lora = attach_lora(model, LoraConfig(enabled=True, rank=2, alpha=4.0))
    try:
        decoder, head = decoder_and_head(lora)
        assert any("lora" in name for name, _ in decoder.named_modules())
        with torch.no_grad():
            for name, p in lora.named_parameters():
                if "lora_B" in name:
                    p.normal_()  # adapters that change the output
        expected, _ = _whole_logits(lora, rollout, 1.0)
        logp, _ = sequence_logprobs(lora, rollout.sequences, rollout.attention_mask, rollout.prompt_width)
        assert_close(logp, expected, atol=1e-5, rtol=1e-5)
    finally:
        lora.unload()
        model.requires_grad_(True)  # peft froze the base weights; the other tests train them


def test_pick_takes_the_tempered_log_softmax():
    logits = torch.tensor([[[2.0, 0.0, 0.0]]])
    # log softmax of [2, 0, 0] at index 0: 2 - log(e^2 + 2) = -0.2395; at T = 2 the logits halve
    logp, entropy = pick(logits, torch.tensor([[0]]), with_entropy=True)
    assert_close(logp, torch.tensor([[2 - math.log(math.e**2 + 2)]]))
    p = torch.tensor([math.e**2, 1.0, 1.0]) / (math.e**2 + 2)
    assert_close(entropy, -(p * p.log()).sum().view(1, 1))
    assert_close(pick(logits, torch.tensor([[0]]), temperature=2.0)[0], torch.tensor([[1 - math.log(math.e + 2)]]))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])  # a boolean mask, an additive one
def test_packed_prompts_give_each_completion_its_plain_log_probs_and_gradient(tmp_path, attention):
    path = str(build_tiny_model(tmp_path / "tiny", hidden_size=32, layers=2, heads=2, kv_heads=1,
                                intermediate_size=64, seed=4))
    model, tok = load_model(path, torch.device("cpu")), load_tokenizer(path, tiny=True)
    model.config._attn_implementation = attention
    prompts = [encode_prompt(tok, [{"role": "user", "content": text}]) for text in ("1+1=", "12*34=", "x")]
    rollout = generate(model, [p for p in prompts for _ in range(3)], max_new_tokens=10, eos_id=tok.eos_token_id,
                       pad_id=tok.pad_token_id, temperature=1.0, generator=torch.Generator().manual_seed(1))
    counted = rollout.completion_mask.clone()
    counted[1, 2:5] = 0  # a tool's answer inside a completion: context, not counted
    counted[4] = 0  # a row that counts nothing (a truncated one, masked)
    args = (rollout.sequences, rollout.attention_mask, rollout.prompt_width)
    packed = pack_by_prompt(*args, counted)
    assert packed.ids.shape[0] == 3  # one packed row per prompt
    assert packed.ids.shape[1] < rollout.sequences.shape[1] * 3  # the prompt is in it once
    plain_logp, plain_entropy = sequence_logprobs(model, *args, with_entropy=True, temperature=0.7)
    logp, entropy = grouped_logprobs(model, *args, counted, with_entropy=True, temperature=0.7)
    where = counted.bool()
    assert_close(logp[where], plain_logp[where], atol=1e-5, rtol=1e-5)
    assert_close(entropy[where], plain_entropy[where], atol=1e-5, rtol=1e-5)
    loss = lambda lp, ent: ((lp + 0.3 * ent) * counted).sum()  # noqa: E731
    plain = _gradient(model, lambda: (loss(*sequence_logprobs(model, *args, with_entropy=True)), torch.zeros(())))
    shared = _gradient(model, lambda: (loss(*grouped_logprobs(model, *args, counted, with_entropy=True)),
                                       torch.zeros(())))
    assert_close(shared, plain, atol=1e-5, rtol=1e-4)


def test_a_micro_batch_that_counts_nothing_gives_zeros_and_a_backward(rollout_and_model):
    # every row masked (all truncated under mask_truncated): zeros, and a backward that runs
    model, rollout = rollout_and_model
    nothing = torch.zeros_like(rollout.completion_mask)
    logp, entropy = grouped_logprobs(model, rollout.sequences, rollout.attention_mask, rollout.prompt_width, nothing,
                                     with_entropy=True)
    assert not logp.any() and not entropy.any()
    (logp.sum() + entropy.sum()).backward()
