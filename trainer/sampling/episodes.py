"""Multi-turn rollouts for tool domains: the model calls tools, the environment answers.

All live episodes of a batch generate together; a turn ends at end-of-turn (EOS) or at a complete
tool call. The environment's response is appended as a tool message and masked out of the loss
(the policy did not choose those tokens). The transcript — the assistant turns and tool messages
after the prompt, as JSON — is what the verifier sees; it re-executes the calls itself.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import torch

from domains.api import Domain, Task, led_members
from trainer.models.loading import encode_prompt, end_token_ids
from trainer.sampling.rollout import Rollout, Sampler, assemble, generate, left_pad, stop_text


@dataclass
class Episode:
    task: Task
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # everything after the prompt
    policy_mask: list[int] = field(default_factory=list)  # 1 where the policy chose the token
    logprobs: list[float] = field(default_factory=list)  # the sampler's log-prob of each token (0: not the policy's)
    messages: list[dict] = field(default_factory=list)
    max_turns: int = 1
    turns: int = 0
    done: bool = False
    truncated: bool = False


def tool_message_tokens(tokenizer, content: str) -> list[int]:
    """Tokens that append a tool message and open the next assistant turn, via the chat template.

    Rendered as the difference between a conversation with and without the tool message, so the
    template's own markup is used whatever model this is."""
    base = [{"role": "user", "content": "."}]
    prefix = encode_prompt(tokenizer, base, add_generation_prompt=False)
    full = encode_prompt(tokenizer, base + [{"role": "tool", "content": content}])
    if full[:len(prefix)] != prefix:
        raise ValueError("the chat template renders a tool message by rewriting earlier turns; unsupported")
    return full[len(prefix):]


def run_episodes(
    model: torch.nn.Module, tokenizer, tasks: list[Task], domains: dict[str, Domain], *, max_new_tokens: int,
    max_total_tokens: int, temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None,
    sampler: Sampler = generate, keep_cache: bool = True, with_logprobs: bool = False,
) -> tuple[Rollout, list[str]]:
    """Play one episode per task (repeat a task G times for a group); returns the rollout and the
    JSON transcripts, row for row. A turn ends at end-of-turn or at the domains' ``stop_text``, which
    the tasks' domains must share (``by_rollout`` groups them so).

    With ``keep_cache`` and the trainer's own sampler, each turn continues the episodes' keys and
    values: only the tool's answer (and the turn's last token) is encoded for the next turn, not
    the whole transcript. Other samplers re-encode it (vLLM caches prefixes itself)."""
    ends = {domains[t.domain].stop_text for t in tasks}
    if len(ends) > 1:
        raise ValueError(f"one batch of episodes needs one stop text, not {sorted(map(repr, ends))}")
    end = ends.pop() if ends else None
    episodes = [Episode(t, encode_prompt(tokenizer, t.prompt), max_turns=domains[t.domain].config.max_turns)
                for t in tasks]
    envs = [domains[t.domain].environment(t) for t in tasks]
    stop = stop_text(tokenizer, end) if end else None
    eos = end_token_ids(model, tokenizer)
    for episode, env in zip(episodes, envs):
        if episode.task.meta.get("lead"):
            _lead(episode, env, episode.task.meta["lead"], tokenizer, max_total_tokens, eos)
    carry = keep_cache and sampler is generate
    context, played = None, []  # the rows the context holds: the episodes of the last turn
    while True:
        live = [i for i, e in enumerate(episodes) if not e.done]
        if not live:
            break
        if context is not None:
            row_of = {episode: row for row, episode in enumerate(played)}
            context = context.select([row_of[i] for i in live])
        # one budget for the batch, sized for its roomiest episode; _advance ends each episode at its own
        budget = max(1, min(max_new_tokens, max(max_total_tokens - len(episodes[i].tokens) for i in live)))
        turn = sampler(model, [episodes[i].prompt + episodes[i].tokens for i in live], max_new_tokens=budget,
                       eos_id=eos, pad_id=tokenizer.pad_token_id, temperature=temperature, top_p=top_p,
                       generator=generator, stop=stop, **(dict(context=context, keep_context=True) if carry else {}),
                       **(dict(with_logprobs=True) if with_logprobs else {}))
        context, played = turn.context, live
        lengths = turn.completion_mask.sum(dim=1).tolist()
        for row, i in enumerate(live):
            _advance(episodes[i], envs[i], turn, row, lengths[row], tokenizer, max_total_tokens, eos)
    return _to_rollout(episodes, tokenizer.pad_token_id, with_logprobs), [json.dumps(e.messages) for e in episodes]


