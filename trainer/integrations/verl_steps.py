"""The plan steps handed to verl and the batches that come back: one verl train batch is one
Palestra plan step, recorded once all its groups are in.

``VerlSteps`` opens a step when verl's data loader asks for the first prompt of a batch — it asks
the Curriculum for the plan and draws its tasks, one per slot of the batch — and records a step
from the ``DataProto`` verl hands its hooks after the update (rows = prompts × rollout.n, their
order shuffled by verl's batch balancing). Each row names its plan step and slot in ``extra_info``;
its completions are grouped by verl's ``uid`` (one per prompt); its reward is the ``score`` our
reward function returned (else the row's summed ``token_level_scores``), its verdict the
``acc``/``palestra_status`` it returned. Recording is as the TRL integration does it: Palestra's
group advantages, one ``Curriculum.record`` per step.

Recorded once: a step is recorded when every slot of it has its group (or when a batch carries a
later step: verl trains its batches in order, so it gets no more), and never again. Rows of a
recorded step, and rows whose ``uid`` was already taken, are skipped, so verl 0.7.1 may hand the
same batch to the sampler's ``update`` and to the dataset's ``on_batch_end`` (it does both).
Nothing here imports verl: a batch is read through ``batch.batch`` and ``batch.non_tensor_batch``.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from curriculum.curriculum import Curriculum
from curriculum.types import Plan
from domains.api import Status, Task, VerifyResult
from domains.verify.pool import Verdict
from trainer.integrations.recording import record_step


@dataclass
class _OpenStep:
    plan: Plan
    tasks: list[Task]  # [P] slot p is tasks[p]
    groups: dict[int, list[tuple[str, Verdict]]] = field(default_factory=dict)  # slot -> (text, verdict) x G


@dataclass
class _Row:
    uid: str
    step: int
    slot: int
    task_id: str
    text: str
    verdict: Verdict


class VerlSteps:
    """Hands out a run's plan steps slot by slot and records them from verl's batches."""

    def __init__(self, curriculum: Curriculum, prompts_per_step: int, steps: int, *, group_size: int | None = None,
                 advantage_std: str = "group", tokenizer: Any = None, owns_store: bool = False) -> None:
        self.curriculum, self.prompts_per_step, self.steps = curriculum, prompts_per_step, steps
        self.group_size, self.advantage_std, self.tokenizer = group_size, advantage_std, tokenizer
        self._owns_store = owns_store
        self._open: dict[int, _OpenStep] = {}
        self._handing: tuple[int, set[int]] | None = None  # the step being handed out, its slots asked for
        self._taken: set[tuple[str, int, int]] = set()  # groups taken: (verl's uid, one per prompt; step; slot)
        self._recorded: set[int] = set()
        self.recorded_steps: list[int] = []
        self.plans: dict[int, Plan] = {}  # every step handed out, by step
        self.finished = False
        self._lock = threading.RLock()

    # -- out ------------------------------------------------------------------------------------------
    @property
    def next_step(self) -> int:
        return self._handing[0] + 1 if self._handing else 1

    def task_for(self, slot: int) -> tuple[int, Task]:
        """The task of ``slot`` in the step being handed out; a slot asked for again starts the next step."""
        with self._lock:
            if self._handing is None or slot in self._handing[1]:
                self._open_step(self.next_step)
            step, asked = self._handing
            asked.add(slot)
            return step, self._open[step].tasks[slot]

    def _open_step(self, step: int) -> None:
        if step > self.steps:
            raise RuntimeError(f"verl asked for plan step {step} of a run of {self.steps} (data.palestra.steps): "
                               "set trainer.total_epochs=1 and no more training steps than that")
        plan = self.curriculum.plan(step)
        tasks = self.curriculum.draw(plan.counts, step=step)
        if len(tasks) != self.prompts_per_step:
            raise RuntimeError(f"plan step {step} drew {len(tasks)} tasks for {self.prompts_per_step} slots")
        self._open[step] = _OpenStep(plan, tasks)
        self.plans[step] = plan
        self._handing = (step, set())

    # -- back -----------------------------------------------------------------------------------------
    def record_batch(self, batch: Any) -> list[int]:
        """Take a batch's groups; record (in step order) the steps that will get no more. Returns them."""
        with self._lock:
            rows = batch_rows(batch, self.tokenizer, self.curriculum.run_id)
            for uid, group in _by_uid(rows).items():
                self._take(uid, group)
            recorded = self._record_closed(before=max((r.step for r in rows), default=0))
            if recorded and recorded[-1] >= self.steps:
                self._finish("finished")
            return recorded

    def _take(self, uid: str, rows: list[_Row]) -> None:
        step, slot = rows[0].step, rows[0].slot
        if (uid, step, slot) in self._taken or step in self._recorded:
            return  # this group was recorded already (the same batch through another hook)
        open_step = self._open.get(step)
        if open_step is None or not 0 <= slot < len(open_step.tasks):
            raise ValueError(f"a group for slot {slot} of plan step {step}, which this dataset did not hand out")
        if any((r.step, r.slot, r.task_id) != (step, slot, open_step.tasks[slot].id) for r in rows):
            raise ValueError(f"the rows of uid {uid} do not all name slot {slot} of step {step} and its task")
        expected = self.group_size or len(rows)
        if len(rows) != expected:
            raise ValueError(f"slot {slot} of plan step {step} has {len(rows)} completions, not "
                             f"data.palestra.group_size={expected} (actor_rollout_ref.rollout.n)")
        if slot in open_step.groups:
            raise ValueError(f"slot {slot} of plan step {step} came back twice, under two uids")
        open_step.groups[slot] = [(r.text, r.verdict) for r in rows]
        self._taken.add((uid, step, slot))

    def _record_closed(self, before: int | None = None) -> list[int]:
        """Record, in step order, every step whose groups are all in and every step before ``before``,
        the latest step of a batch: verl trains its batches in order, so those get no more groups (a
        step never trained on, with no group, is dropped); with ``before=None``, every step still open."""
        recorded = []
        for step in sorted(self._open):
            open_step = self._open[step]
            if before is not None and step >= before and len(open_step.groups) < len(open_step.tasks):
                continue
            del self._open[step]
            if open_step.groups:
                self._record(step, open_step)
                recorded.append(step)
        return recorded

    def _record(self, step: int, open_step: _OpenStep) -> None:
        slots = sorted(open_step.groups)
        sizes = {len(open_step.groups[s]) for s in slots}
        if len(sizes) > 1:
            raise ValueError(f"plan step {step} has groups of {sorted(sizes)} completions; GRPO groups are all one size")
        record_step(self.curriculum, step, [open_step.tasks[s] for s in slots], [open_step.groups[s] for s in slots],
                    self.advantage_std)
        self._recorded.add(step)
        self.recorded_steps.append(step)

    def close(self, status: str | None = None) -> None:
        """Record the groups of the steps still open, wait for the store, mark the run ``status`` (once).
        Without a status: "finished" when every step but the last is recorded (verl's legacy trainer
        hands the dataset no batch after its last step), else "interrupted"."""
        with self._lock:
            if self.finished:
                return
            try:
                self._record_closed()
            finally:
                done = max(self.recorded_steps, default=0)
                self._finish(status or ("finished" if done >= self.steps - 1 else "interrupted"))

    def _finish(self, status: str) -> None:
        self.finished = True
        try:
            self.curriculum.finish(status)  # a failed store write marks the run failed and is raised
        finally:
            if self._owns_store and self.curriculum.store is not None:
                self.curriculum.store.close()


