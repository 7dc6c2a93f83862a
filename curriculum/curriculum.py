"""The Curriculum: the one door between a trainer (or the simulator) and the curriculum.

    plan(step)                   -> Plan: prompts per (domain, level)
    draw(counts, step)           -> tasks for those slots (held-out tasks kept out, prompts selected)
    record(step, groups, metrics)-> the step's metrics as stored: every store write of the step
    record_evaluation(step, m)   :  held-out success joined to the step's stored metrics
    record_alarms(step, alarms)  :  the trainer's health alarms, likewise
    state_dict / load_state_dict :  for checkpoints
    handed_out / reissue         :  plans handed out and not recorded, carried across a checkpoint

Inside, the ``Scheduler`` plans and learns (signals, mixing policy, difficulty controllers), the
``TaskSource`` draws with the ``PromptSelector`` choosing among candidates, and the store is
written by the scheduler (results, aggregates, plan; write-behind when asked) and the selector
(per-prompt statistics). Nothing outside writes the store while a run trains: a trainer starts or
reopens the run here and finishes it here.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from curriculum.canary_log import canary_metrics
from curriculum.compare import DEFAULT_MASTERY, heldout_metrics
from curriculum.config import ColdStartConfig, DifficultyConfig, PolicyConfig, SelectionConfig
from curriculum.prompts import PromptSelector
from curriculum.scheduler import Scheduler, StepWriteFailed
from curriculum.steps import Group, outcomes, plan_metrics
from curriculum.store import StatsStore
from curriculum.tasks import TaskSource
from curriculum.types import Outcome, Plan
from domains.api import Domain, Task, one_line
from domains.canaries import CanaryResult


def domain_levels(domains: Mapping[str, Domain]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(d.levels) for name, d in domains.items()}


def mark_run(store: StatsStore, run_id: str, status: str) -> None:
    """Mark a run finished, failed or interrupted; a store that cannot take it gets a warning, not
    an error (an unreachable store was already reported, and that report must not be masked)."""
    try:
        store.finish_run(run_id, status)
    except Exception as exc:
        print(f"warning: could not mark run {run_id} {status}: {one_line(exc, 200)}")


class Curriculum:
    """Plans, draws and records one run. ``domains`` are the loaded plugins (the simulator, which
    draws no tasks, gives ``levels`` alone); ``store`` and ``run_id`` are optional — without them
    nothing is written. Build one for a new run with ``start`` and for a resumed one with ``reopen``."""

    def __init__(self, domains: Mapping[str, Domain] | None = None, *, policy: PolicyConfig,
                 difficulty: DifficultyConfig, prompts_per_step: int, seed: int = 0,
                 selection: SelectionConfig | None = None, store: StatsStore | None = None,
                 run_id: str | None = None, write_behind: bool = False, heldout_ids: Iterable[str] = (),
                 levels: Mapping[str, Sequence[int]] | None = None, cold_start: ColdStartConfig | None = None,
                 group_size: int = 1) -> None:
        if (domains is None) == (levels is None):
            raise ValueError("give the curriculum its domains, or (to plan and record without drawing) their levels")
        self.domains, self.store = dict(domains or {}), store
        self.scheduler = Scheduler(dict(levels) if levels is not None else domain_levels(self.domains), policy,
                                   difficulty, prompts_per_step, seed=seed, store=store, run_id=run_id,
                                   write_behind=write_behind, cold_start=cold_start, group_size=group_size)
        self.run_id = self.scheduler.run_id  # the one given, or the run the scheduler started
        self.selector = (PromptSelector(selection, seed=seed, store=store, run_id=self.run_id)
                         if selection is not None else None)
        self.tasks = TaskSource(self.domains, set(heldout_ids), seed, selector=self.selector,
                                hint_form=self.scheduler.cold_start_cfg.hint_form)

    # -- the run ----------------------------------------------------------------------------------
    @classmethod
    def start(cls, store: StatsStore, name: str, config: dict, *, seed: int, sweep_id: str | None = None,
              **settings: Any) -> "Curriculum":
        """A new run in ``store``, stored with ``config``."""
        run_id = store.start_run(name, config, seed, sweep_id=sweep_id)
        try:
            return cls(store=store, run_id=run_id, seed=seed, **settings)
        except BaseException:  # a run row that says "running" forever would be a lie
            mark_run(store, run_id, "failed")
            raise

    @classmethod
    def reopen(cls, store: StatsStore, run_id: str, state: dict, **settings: Any) -> "Curriculum":
        """Run ``run_id`` again from the checkpoint ``state`` (``load_state_dict``'s argument, with
        the ``step`` it was saved at): the steps stored after it are redone, so their rows go; steps
        the store could not take before it travel in it and are written now."""
        store.discard_after(run_id, state["step"])
        for args in state.get("unwritten", []):
            unwritten_run, step, plan, rows, metrics, stats, tasks = args
            store.write_step(unwritten_run, step, plan, rows, metrics, step_stats=stats, tasks=tasks)
        curriculum = cls(store=store, run_id=run_id, **settings)
        curriculum.load_state_dict(state)
        return curriculum

    def finish(self, status: str = "finished") -> None:
        """Wait for the store writes, then mark the run ``status`` ("failed" when a write failed,
        which is raised after the mark)."""
        failure = None
        try:
            self.scheduler.close()  # waits for the write-behind thread
        except StepWriteFailed as exc:
            status, failure = "failed", exc
        if self.store is not None and self.run_id is not None:
            mark_run(self.store, self.run_id, status)
        if failure is not None:
            raise failure

    # -- a step -----------------------------------------------------------------------------------
    def plan(self, step: int) -> Plan:
        return self.scheduler.plan(step)

    def draw(self, counts: Mapping[tuple[str, int], int], step: int | None = None, rng=None) -> list[Task]:
        """Tasks for each (domain, level) slot; with a training ``step`` the prompt selector picks
        among candidates, and the step's plan says what share of each domain's tasks is hinted
        (``cold_start.hint_below``; refills of the step by the same rule). A draw without a step,
        as for evaluation, has no hints. A draw with its own ``rng`` leaves the training stream
        where it was."""
        return self.tasks.draw(dict(counts), step=step, rng=rng, hints=self.hint_shares(step))

    def hint_shares(self, step: int | None) -> dict[str, float]:
        """Domain -> share of its training tasks drawn hinted at ``step``; none without a step or
        with hints off (the plan is not even asked for then)."""
        if step is None or self.scheduler.cold_start_cfg.hint_below <= 0:
            return {}
        plan = self.scheduler.plan(step)
        if plan.hints is None:
            return {}
        return {name: float(share) for name, share in zip(plan.domains, plan.hints) if share > 0}

    def record(self, step: int, groups: Sequence[Group], metrics: dict | None = None) -> dict[str, Any]:
        """Record a step's groups — every completion generated, refills and groups left out included
        — with the trainer's ``metrics``; returns the metrics as stored (the trainer's, the plan's
        per-domain ones, the prompt selector's counts)."""
        rows = outcomes(groups, self.domains)
        stored = {**(metrics or {}), **plan_metrics(self.scheduler.plan(step), groups)}
        if self.selector is not None:  # it counted while this step's tasks were drawn (a step drawn ahead keeps its own)
            stored.update(self.selector.metrics(step))
        tasks = {g.task.id: g.task.to_json() for g in groups}  # for `palestra replay`
        self.record_outcomes(step, rows, stored, tasks)
        return stored

    def record_outcomes(self, step: int, rows: list[Outcome], metrics: dict | None = None,
                        tasks: dict[str, dict] | None = None) -> None:
        """``record`` for a trainer that makes its own rows (the simulator's synthetic learner)."""
        self.scheduler.record(step, rows, metrics, tasks=tasks)
        if self.selector is not None:
            self.selector.record(step, rows)

    def record_evaluation(self, step: int, metrics: Mapping[str, float]) -> None:
        """Held-out success (``eval/<domain>`` and ``eval/macro``) joins the step's stored metrics
        under the keys ``palestra compare`` and ``report`` read, the simulator's too."""
        if self.store is None:
            return
        # a domain with no held-out tasks (a dataset with heldout_fraction 0) has no rate to store
        names = [n for n in self.scheduler.domains if f"eval/{n}" in metrics]
        if not names:
            return
        per_domain = np.array([metrics[f"eval/{n}"] for n in names])
        values = {**{k.replace("eval/", "heldout/", 1): v for k, v in metrics.items()},
                  **heldout_metrics(per_domain, mastery=DEFAULT_MASTERY, with_domains=True)}
        self._merge_metrics(step, values)

    def record_alarms(self, step: int, alarms: Sequence[str]) -> None:
        """The step's health alarms (all of them: they replace what the step stored) join its
        stored metrics under ``alarms``, where ``palestra report`` lists them."""
        if self.store is None or not alarms:
            return
        self._merge_metrics(step, {"alarms": list(alarms)})

    def record_canaries(self, step: int, results: Sequence[CanaryResult]) -> None:
        """A canary check's counts (and alarms) join the step's stored metrics (``canary_log``)."""
        if self.store is None:
            return
        self._merge_metrics(step, canary_metrics(results))

    def _merge_metrics(self, step: int, values: dict) -> None:
        """Add ``values`` to the step's stored metrics (evaluations, alarms, canary checks)."""
        self.scheduler.flush()  # the step's own row first: merging into it must not race its write
        self.store.merge_metrics(self.run_id, step, values)

    def flush(self) -> None:
        self.scheduler.flush()

    def take_unwritten(self) -> list[tuple]:
        """Steps the store could not take, for a checkpoint to carry (see ``reopen``)."""
        return self.scheduler.take_unwritten()

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self, allow_unwritten: bool = False) -> dict:
        state = {"scheduler": self.scheduler.state_dict(allow_unwritten=allow_unwritten),
                 "tasks": self.tasks.state_dict()}
        if self.selector is not None:
            state["selector"] = self.selector.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.tasks.load_state_dict(state["tasks"])
        if self.selector is not None:
            self.selector.load_state_dict(state["selector"])

    def handed_out(self) -> list[Plan]:
        """Plans handed out and not yet recorded, in step order: a trainer that reads ahead (TRL)
        checkpoints them with its state and ``reissue``s them when it resumes; so does the own trainer's
        async pipeline, which plans one step ahead."""
        return self.scheduler.handed_out()

    def reissue(self, plans: Sequence[Plan]) -> None:
        """After ``load_state_dict`` (or ``reopen``): ``plan`` gives these plans again, as the run
        that saved the checkpoint handed them out (``Scheduler.reissue``)."""
        self.scheduler.reissue(list(plans))