def _advance(ep: Episode, env, turn: Rollout, row: int, length: int, tokenizer, max_total_tokens: int,
             ends: tuple[int, ...]) -> None:
    """Take the sampled turn of ``row`` into the episode, then let the environment answer it."""
    room = max_total_tokens - len(ep.tokens)
    over = length > room  # the turn ran past this episode's own token budget: cut it there
    chosen = turn.completion_tokens[row, :min(length, room)].tolist()
    # the behaviour log-probs of the policy's own tokens; the tool's get 0 (below)
    logprobs = turn.logprobs[row, :len(chosen)].tolist() if turn.logprobs is not None else []
    text = tokenizer.decode(chosen if over else turn.completion_ids[row], skip_special_tokens=False)
    _turn(ep, env, chosen, logprobs, text, over or bool(turn.truncated[row]), tokenizer, max_total_tokens, ends)


def _lead(ep: Episode, env, text: str, tokenizer, max_total_tokens: int, ends: tuple[int, ...]) -> None:
    """Write ``text`` as the episode's first assistant turn (a led member of a group). Its tokens
    count as the policy's, so the update can raise them where led members beat the others; their
    behaviour log-prob is NaN, no sampler's (the async update gives them weight 1). A lead longer
    than the episode's budget is cut there, as a sampled turn is, and ends the episode."""
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    chosen = tokens[:max_total_tokens]
    cut = len(chosen) < len(tokens)
    if cut:
        text = tokenizer.decode(chosen, skip_special_tokens=False)
    _turn(ep, env, chosen, [math.nan] * len(chosen), text, cut, tokenizer, max_total_tokens, ends)


def _turn(ep: Episode, env, chosen: list[int], logprobs: list[float], text: str, cut: bool, tokenizer,
          max_total_tokens: int, ends: tuple[int, ...]) -> None:
    """An assistant turn (``chosen``, decoded as ``text``) into the episode, and the environment's
    answer after it; ``cut``: the turn was cut at a token budget, which ends the episode."""
    ep.tokens += chosen
    ep.policy_mask += [1] * len(chosen)
    ep.logprobs += logprobs
    ep.messages.append({"role": "assistant", "content": text})
    ep.turns += 1
    result = env.step(text)
    if cut or len(ep.tokens) >= max_total_tokens:
        ep.done, ep.truncated = True, True
        return
    if result.done or result.observation is None or ep.turns >= ep.max_turns:
        ep.done = True
        return
    ep.messages.append({"role": "tool", "content": result.observation})
    if chosen and chosen[-1] not in ends:
        # the turn stopped at the closing tag: close it as the template would, then the tool speaks
        ep.tokens.append(tokenizer.eos_token_id)
        ep.policy_mask.append(0)
        ep.logprobs.append(0.0)
    response = tool_message_tokens(tokenizer, result.observation)
    ep.tokens += response
    ep.policy_mask += [0] * len(response)
    ep.logprobs += [0.0] * len(response)
    if len(ep.tokens) >= max_total_tokens:
        ep.done, ep.truncated = True, True


def _to_rollout(episodes: list[Episode], pad_id: int, with_logprobs: bool = False) -> Rollout:
    ids, prompt_mask = left_pad([e.prompt for e in episodes], pad_id)
    width = max(1, max(len(e.tokens) for e in episodes))
    completion = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(episodes), width), dtype=torch.long)
    for row, e in enumerate(episodes):
        completion[row, :len(e.tokens)] = torch.tensor(e.tokens, dtype=torch.long)
        mask[row, :len(e.policy_mask)] = torch.tensor(e.policy_mask, dtype=torch.long)
    lengths = torch.tensor([len(e.tokens) for e in episodes])
    ended = torch.tensor([not e.truncated for e in episodes])
    rollout = assemble(ids, prompt_mask, completion, lengths, ended, eos_id=-1)
    rollout.completion_mask = mask  # tool tokens are context, not choices: excluded from the loss
    if with_logprobs:
        rollout.logprobs = torch.zeros((len(episodes), width))
        for row, e in enumerate(episodes):
            rollout.logprobs[row, :len(e.logprobs)] = torch.tensor(e.logprobs, dtype=torch.float32)
    return rollout


