"""Multi-turn tool episodes: tool responses are context, never loss; the verifier replays calls."""
import json
import random

import pytest
import torch

from domains.registry import load_all
from trainer.episodes import run_episodes, tool_message_tokens, transcript_tokens
from trainer.models import load_model, load_tokenizer
from trainer.sft import reference_pairs, supervised_loss
from trainer.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", hidden_size=64, layers=2, heads=2,
                                kv_heads=1, intermediate_size=128, seed=0))
    domains = load_all(["tool_calculator"])
    return load_model(path, torch.device("cpu")), load_tokenizer(path, tiny=True), domains


def _masked_text(tokenizer, tokens, mask, keep):
    return "".join(tokenizer.decode([t]) for t, m in zip(tokens, mask) if m == keep)


def test_transcript_tokens_mask_tool_responses(setup):
    _, tok, domains = setup
    task = domains["tool_calculator"].sample(5, 1, random.Random(1))[0]
    transcript = domains["tool_calculator"].reference(task)
    tokens, mask = transcript_tokens(tok, transcript)
    messages = json.loads(transcript)
    trained = _masked_text(tok, tokens, mask, keep=1)
    context = _masked_text(tok, tokens, mask, keep=0)
    # the trained tokens are exactly the assistant turns (plus the final end-of-turn) ...
    assert trained == "".join(m["content"] for m in messages if m["role"] == "assistant") + "<|end|>"
    # ... and every tool response sits in the context, in its template markup
    for m in messages:
        if m["role"] == "tool":
            assert f"<|tool|>{m['content']}<|end|>" in context
    assert tok.decode(tool_message_tokens(tok, "42")) == "<|tool|>42<|end|><|assistant|>"


def test_played_episode_masks_the_tool_response(setup):
    """Teach the model one reference episode, then let it play that task: the environment's answer
    must appear in the sequence, masked out of the loss, and the verifier must accept the episode."""
    model, tok, domains = setup
    task = domains["tool_calculator"].sample(1, 1, random.Random(4))[0]
    examples = reference_pairs(tok, [task], domains)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = supervised_loss(model, examples, tok.pad_token_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    rollout, transcripts = run_episodes(model, tok, [task], domains, max_new_tokens=80, max_total_tokens=200,
                                        temperature=0.0)
    messages = json.loads(transcripts[0])
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    truth = json.loads(domains["tool_calculator"].reference(task))[1]["content"]
    assert messages[1]["content"] == truth  # the environment answered, not the model
    tokens = rollout.completion_tokens[0].tolist()
    mask = rollout.completion_mask[0].tolist()
    assert truth in _masked_text(tok, tokens, mask, keep=0)
    assert truth not in _masked_text(tok, tokens, mask, keep=1).split("boxed")[0]  # only copied in the answer
    assert domains["tool_calculator"].verify(task, transcripts[0]).reward == 1.0
