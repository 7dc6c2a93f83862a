"""The rollouts of one step: P tasks x G completions, their verdicts and rewards; how a step's tasks
are cut into generation chunks, and which groups dynamic sampling keeps."""
from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import Counter
from dataclasses import dataclass

import torch

from curriculum.types import rewards_agree
from domains.api import Domain, Task
from domains.verify.pool import Verdict
from trainer.sampling.episodes import by_rollout
from trainer.sampling.rollout import Rollout


@dataclass
class StepBatch:
    tasks: list[Task]  # [P]
    group_size: int  # G
    rollout: Rollout  # B = P*G rows; row p*G + g is completion g of task p
    texts: list[str]  # [B] decoded completions
    verdicts: list[Verdict]  # [B]

    @property
    def rewards(self) -> torch.Tensor:  # [P, G]
        flat = torch.tensor([v.result.reward for v in self.verdicts], dtype=torch.float32)
        return flat.view(len(self.tasks), self.group_size)

    def zero_variance(self) -> torch.Tensor:  # [P] bool: every completion got the same reward
        return torch.from_numpy(rewards_agree(self.rewards.numpy()))

    def select(self, groups: list[int]) -> "StepBatch":
        rows = [p * self.group_size + g for p in groups for g in range(self.group_size)]
        return StepBatch(
            tasks=[self.tasks[p] for p in groups], group_size=self.group_size,
            rollout=select_rows(self.rollout, rows), texts=[self.texts[r] for r in rows],
            verdicts=[self.verdicts[r] for r in rows],
        )


def select_rows(rollout: Rollout, rows: list[int]) -> Rollout:
    index = torch.tensor(rows, dtype=torch.long)
    return Rollout(
        sequences=rollout.sequences[index], attention_mask=rollout.attention_mask[index],
        completion_mask=rollout.completion_mask[index], prompt_width=rollout.prompt_width,
        truncated=rollout.truncated[index], completion_ids=[rollout.completion_ids[r] for r in rows],
        logprobs=rollout.logprobs[index] if rollout.logprobs is not None else None,
    )


def concat(batches: list[StepBatch], pad_id: int) -> StepBatch:
    """Join batches whose prompt and completion widths differ (re-padding both sides)."""
    if len(batches) == 1:
        return batches[0]
    width = max(b.rollout.prompt_width for b in batches)
    length = max(b.rollout.completion_mask.shape[1] for b in batches)
    parts = [_repad(b.rollout, width, length, pad_id) for b in batches]
    # behaviour log-probs are joined only when every part has them (one sampler made the whole step)
    with_logprobs = all(p.logprobs is not None for p in parts)
    rollout = Rollout(
        sequences=torch.cat([p.sequences for p in parts]), attention_mask=torch.cat([p.attention_mask for p in parts]),
        completion_mask=torch.cat([p.completion_mask for p in parts]), prompt_width=width,
        truncated=torch.cat([p.truncated for p in parts]),
        completion_ids=[ids for p in parts for ids in p.completion_ids],
        logprobs=torch.cat([p.logprobs for p in parts]) if with_logprobs else None,
    )
    return StepBatch(
        tasks=[t for b in batches for t in b.tasks], group_size=batches[0].group_size, rollout=rollout,
        texts=[t for b in batches for t in b.texts], verdicts=[v for b in batches for v in b.verdicts],
    )


def _repad(r: Rollout, width: int, length: int, pad_id: int) -> Rollout:
    rows = r.sequences.shape[0]
    left, right = width - r.prompt_width, length - r.completion_mask.shape[1]

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([
            torch.full((rows, left), value, dtype=t.dtype, device=t.device), t,
            torch.full((rows, right), value, dtype=t.dtype, device=t.device),
        ], dim=1)

    completion_mask = torch.cat(
        [r.completion_mask, torch.zeros((rows, right), dtype=r.completion_mask.dtype, device=r.completion_mask.device)], dim=1
    )
    logprobs = (torch.cat([r.logprobs, torch.zeros((rows, right), dtype=r.logprobs.dtype, device=r.logprobs.device)],
                          dim=1) if r.logprobs is not None else None)
    attention = pad(r.attention_mask, 0)
    attention[:, width + r.completion_mask.shape[1]:] = 1  # padding after completions is harmless
    return Rollout(
        sequences=pad(r.sequences, pad_id), attention_mask=attention, completion_mask=completion_mask,
        prompt_width=width, truncated=r.truncated, completion_ids=r.completion_ids, logprobs=logprobs,
    )


def generation_chunks(tasks: list[Task], size: int, domains: dict[str, Domain]) -> list[tuple[int, list[Task]]]:
    """(position of the first task, tasks) for generation batches of at most ``size`` tasks of one
    rollout kind; ``tasks`` come in runs of one kind, so each run starts where the previous one ended."""
    chunks, start = [], 0
    for kind in by_rollout(tasks, domains):
        chunks += [(start + first, kind[first:first + size]) for first in range(0, len(kind), size)]
        start += len(kind)
    return chunks


def chunk_seed(seed: int, step: int, round_: int, position: int) -> int:
    """A 63-bit seed for one generation batch, well mixed, from the run seed and where the batch sits."""
    digest = hashlib.blake2b(f"{seed}/{step}/{round_}/{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def rollout_on_cpu(r: Rollout) -> Rollout:
    """Rollouts are small; on the CPU they can be pickled to other ranks and joined with tool
    episodes (assembled on the CPU) whatever device generated them."""
    return dataclasses.replace(r, sequences=r.sequences.cpu(), attention_mask=r.attention_mask.cpu(),
                               completion_mask=r.completion_mask.cpu(), truncated=r.truncated.cpu(),
                               logprobs=r.logprobs.cpu() if r.logprobs is not None else None)


def varied_groups(batch: StepBatch) -> list[int]:
    """The groups whose completions did not all earn the same reward: what dynamic sampling keeps."""
    return [p for p, flat in enumerate(batch.zero_variance().tolist()) if not flat]


def planned_first(batch: StepBatch, counts: dict[tuple[str, int], int], total: int, rng: random.Random) -> list[int]:
    """The varied groups that train, at most ``total``: all of them when they fit; otherwise (an
    oversampled round) each (domain, level)'s planned number first, so the trained share follows
    the plan wherever it can, and a draw from the others for what is left."""
    varied = varied_groups(batch)
    if len(varied) <= total:
        return varied
    room, planned, rest = Counter(counts), [], []
    for p in varied:
        slot = (batch.tasks[p].domain, batch.tasks[p].level)
        (planned if room[slot] > 0 else rest).append(p)
        room[slot] -= 1
    planned = planned[:total]
    return sorted(planned + rng.sample(rest, min(total - len(planned), len(rest))))


def shrink_counts(counts: Counter, total: int) -> dict[tuple[str, int], int]:
    """Take ``total`` slots from ``counts`` in proportion, deterministically."""
    slots = [slot for slot, n in sorted(counts.items()) for _ in range(n)]
    step = max(1, len(slots) // total)
    picked = Counter(slots[::step][:total])
    return dict(picked)