def sample_rows(
    model: torch.nn.Module, tokenizer, rows: list[Task], domains: dict[str, Domain], *, max_new_tokens: int,
    max_episode_tokens: int, temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None,
    sampler: Sampler = generate, keep_cache: bool = True, with_logprobs: bool = False,
) -> tuple[Rollout, list[str]]:
    """One completion per row: a single generation, or a whole episode for tool domains.

    ``rows`` must share one rollout kind (see ``by_rollout``); their domains' own ``max_new_tokens``
    option, when set, replaces the trainer's budget."""
    domain = domains[rows[0].domain]
    budget = domain.config.max_new_tokens or max_new_tokens
    if domain.multi_turn:
        return run_episodes(model, tokenizer, rows, domains, max_new_tokens=budget,
                            max_total_tokens=max_episode_tokens, temperature=temperature, top_p=top_p,
                            generator=generator, sampler=sampler, keep_cache=keep_cache, with_logprobs=with_logprobs)
    rollout = sampler(model, [encode_prompt(tokenizer, t.prompt) for t in rows], max_new_tokens=budget,
                       eos_id=end_token_ids(model, tokenizer), pad_id=tokenizer.pad_token_id, temperature=temperature,
                       top_p=top_p, generator=generator, **(dict(with_logprobs=True) if with_logprobs else {}))
    return rollout, tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=False)


def group_rows(tasks: list[Task], group_size: int) -> list[Task]:
    """``group_size`` rows per task, a group's rows together. A led task (``meta["lead"]``) keeps its
    lead on its first ``led_members`` rows and is played plain, under the same id, on the rest."""
    rows = []
    for task in tasks:
        if not task.meta.get("lead"):
            rows += [task] * group_size
            continue
        led = led_members(task, group_size)
        plain = Task(domain=task.domain, level=task.level, prompt=task.prompt, payload=task.payload,
                     meta={k: v for k, v in task.meta.items() if k != "lead"}, id=task.id)
        rows += [task] * led + [plain] * (group_size - led)
    return rows


def by_rollout(tasks: list[Task], domains: dict[str, Domain]) -> list[list[Task]]:
    """Tasks grouped by how they are sampled — single completions or tool episodes, under which
    token budget and, for episodes, which stop text — each group in the original order. A generation
    batch needs one kind and one budget, not one domain: three math domains then decode together
    instead of one after another, which on a CPU, where a decoding step costs about the same for 8
    rows as for 64, saves most of the generation time. Single completions come first (by budget, the trainer's own first) and tool
    episodes last, so the verification of the earlier groups (a sandbox run per code completion)
    overlaps the longest generation."""
    groups: dict[tuple[bool, int, str], list[Task]] = {}
    for task in tasks:
        domain = domains[task.domain]
        end = (domain.stop_text or "") if domain.multi_turn else ""
        groups.setdefault((domain.multi_turn, domain.config.max_new_tokens or 0, end), []).append(task)
    return [groups[kind] for kind in sorted(groups)]


def transcript_tokens(tokenizer, transcript: str, turn_end: str | None) -> tuple[list[int], list[int]]:
    """A reference transcript (JSON messages after the prompt) -> tokens and policy mask, laid out
    exactly as ``run_episodes`` lays out a played episode of a domain whose ``stop_text`` is
    ``turn_end`` (for the SFT warm start)."""
    tokens: list[int] = []
    mask: list[int] = []
    for message in json.loads(transcript):
        if message["role"] == "assistant":
            text = tokenizer(message["content"], add_special_tokens=False)["input_ids"]
            ends_with_call = bool(turn_end) and message["content"].rstrip().endswith(turn_end)
            tokens += text + [tokenizer.eos_token_id]
            # after a tool call the rollout stops at the closing tag and closes the turn itself
            mask += [1] * len(text) + [0 if ends_with_call else 1]
        else:
            response = tool_message_tokens(tokenizer, message["content"])
            tokens += response
            mask += [0] * len(response)
    return tokens, mask