# -- reading verl's batch ---------------------------------------------------------------------------
def batch_rows(batch: Any, tokenizer: Any, run_id: str | None) -> list[_Row]:
    """One ``_Row`` per completion of a verl ``DataProto`` as the trainer hands it to its hooks."""
    extra = batch.non_tensor_batch
    missing = {"uid", "extra_info"} - set(extra)
    if missing:
        raise ValueError(f"the batch has no {', '.join(sorted(missing))}: not a batch of verl's PPO trainer")
    rewards = _rewards(batch)
    texts = _texts(batch, tokenizer)
    rows = []
    for i, (uid, info) in enumerate(zip(extra["uid"], extra["extra_info"])):
        if not isinstance(info, dict) or "palestra_step" not in info:
            raise ValueError("a row's extra_info has no palestra_step: train on Palestra's verl dataset")
        if run_id is not None and info.get("palestra_run") != run_id:
            raise ValueError(f"a row of run {info.get('palestra_run')}, not of this dataset's run {run_id}")
        rows.append(_Row(str(uid), int(info["palestra_step"]), int(info["palestra_slot"]), str(info["task_id"]),
                         texts[i], _verdict(extra, i, float(rewards[i]))))
    return rows


def _by_uid(rows: list[_Row]) -> dict[str, list[_Row]]:
    groups: dict[str, list[_Row]] = defaultdict(list)
    for row in rows:
        groups[row.uid].append(row)
    return groups


def _rewards(batch: Any) -> np.ndarray:
    """Each row's reward: the ``score`` the reward function returned, else its summed token scores."""
    if "score" in batch.non_tensor_batch:
        return np.asarray(batch.non_tensor_batch["score"], dtype=np.float64)
    for key in ("token_level_scores", "rm_scores"):
        if key in batch.batch.keys():
            return batch.batch[key].sum(dim=-1).double().cpu().numpy()
    raise ValueError("the batch has no score, token_level_scores or rm_scores: it has not been scored yet")


def _verdict(extra: dict, i: int, reward: float) -> Verdict:
    """A row's verdict as our reward function gave it; from the reward alone for another one."""
    if "palestra_status" in extra:
        details = {"unscored": True} if float(_value(extra, "palestra_unscored", i, 0.0)) else {}
        result = VerifyResult(reward, bool(float(extra["acc"][i])), Status(str(extra["palestra_status"][i])), details)
        return Verdict(result, float(_value(extra, "palestra_latency_s", i, 0.0)))
    correct = reward >= 1.0 - 1e-9
    return Verdict(VerifyResult(reward, correct, Status.OK if correct else Status.WRONG), 0.0)


def _value(extra: dict, key: str, i: int, default: Any) -> Any:
    return extra[key][i] if key in extra else default


def _texts(batch: Any, tokenizer: Any) -> list[str]:
    """Each row's completion as verl's reward manager decodes it (valid response tokens, special
    tokens skipped); empty without a tokenizer or responses."""
    n = len(batch.non_tensor_batch["uid"])
    if tokenizer is None or "responses" not in batch.batch.keys():
        return [""] * n
    responses = batch.batch["responses"]
    valid = batch.batch["attention_mask"][:, -responses.shape[-1]:].sum(dim=-1).tolist()
    return [tokenizer.decode(responses[i, :int(valid[i])].tolist(), skip_special_tokens=True) for i in range(n)]
