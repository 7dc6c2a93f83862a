"""TRL's GRPOTrainer with tool domains: the rollout function of ``trainer.integrations.trl_rollout``.

The first tests call the rollout function by hand on a stand-in for TRL's trainer; the last one is a
real TRL run (tiny model, SQLite store) that mixes a tool domain with a single-turn one. An
untrained tiny model never writes a tool call, so tool episodes are played by a scripted sampler
(a call, then an answer); single completions are sampled for real.
"""
from __future__ import annotations

import contextlib
import json
import math
import random
from types import SimpleNamespace

import pytest
import torch

from domains.registry import load_all
from domains.tools.calls import render_call
from trainer.integrations.trl_rollout import PalestraRollout
from trainer.models.loading import encode_prompt, load_model, load_tokenizer
from trainer.models.tiny_model import build_tiny_model
from trainer.sampling.episodes import tool_message_tokens
from trainer.sampling.rollout import as_ids, assemble, generate, left_pad

CALL, ANSWER = render_call("add", a=1, b=2), "\\boxed{3}"


class ScriptedSampler:
    """A ``Sampler`` that plays every tool episode as: one call to add(1, 2), then ``\\boxed{3}``;
    single completions (asked for without a stop text) come from the real sampler."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tool_token = tokenizer.convert_tokens_to_ids("<|tool|>")  # opens each tool message

    def __call__(self, model, prompts, *, stop=None, **settings):
        if stop is None:
            return generate(model, prompts, **settings)
        encode = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        turns = [encode(CALL) if p.count(self.tool_token) == 0 else encode(ANSWER) + [self.tokenizer.eos_token_id]
                 for p in prompts]
        ids, prompt_mask = left_pad(prompts, settings["pad_id"])
        completion = torch.full((len(turns), max(map(len, turns))), settings["pad_id"], dtype=torch.long)
        for row, turn in enumerate(turns):
            completion[row, :len(turn)] = torch.tensor(turn)
        return assemble(ids, prompt_mask, completion, torch.tensor([len(t) for t in turns]),
                        torch.ones(len(turns), dtype=torch.bool), as_ids(settings["eos_id"]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", hidden_size=32, layers=1, heads=2, kv_heads=1,
                            intermediate_size=64)
    return load_model(str(path), torch.device("cpu")), load_tokenizer(str(path), tiny=True)


def _trainer(model, tokenizer, **changes) -> SimpleNamespace:
    """What the rollout function reads of TRL's GRPOTrainer."""
    use_vllm = changes.pop("use_vllm", False)
    args = dict(seed=0, max_completion_length=12, temperature=0.9, top_p=1.0, top_k=0, min_p=None,
                repetition_penalty=1.0, generation_kwargs=None)
    return SimpleNamespace(model=model, processing_class=tokenizer, args=SimpleNamespace(**{**args, **changes}),
                           accelerator=SimpleNamespace(unwrap_model=lambda m: m, autocast=contextlib.nullcontext),
                           use_vllm=use_vllm)


def test_an_episode_comes_back_as_one_transcript_with_the_tool_tokens_masked(tiny):
    model, tok = tiny
    domains = load_all(["tool_calculator", "arithmetic"])
    calc = domains["tool_calculator"].sample(1, 1, random.Random(0))[0]
    sums = domains["arithmetic"].sample(1, 1, random.Random(0))[0]
    tasks, G = [sums, calc], 2  # the single-turn task first: rows come back in the prompts' order anyway
    rollout = PalestraRollout(domains, G, lambda: [(1, tasks)], sampler=ScriptedSampler(tok))
    model.train()
    out = rollout([t.prompt for t in tasks for _ in range(G)], _trainer(model, tok))

    assert set(out) == {"prompt_ids", "completion_ids", "env_mask", "logprobs", "palestra_text"}
    assert all(len(values) == 4 for values in out.values())
    assert out["prompt_ids"] == [encode_prompt(tok, t.prompt) for t in tasks for _ in range(G)]
    call = tok(CALL, add_special_tokens=False)["input_ids"]
    answer = tok(ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    tool = tool_message_tokens(tok, "3")  # the environment's answer to add(1, 2), in the template's markup
    for row in (2, 3):
        # the model's call, the end of turn the runner adds, the tool's answer, the model's answer
        assert out["completion_ids"][row] == call + [tok.eos_token_id] + tool + answer
        assert out["env_mask"][row] == [1] * len(call) + [0] * (1 + len(tool)) + [1] * len(answer)
        transcript = json.loads(out["palestra_text"][row])
        assert [m["role"] for m in transcript] == ["assistant", "tool", "assistant"]
        assert transcript[1]["content"] == "3" and transcript[2]["content"] == ANSWER
    for row in (0, 1):  # a single completion: every token the model's, at most TRL's budget
        ids = out["completion_ids"][row]
        assert out["env_mask"][row] == [1] * len(ids) and 0 < len(ids) <= 12
        assert out["palestra_text"][row] == tok.decode([t for t in ids if t != tok.eos_token_id])

    # the log-probs are the model's at TRL's temperature where the model chose, 0 where it did not
    for row in (0, 2):
        ids, mask = out["completion_ids"][row], out["env_mask"][row]
        sequence = torch.tensor([out["prompt_ids"][row] + ids])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, len(out["prompt_ids"][row]) - 1:-1] / 0.9
        expected = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(out["logprobs"][row]), expected * torch.tensor(mask), atol=1e-4,
                                   rtol=1e-4)
    assert model.training  # sampled in eval mode, then left as it was found


