"""TRL's ``rollout_func`` for a Palestra curriculum: each prompt of a generation batch is played by
Palestra's own sampler on TRL's current model — a whole tool episode for a multi-turn domain, one
completion otherwise — so tool domains and single-turn ones mix in one ``GRPOTrainer`` run.

    with TRLCurriculum.build(["arithmetic", "tool_calculator"], args) as curriculum:
        trainer = GRPOTrainer(model, args=args, reward_funcs=curriculum.palestra_reward,
                              train_dataset=curriculum.dataset(), rollout_func=curriculum.rollout_func(),
                              callbacks=[curriculum.callback()])

What TRL hands over and takes back (TRL 1.16, ``GRPOTrainer._generate``). It calls the function once
per generation batch with that batch's prompts, each already repeated ``num_generations`` times (the
repeats are made by TRL's data loader, before the call: its docstring's "no duplication" means the
function must not repeat them again), and takes one completion per prompt row, in order:

- ``prompt_ids``: the prompt as the chat template renders it (Palestra's ``encode_prompt``);
- ``completion_ids``: everything after the prompt; for an episode the assistant turns *and* the tool
  responses, one transcript, laid out as Palestra's trainer trains on it (``run_episodes``);
- ``env_mask``: 1 on the tokens the policy chose, 0 on the others: each tool response with its
  template markup, and the end-of-turn token the episode runner closes a tool-call turn with. TRL
  multiplies it into the loss mask, so the model is never trained to predict the environment;
- ``logprobs``: each token's log-prob under the distribution it was sampled from (the model at TRL's
  temperature; top-p's renormalisation aside), from one forward pass after sampling, since
  Palestra's sampler keeps none; 0 where ``env_mask`` is 0, as TRL's own tool loop writes them. TRL
  reads them only in its vLLM importance-sampling correction and its off-policy mask, both over
  the masked tokens;
- ``palestra_text``, which TRL hands on to ``palestra_reward``: what the verifier grades, an
  episode's JSON transcript (the verifier replays the calls) or a completion's text. TRL's own
  ``completions`` decode the tool responses into the model's turns, which no verifier could grade.

Which plan step a batch is: the rows' ``palestra_step`` column does not reach a rollout function, so
it is the earliest step handed out and not yet sampled whose prompts, repeated ``num_generations``
times, are the batch's (TRL reads its batches in order). On several processes each rank is called
with its contiguous slice of the generation batch (``trl_ranks``): the rank's index and the slice's
length say where the slice starts, and the rank plays those rows only (a group may straddle two ranks).

Settings: TRL's ``temperature`` and ``top_p``; ``max_completion_length`` is the token budget of a
completion or of one assistant turn (a domain's own ``max_new_tokens`` first, as in Palestra's
trainer); an episode's transcript is capped at ``max_episode_tokens`` and its turns at the domain's
``max_turns``. The noise is seeded from TRL's seed and the plan step. TRL's other sampling settings
(``top_k``, ``min_p``, ``repetition_penalty``, ``generation_kwargs``) and ``use_vllm`` are refused in
one line: Palestra's sampler does not have them, and vLLM would hold a second copy of the model for nothing.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from domains.api import Domain, Task
from trainer.config import SamplingConfig
from trainer.sampling.batch import chunk_seed, generation_chunks
from trainer.sampling.episodes import by_rollout, group_rows, sample_rows
from trainer.sampling.rollout import Rollout, Sampler, generate
from trainer.update.logprobs import sequence_logprobs

PlanSteps = Callable[[], list[tuple[int, list[Task]]]]  # the plan steps handed to TRL and not yet recorded
FIELDS = ("prompt_ids", "completion_ids", "env_mask", "logprobs", "palestra_text")
_DEFAULTS = SamplingConfig()  # Palestra's trainer's defaults, for what TRL has no setting of
# TRL's sampling settings Palestra's sampler lacks, with the values that mean "off"
_UNSUPPORTED = {"top_k": (0, -1, None), "min_p": (None, 0.0), "repetition_penalty": (1.0, None),
                "generation_kwargs": (None, {})}


class PalestraRollout:
    """``GRPOTrainer(rollout_func=...)``: plays each plan step handed to TRL with Palestra's sampler
    (see the module docstring); made by ``TRLCurriculum.rollout_func()``.

    ``sampler``: Palestra's eager one by default, or any ``Sampler`` (``CapturedSampler`` on a GPU);
    ``rollout_batch_size``: sequences sampled together; ``keep_cache``: an episode's next turn
    continues its keys and values (the eager sampler only)."""

    def __init__(self, domains: dict[str, Domain], group_size: int, handed_out: PlanSteps, *,
                 max_episode_tokens: int = _DEFAULTS.max_episode_tokens,
                 rollout_batch_size: int = _DEFAULTS.rollout_batch_size, sampler: Sampler = generate,
                 keep_cache: bool = _DEFAULTS.episode_cache) -> None:
        self.domains, self.group_size, self.handed_out = domains, group_size, handed_out
        self.max_episode_tokens, self.rollout_batch_size = max_episode_tokens, rollout_batch_size
        self.sampler, self.keep_cache = sampler, keep_cache
        self._sampled: set[int] = set()  # steps played already: TRL generates each batch once

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        check_trainer(trainer)
        accelerator = trainer.accelerator
        rank, processes = getattr(accelerator, "process_index", 0), getattr(accelerator, "num_processes", 1)
        step, rows = self._plan_step(prompts, rank, processes)
        model = trainer.accelerator.unwrap_model(trainer.model)
        training = model.training
        model.eval()
        try:
            with torch.no_grad(), trainer.accelerator.autocast():
                played = self._play(model, trainer.processing_class, trainer.args, step, rows, rank * len(prompts))
        finally:
            model.train(training)
        return {key: [row[key] for row in played] for key in FIELDS}

    def _plan_step(self, prompts: list, rank: int, processes: int) -> tuple[int, list[Task]]:
        """The plan step whose rows (each task repeated ``num_generations`` times) are ``prompts``
        on ``rank``'s share (one of ``processes`` equal contiguous slices), and the task of each row."""
        handed_out = self.handed_out()
        self._sampled &= {step for step, _ in handed_out}  # recorded steps come back no more
        n = len(prompts)
        for step, tasks in handed_out:
            rows = group_rows(tasks, self.group_size)
            share = rows[rank * n:(rank + 1) * n]
            if step not in self._sampled and len(rows) == n * processes and [t.prompt for t in share] == prompts:
                self._sampled.add(step)
                return step, share
        raise ValueError(f"rollout_func got {len(prompts)} prompts that are no plan step this curriculum handed out, "
                         f"each repeated num_generations={self.group_size} times: it plays curriculum.dataset()'s "
                         "batches only (not TRL's evaluation)")

    def _play(self, model: torch.nn.Module, tokenizer, args: Any, step: int, rows: list[Task],
              offset: int) -> list[dict]:
        """TRL's fields for every row (``rows[i]`` is the task of the step's row ``offset + i``),
        sampled in batches of one rollout kind as Palestra's trainer samples them."""
        G, device = self.group_size, next(model.parameters()).device
        order = kind_order(rows, self.domains)
        played: list[dict] = [{} for _ in rows]
        # batches of whole groups where the rows are whole groups (one process), as Palestra's trainer batches
        chunks = generation_chunks([rows[i] for i in order], max(1, self.rollout_batch_size // G) * G, self.domains)
        for first, chunk in chunks:
            # seeded by where the batch sits in the step, so two ranks' batches draw different noise
            noise = torch.Generator(device=device).manual_seed(chunk_seed(int(args.seed), step, 0, offset + first))
            rollout, texts = sample_rows(
                model, tokenizer, chunk, self.domains,
                max_new_tokens=args.max_completion_length, max_episode_tokens=self.max_episode_tokens,
                temperature=args.temperature, top_p=args.top_p, generator=noise, sampler=self.sampler,
                keep_cache=self.keep_cache)
            logps, _ = sequence_logprobs(model, rollout.sequences.to(device), rollout.attention_mask.to(device),
                                         rollout.prompt_width, temperature=args.temperature)
            episodes = self.domains[chunk[0].domain].multi_turn
            for j, row in enumerate(trl_rows(rollout, logps, texts, episodes)):
                played[order[first + j]] = row
        return played


def trl_rows(rollout: Rollout, logprobs: torch.Tensor, texts: list[str], episodes: bool) -> list[dict]:
    """TRL's fields of each row of one sampled batch; ``logprobs`` [B, L] of its completion tokens."""
    width = rollout.prompt_width
    if episodes:  # an episode's token list is its whole transcript, tool responses included
        lengths = [len(ids) for ids in rollout.completion_ids]
    else:  # a completion's counted tokens run up to and including its end token
        lengths = rollout.completion_mask.sum(dim=1).tolist()
    rows = []
    for b, n in enumerate(lengths):
        chosen = rollout.completion_mask[b, :n].cpu()  # for an episode: 0 on what the environment added
        prompt = rollout.sequences[b, :width][rollout.attention_mask[b, :width].bool()]
        rows.append({"prompt_ids": prompt.tolist(), "completion_ids": rollout.completion_tokens[b, :n].tolist(),
                     "env_mask": chosen.tolist(), "logprobs": (logprobs[b, :n].float().cpu() * chosen).tolist(),
                     "palestra_text": texts[b]})
    return rows


def kind_order(tasks: list[Task], domains: dict[str, Domain]) -> list[int]:
    """The positions of ``tasks`` regrouped into runs of one rollout kind, in ``by_rollout``'s order:
    what ``generation_chunks`` cuts into generation batches."""
    kind = {id(task): k for k, run in enumerate(by_rollout(tasks, domains)) for task in run}
    return sorted(range(len(tasks)), key=lambda p: kind[id(tasks[p])])  # stable: the order within a kind stays


def check_trainer(trainer: Any) -> None:
    """One line for a TRL setting Palestra's sampler cannot honour."""
    if getattr(trainer, "use_vllm", False):
        raise ValueError("rollout_func samples with Palestra's sampler on the trainer's model: set "
                         "GRPOConfig(use_vllm=False)")
    changed = [f"{key}={getattr(trainer.args, key, None)!r}" for key, off in _UNSUPPORTED.items()
               if getattr(trainer.args, key, None) not in off]
    if changed:
        raise ValueError(f"rollout_func's sampler takes temperature and top_p only, not {', '.join(changed)}")
