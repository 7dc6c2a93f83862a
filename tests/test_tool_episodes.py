"""Multi-turn tool episodes: tool responses are context, never loss; the verifier replays calls."""
import json
import random

import pytest
import torch

from domains.registry import load_all
from domains.tools.calls import CLOSE as TOOL_CALL_END
from trainer.models.loading import encode_prompt, load_model, load_tokenizer
from trainer.models.tiny_model import build_tiny_model
from trainer.update.supervised import reference_pairs, supervised_loss
from trainer.sampling.decode import CapturedSampler
from trainer.sampling.episodes import group_rows, run_episodes, tool_message_tokens, transcript_tokens
from trainer.sampling.rollout import as_ids, assemble, left_pad


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
    tokens, mask = transcript_tokens(tok, transcript, domains["tool_calculator"].stop_text)
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
    # the captured sampler plays it alike: the closing tag found between its looks, turn after turn
    again, replayed = run_episodes(model, tok, [task], domains, max_new_tokens=80, max_total_tokens=200,
                                   temperature=0.0, sampler=CapturedSampler(sync_every=8))
    assert replayed == transcripts and torch.equal(again.sequences, rollout.sequences)
    assert torch.equal(again.completion_mask, rollout.completion_mask)
    # the default continues the episode's KV cache across the tool's answer; encoding the whole
    # transcript again for the second turn plays the very same tokens
    encoded, anew = run_episodes(model, tok, [task], domains, max_new_tokens=80, max_total_tokens=200,
                                 temperature=0.0, keep_cache=False)
    assert anew == transcripts and torch.equal(encoded.sequences, rollout.sequences)


def test_a_kept_cache_plays_a_batch_of_episodes_as_encoding_them_again_does(setup):
    # sampled turns (seeded), episodes that end at different turns, rows that leave between turns:
    # the continued cache feeds each turn the same logits as encoding every transcript anew
    model, tok, domains = setup  # trained on one episode by the test above, so it calls the tool
    tasks = domains["tool_calculator"].sample(1, 6, random.Random(4))
    rows = [task for task in tasks for _ in range(3)]
    settings = dict(max_new_tokens=60, max_total_tokens=160, temperature=1.0)
    kept, kept_texts = run_episodes(model, tok, rows, domains, generator=torch.Generator().manual_seed(2), **settings)
    anew, anew_texts = run_episodes(model, tok, rows, domains, generator=torch.Generator().manual_seed(2),
                                    keep_cache=False, **settings)
    turns = [sum(m["role"] == "assistant" for m in json.loads(text)) for text in kept_texts]
    assert max(turns) >= 2 and min(turns) < max(turns)  # several turns, and episodes of unequal length
    assert kept_texts == anew_texts
    assert torch.equal(kept.sequences, anew.sequences) and torch.equal(kept.completion_mask, anew.completion_mask)


def test_half_of_a_led_group_starts_with_the_lead_which_the_tool_answers_and_the_update_trains(setup):
    model, tok, domains = setup
    calculator = domains["tool_calculator"]
    task = calculator.sample(3, 1, random.Random(9))[0]  # two calls, then the answer
    led = calculator.hinted(task, "lead")
    rows = group_rows([led], 4)
    assert [bool(r.meta.get("lead")) for r in rows] == [True, True, False, False]
    assert {r.id for r in rows} == {led.id} and {r.prompt == task.prompt for r in rows} == {True}
    assert [bool(r.meta.get("lead")) for r in group_rows([led, task], 3)] == [True, False, False] + [False] * 3
    rollout, texts = run_episodes(model, tok, rows, domains, max_new_tokens=40, max_total_tokens=200, temperature=0.0)
    reference = json.loads(calculator.reference(task))
    assert json.loads(texts[0])[:2] == reference[:2]  # the lead, then the environment's real answer to it
    for text in texts[2:]:  # the other half plays the task as it is, unled
        assert json.loads(text)[0]["content"] != led.meta["lead"]
    _, plain = run_episodes(model, tok, [task, task], domains, max_new_tokens=40, max_total_tokens=200, temperature=0.0)
    assert texts[2:] == plain
    lead = tok(led.meta["lead"], add_special_tokens=False)["input_ids"]
    tokens, mask = rollout.completion_tokens[0].tolist(), rollout.completion_mask[0].tolist()
    assert tokens[:len(lead)] == lead and all(mask[:len(lead)])  # trained on, as the policy's own turn
    assert mask[len(lead)] == 0 and reference[1]["content"] in _masked_text(tok, tokens, mask, keep=0)
    # with the sampler's log-probs (the async pipeline): the written tokens have none (NaN), the sampled ones do
    sampled, _ = run_episodes(model, tok, rows[1:3], domains, max_new_tokens=40, max_total_tokens=200,
                              temperature=1.0, generator=torch.Generator().manual_seed(0), with_logprobs=True)
    written = sampled.logprobs[0, :len(lead)]
    assert torch.isnan(written).all() and not torch.isnan(sampled.logprobs[1]).any()
    chosen = sampled.completion_mask.bool()
    chosen[0, :len(lead)] = False
    assert (sampled.logprobs[chosen] < 0).all()  # every sampled token's own log-prob
    # a lead longer than the episode's budget is cut there, as a sampled turn is, and ends the episode
    cut, cut_texts = run_episodes(model, tok, [led], domains, max_new_tokens=40, max_total_tokens=5, temperature=0.0)
    assert cut.truncated.tolist() == [True] and json.loads(cut_texts[0]) == [
        {"role": "assistant", "content": tok.decode(lead[:5], skip_special_tokens=False)}]
    # a group of one cannot contrast: it is played unled
    assert [bool(r.meta.get("lead")) for r in group_rows([led], 1)] == [False]