def test_the_rollout_refuses_prompts_it_did_not_hand_out_and_settings_it_lacks(tiny):
    model, tok = tiny
    domains = load_all(["arithmetic"])
    task = domains["arithmetic"].sample(1, 1, random.Random(0))[0]
    rollout = PalestraRollout(domains, 2, lambda: [(1, [task])])
    with pytest.raises(ValueError, match="no plan step this curriculum handed out, each repeated num_generations=2"):
        rollout([task.prompt], _trainer(model, tok))  # not repeated: not the batch TRL would give
    rollout([task.prompt] * 2, _trainer(model, tok))
    with pytest.raises(ValueError, match="no plan step"):  # each step is played once
        rollout([task.prompt] * 2, _trainer(model, tok))
    for changes, message in (({"use_vllm": True}, "set GRPOConfig\\(use_vllm=False\\)"),
                             ({"top_k": 50}, "temperature and top_p only, not top_k=50")):
        with pytest.raises(ValueError, match=message) as info:
            rollout([task.prompt] * 2, _trainer(model, tok, **changes))
        assert "\n" not in str(info.value)


EIGHT = ["arithmetic", "linear_equations", "fractions", "code_functions", "code_lists", "tool_calculator",
         "tool_kv_store", "tool_lookup"]  # the main job's built-in domains (conf/config.yaml)


def test_trl_trains_on_tool_episodes_mixed_with_single_completions(tmp_path, tiny, monkeypatch):
    """2 TRL steps of 8 prompts x 2 completions over the eight built-in domains, three of them tool
    domains: every group is recorded once, each episode's result is its verifier's verdict on its
    transcript."""
    import trl
    from transformers import AutoModelForCausalLM

    from curriculum.store import StatsStore
    from domains.api import Task
    from trainer.integrations.trl import TRLCurriculum

    torch.manual_seed(0)
    _, tok = tiny
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL warns that rollout_func is experimental
    prompts, group, steps = 8, 2, 2
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=prompts * group, num_generations=group,
        max_completion_length=8, beta=0.0, learning_rate=1e-3, max_steps=steps, logging_steps=1, seed=0,
        shuffle_dataset=False, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True)
    url = f"sqlite:///{tmp_path / 'palestra.db'}"
    curriculum = TRLCurriculum.build(EIGHT, args, policy={"type": "uniform"},
                                     store_url=url, verifier_workers=1)
    played: list[dict] = []
    rollout = curriculum.rollout_func(sampler=ScriptedSampler(tok))

    def rollout_func(prompts, trainer):  # what TRL gets back
        out = rollout(prompts, trainer)
        played.append(out)
        return out

    with curriculum:
        trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=args,
                                  reward_funcs=curriculum.palestra_reward, train_dataset=curriculum.dataset(),
                                  processing_class=tok, rollout_func=rollout_func, callbacks=[curriculum.callback()])
        trainer.train()
    run = curriculum.run_id

    assert trainer.state.global_step == steps
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == steps and all(math.isfinite(h["loss"]) for h in logged)
    assert len(played) == steps and all(len(out["completion_ids"]) == prompts * group for out in played)
    assert any(0 in mask for out in played for mask in out["env_mask"])  # tool tokens went into TRL's batches

    with StatsStore(url) as store:
        assert curriculum.recorded_steps == list(range(1, steps + 1))
        for step in range(1, steps + 1):
            assert len(store.results(run, step)) == prompts * group  # every completion once
        assert {row["domain"] for row in store.domain_summary(run) if row["attempts"]} == set(EIGHT)
        tasks = {i: Task.from_json(t) for i, t in store.tasks(run).items()}
        episodes = [r for r in store.results(run) if curriculum.domains[r["domain"]].multi_turn]
        assert {r["domain"] for r in episodes} == {"tool_calculator", "tool_kv_store", "tool_lookup"}
        for result in episodes:  # the stored text is the episode's transcript, and its reward the verifier's
            transcript = json.loads(result["completion"])
            assert [m["role"] for m in transcript] == ["assistant", "tool", "assistant"]
            verdict = curriculum.domains[result["domain"]].verify(tasks[result["task_id"]], result["completion"])
            assert result["reward"] == verdict.reward
        assert store.run(run)["status"] == "finished"