def _scripted_sampler(tokenizer, scripts: dict[tuple[int, ...], list[str]]):
    """A sampler that plays fixed turns: ``scripts`` maps an episode's prompt tokens to the text of
    each of its assistant turns; each turn is cut at the budget it is given, as a real one is."""
    played: dict[tuple[int, ...], int] = {}

    def sample(model, prompts, *, max_new_tokens, eos_id, pad_id, stop=None, **_):
        rows, lengths, ended = [], [], []
        for tokens in prompts:
            key = next(k for k in scripts if tuple(tokens[:len(k)]) == k)
            turn = played.get(key, 0)
            played[key] = turn + 1
            ids = tokenizer(scripts[key][turn], add_special_tokens=False)["input_ids"] + [as_ids(eos_id)[0]]
            rows.append(ids[:max_new_tokens])
            lengths.append(len(rows[-1]))
            ended.append(len(ids) <= max_new_tokens)
        width = max(lengths)
        completion = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
        prompt_ids, prompt_mask = left_pad(prompts, pad_id)
        return assemble(prompt_ids, prompt_mask, completion, torch.tensor(lengths), torch.tensor(ended), eos_id)

    return sample


def test_a_wordy_episode_does_not_cut_short_the_others_in_its_batch(setup):
    model, tok, domains = setup
    wordy, brief = domains["tool_calculator"].sample(1, 2, random.Random(7))
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    scripts = {
        tuple(encode_prompt(tok, wordy.prompt)): [call.replace(" ", " " * 12), "\\boxed{3}" + " " * 100],
        tuple(encode_prompt(tok, brief.prompt)): [call, "\\boxed{3}" + " " * 100],
    }
    budget = {"max_new_tokens": 200, "max_total_tokens": 200, "temperature": 0.0}
    _, alone = run_episodes(model, tok, [brief], domains, sampler=_scripted_sampler(tok, scripts), **budget)
    rollout, together = run_episodes(model, tok, [wordy, brief], domains,
                                     sampler=_scripted_sampler(tok, scripts), **budget)
    # the wordy episode has about 60 tokens left for its answer, the brief one about 120: the
    # brief one's answer (110 tokens) must not be cut at the wordy one's budget ...
    assert together[1] == alone[0]
    assert json.loads(together[1])[-1]["content"] == "\\boxed{3}" + " " * 100
    # ... while the wordy one's is cut at its own
    assert 0 < len(json.loads(together[0])[-1]["content"]) < 100
    assert rollout.truncated.tolist() == [True, False]


def test_the_tiny_tokenizer_spends_one_token_per_piece_of_call_markup_and_round_trips_any_text(setup):
    _, tok, _ = setup
    call = '<tool_call>{"name":"mul","arguments":{"a":964,"b":494}}</tool_call>'
    ids = tok(call, add_special_tokens=False)["input_ids"]
    assert len(ids) == 23  # 5 pieces of markup + 18 characters ("mul" and the arguments), not 67 characters
    assert tok(TOOL_CALL_END, add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(TOOL_CALL_END)]
    for text in [call, 'x}}}y{{"name":"z', "<tool_call", '{"name": "spaced"}', "3+4=\\boxed{7}\n"]:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_a_domain_declares_whether_it_is_multi_turn_and_what_ends_a_turn():
    from domains.api import Domain
    from domains.registry import load

    assert Domain.multi_turn is False and Domain.stop_text is None
    for name in ("tool_calculator", "tool_kv_store", "tool_lookup"):
        domain = load(name)
        assert domain.multi_turn and domain.stop_text == TOOL_CALL_END
    for name in ("arithmetic", "code_functions", "bfcl"):  # bfcl: every call in one completion
        domain = load(name)
        assert not domain.multi_turn and domain.stop_text is None


def test_episodes_of_domains_with_other_stop_texts_are_sampled_apart(setup):
    import copy
    import dataclasses

    from trainer.sampling.episodes import by_rollout

    _, _, domains = setup
    calculator = domains["tool_calculator"]
    other = copy.copy(calculator)
    other.stop_text = "</call>"
    tasks = calculator.sample(1, 2, random.Random(0))
    tasks = [tasks[0], dataclasses.replace(tasks[1], domain="other", id="")]
    both = {"tool_calculator": calculator, "other": other}
    assert by_rollout(tasks, both) == [[tasks[1]], [tasks[0]]]  # "</call>" sorts before "</tool_call>"
    with pytest.raises(ValueError, match="one stop text"):
        run_episodes(None, None, tasks, both, max_new_tokens=8, max_total_tokens=16, temperature=1.0)
