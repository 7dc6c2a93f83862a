"""The Scheduler: owns the signals, the mixing policy, the difficulty controller and the store.

    plan(step)            -> Plan: prompts per (domain, level), summing exactly to prompts_per_step
    record(step, outcomes) : one transaction to the store, then signals, controller and policy learn

Determinism: ``plan`` is a pure function of the scheduler's state and (seed, step) — every random
draw comes from a generator seeded by (seed, step) — and all learning happens in ``record``. So
the state after a run depends only on the recorded history, which the store holds: the state can
be rebuilt from the store exactly (``rebuild_from_store``), and asking for a plan twice (or before
the previous step was recorded, when verification overlaps generation) is harmless.

Store writes: one transaction per step, inside ``record`` by default. With ``write_behind=True`` a
background thread runs them in order while training continues (the trainer's thread then pays
only for the in-memory update); ``state_dict``, ``rebuild_from_store``, ``flush`` and ``close``
wait for pending writes first.

Allocation: each domain has a running credit (ideal minus given prompts, summed over steps);
prompts go to domains by largest remainder of ``P·w + credit``, so a domain whose weight is worth
0.1 prompt a step still gets one prompt every ten steps, and no seeded noise is needed.
"""
from __future__ import annotations

import atexit
import queue
import threading
from dataclasses import fields

import numpy as np

from curriculum.cells import CellCounts, cell_counts, stat_rows
from curriculum.cold_start import ColdStart, lift
from curriculum.config import ColdStartConfig, DifficultyConfig, PolicyConfig, build_difficulty, build_policy
from curriculum.difficulty import LevelTable
from curriculum.signals import Signals, StepCounts
from curriculum.schema import is_in_memory_sqlite
from curriculum.store import StatsStore
from curriculum.types import GroupArrays, Outcome, Plan

STATE_VERSION = 1


class Scheduler:
    def __init__(self, domain_levels: dict[str, tuple[int, ...]], policy: PolicyConfig,
                 difficulty: DifficultyConfig, prompts_per_step: int, seed: int = 0,
                 store: StatsStore | None = None, run_id: str | None = None,
                 write_behind: bool = False, cold_start: ColdStartConfig | None = None,
                 group_size: int = 1) -> None:
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        self.table = LevelTable({d: tuple(lv) for d, lv in domain_levels.items()})
        self.domains = self.table.domains
        self.policy_cfg, self.difficulty_cfg = policy, difficulty
        self.prompts_per_step, self.seed = int(prompts_per_step), int(seed)
        self.cold_start_cfg, self.group_size = cold_start or ColdStartConfig(), int(group_size)
        self.store, self.run_id = store, run_id
        if store is not None and run_id is None:
            self.run_id = store.start_run("scheduler", self.describe(), self.seed)
        self._writer = _WriteBehind(store, self.table) if (store is not None and write_behind) else None
        self._reset()

    def describe(self) -> dict:
        """Plain-JSON description of this scheduler (stored with a run it starts itself)."""
        return {"domains": {d: self.table.values[o:o + n].tolist() for d, o, n in
                            zip(self.domains, self.table.offset, self.table.n_levels)},
                "policy": self.policy_cfg.model_dump(), "difficulty": self.difficulty_cfg.model_dump(),
                "cold_start": self.cold_start_cfg.model_dump(), "prompts_per_step": self.prompts_per_step}

    def _reset(self) -> None:
        self.signals = Signals(self.domains, self.policy_cfg.window, self.policy_cfg.ema_alpha)
        self.policy = build_policy(self.policy_cfg, self.domains, self.seed)
        self.controller = build_difficulty(self.difficulty_cfg, self._domain_levels())
        self.cold = ColdStart(self.cold_start_cfg, len(self.domains), self.policy_cfg.window,
                              self.prompts_per_step, self.group_size)
        self.credit = np.zeros(len(self.domains))
        self.last_step: int | None = None
        self._pending: dict[int, Plan] = {}  # plans handed out and not yet recorded

    def _domain_levels(self) -> dict[str, tuple[int, ...]]:
        t = self.table
        return {d: tuple(t.values[o:o + n].tolist()) for d, o, n in zip(self.domains, t.offset, t.n_levels)}

    # -- plan ---------------------------------------------------------------------------------
    def plan(self, step: int) -> Plan:
        if step in self._pending:
            return self._pending[step]
        weights = lift(self.policy.weights(self.signals, step), self.cold.probe_floors(self.signals, step))
        per_domain = allocate(weights, self.credit, self.prompts_per_step)
        plan = Plan(step=step, domains=list(self.domains), weights=weights,
                    levels=self.controller.levels(), counts=self._split_levels(step, per_domain),
                    hints=self.cold.hint_shares(self.signals), seen_step=self.last_step or 0)
        self._pending[step] = plan
        return plan

    def handed_out(self) -> list[Plan]:
        """The plans handed out and not yet recorded, in step order (for a checkpoint to carry)."""
        return [self._pending[step] for step in sorted(self._pending)]

    def reissue(self, plans: list[Plan]) -> None:
        """Hand out again, after ``load_state_dict``, plans the checkpointed run had handed out and
        not recorded: ``plan`` returns each as it was. Planning them afresh would not give them
        back: a trainer that reads ahead asked for them before the steps ahead of them were
        recorded, so they saw less history than the restored state holds."""
        for plan in plans:
            if self.last_step is not None and plan.step <= self.last_step:
                raise ValueError(f"plan step {plan.step} is not after the last recorded step {self.last_step}")
            if list(plan.domains) != self.domains:
                raise ValueError(f"plan step {plan.step} was made for other domains than this scheduler's")
            self._pending[plan.step] = plan

    def _split_levels(self, step: int, per_domain: np.ndarray) -> dict[tuple[str, int], int]:
        """Each domain's prompts over its levels, following the controller's shares.

        Systematic rounding: the cumulative shares times the domain's count are rounded down after
        one random offset per domain (seeded by step), so the counts sum exactly to the domain's
        prompts and each level gets its share on average — a share worth half a prompt gives one
        prompt every other step.
        """
        t = self.table
        offset = np.random.default_rng([self.seed, int(step), 1]).random(len(self.domains))
        active = np.nonzero(per_domain)[0]  # only domains that got prompts (<= prompts_per_step)
        # One row per active domain, its levels' shares left-aligned and padded with zeros: cumsum
        # along a row adds in the same order as over the domain's own slice, so the edges are the
        # same floats as domain by domain.
        n = t.n_levels[active]
        row, col = np.nonzero(np.arange(n.max(initial=0)) < n[:, None])
        cells = t.offset[active][row] + col
        padded = np.zeros((len(active), n.max(initial=0)))
        padded[row, col] = self.controller.shares()[cells]
        cum = np.cumsum(padded, axis=1)
        edges = np.floor(cum / cum[np.arange(len(active)), n - 1][:, None] * per_domain[active][:, None]
                         + offset[active][:, None]).astype(np.int64)
        given = np.diff(edges, axis=1, prepend=np.floor(offset[active])[:, None].astype(np.int64))[row, col]
        names, values = self.domains, t.values
        return {(names[d], int(v)): int(g) for d, v, g in
                zip(active[row][given > 0].tolist(), values[cells][given > 0].tolist(), given[given > 0].tolist())}

    # -- record -------------------------------------------------------------------------------
    def record(self, step: int, outcomes: list[Outcome] | GroupArrays, metrics: dict | None = None,
               tasks: dict[str, dict] | None = None) -> None:
        """Write the step to the store (one transaction), then let signals, controller and policy learn.

        With ``write_behind`` the transaction runs on a background thread while training goes on;
        a failed write is raised by the next ``record``, ``flush``, ``state_dict`` or ``close``.
        """
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} is not after the last recorded step {self.last_step}; "
                             "to redo steps, rebuild_from_store() or load_state_dict() first")
        plan = self.plan(step)  # the plan handed out (or, if none was asked for, the one it would be)
        given = np.zeros(len(self.domains), dtype=np.int64)
        for (domain, _level), n in plan.counts.items():
            given[self.table.domains_index[domain]] += n
        cells = self.aggregate(outcomes)
        if self._writer is not None:
            # The writer gets its own copies: the trainer keeps adding to its metrics dict after
            # record returns, and a dict that grows while the writer serialises it breaks the write.
            # (GroupArrays are the caller's own arrays, not a list it appends to: kept as they are)
            rows = outcomes if isinstance(outcomes, GroupArrays) else list(outcomes)
            self._writer.submit(self.run_id, step, plan, rows, dict(metrics or {}),
                                cells, dict(tasks or {}))
        elif self.store is not None:
            self.store.write_step(self.run_id, step, plan, outcomes, metrics,
                                  step_stats=self._stat_rows(cells), tasks=tasks)
        self._apply(step, cells, plan.weights, given)
        self._pending = {s: v for s, v in self._pending.items() if s > step}
        if self._writer is not None:
            self._writer.raise_if_failed()  # after _apply: the state includes this step either way

    def aggregate(self, outcomes: list[Outcome] | GroupArrays) -> CellCounts:
        """Per-cell sums of one step's outcomes; a group is the outcomes sharing ``group``."""
        return cell_counts(outcomes, self.table)

    def _stat_rows(self, cells: CellCounts) -> list[dict]:
        return stat_rows(cells, self.table)

    def _apply(self, step: int, cells: CellCounts, weights: np.ndarray, given: np.ndarray) -> None:
        """Everything ``record`` learns from a step; ``rebuild_from_store`` replays exactly this."""
        per_domain = lambda x: np.bincount(self.table.domain_of, weights=x, minlength=len(self.domains))  # noqa: E731
        counts = StepCounts(*(per_domain(getattr(cells, f.name)) for f in fields(CellCounts)))
        self.signals.update(step, counts)
        self.controller.update(step, cells.attempts, cells.successes, cells.reward_sum)
        self.controller.fall_to_easiest(self.cold.update(self.signals, step))
        self.policy.update(self.signals, step, np.asarray(weights, dtype=float))
        # Credit is settled here, from the prompts the plan gave, not when planning: a plan asked
        # for before the previous step was recorded then still leaves the same books.
        self.credit = next_credit(weights, self.credit, given, self.prompts_per_step)
        self.last_step = step

    # -- persistence --------------------------------------------------------------------------
    def flush(self) -> None:
        """Wait until every recorded step is in the store (no-op without write-behind)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and stop the background writer; the store itself stays open (its owner closes it)."""
        writer, self._writer = self._writer, None  # closed even when it raises: a second close is a no-op
        if writer is not None:
            writer.close()

    def take_unwritten(self) -> list[tuple]:
        """Steps the background writer could not store, in order, as ``write_step`` arguments
        (run_id, step, plan, outcomes, metrics, step_stats, tasks). A checkpoint carries them so a resume
        writes them first and nothing recorded is lost."""
        if self._writer is None:
            return []
        self._writer.queue.join()
        taken, self._writer.unwritten = self._writer.unwritten, []
        return taken

    def state_dict(self, allow_unwritten: bool = False) -> dict:
        if not allow_unwritten:
            self.flush()  # a checkpoint must never be ahead of the store it will be reconciled with
        return {"version": STATE_VERSION, "domains": list(self.domains), "seed": self.seed,
                "last_step": self.last_step, "credit": self.credit.tolist(),
                "signals": self.signals.state_dict(), "policy": self.policy.state_dict(),
                "difficulty": self.controller.state_dict(), "cold_start": self.cold.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"scheduler state version {state.get('version')} is not {STATE_VERSION}")
        if list(state["domains"]) != self.domains:
            raise ValueError("scheduler state was saved for a different list of domains")
        self._reset()
        self.last_step = state["last_step"]
        self.credit = np.asarray(state["credit"], dtype=float)
        self.signals.load_state_dict(state["signals"])
        self.policy.load_state_dict(state["policy"])
        self.controller.load_state_dict(state["difficulty"])
        if "cold_start" in state:  # checkpoints written before cold start had none (all warm then)
            self.cold.load_state_dict(state["cold_start"])

    def rebuild_from_store(self, until_step: int | None = None) -> None:
        """Reset, then replay every stored step of this run (up to ``until_step``) in order."""
        if self.store is None or self.run_id is None:
            raise ValueError("rebuild_from_store needs a store and a run id")
        self.flush()
        self._reset()
        cells_by_step = self._stored_cells()
        prompts_by_step: dict[int, dict[str, int]] = {}
        for row in self.store.plans(self.run_id):
            prompts_by_step.setdefault(row["step"], {})[row["domain"]] = row["n_prompts"]
        index = self.table.domains_index
        for vec in self.store.plan_vectors(self.run_id):
            step = vec["step"]
            if until_step is not None and step > until_step:
                break
            if list(vec["domains"]) != self.domains:
                raise ValueError(f"stored plan of step {step} has other domains than this scheduler")
            given = np.zeros(len(self.domains), dtype=np.int64)
            for name, n in prompts_by_step.get(step, {}).items():
                given[index[name]] = n
            weights = np.asarray(vec["weights"], dtype=float)
            empty = StepCounts.zeros(self.table.n_cells)
            self._apply(step, cells_by_step.get(step, empty), weights, given)

    def _stored_cells(self) -> dict[int, CellCounts]:
        by_step: dict[int, CellCounts] = {}
        for row in self.store.step_stats(self.run_id):
            cells = by_step.get(row["step"])
            if cells is None:
                cells = by_step[row["step"]] = CellCounts(*(np.zeros(self.table.n_cells) for _ in fields(CellCounts)))
            c = self.table.cell[(row["domain"], row["level"])]
            for f in fields(CellCounts):
                getattr(cells, f.name)[c] = row[f.name]
        return by_step


class StepWriteFailed(RuntimeError):
    """The background writer could not store a step (the store stayed unreachable)."""


class _WriteBehind:
    """One background thread that runs the store writes in order, so they overlap training.

    The queue is bounded: if the database falls behind, ``record`` waits instead of piling steps
    up in memory. After a failed write nothing more is written (the store would get a gap) and
    the error is raised to the trainer at its next call; resuming from the last checkpoint
    re-writes the missing steps, since writes are idempotent per (run, step).
    """

    def __init__(self, store: StatsStore, table: LevelTable) -> None:
        if is_in_memory_sqlite(store.engine.url):
            raise ValueError("write_behind needs a file or server database (in-memory SQLite is per thread)")
        self.store, self.table = store, table
        self.queue: queue.Queue = queue.Queue(maxsize=4)
        self.error: BaseException | None = None
        self.unwritten: list[tuple] = []  # items not written after a failure (write_step arguments)
        self.thread = threading.Thread(target=self._loop, name="palestra-store-writer", daemon=True)
        self.thread.start()
        atexit.register(self._drain_at_exit)  # a trainer that never calls close() still loses nothing

    def _drain_at_exit(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join(timeout=60)

    def submit(self, run_id: str, step: int, plan: Plan, outcomes: list[Outcome] | GroupArrays,
               metrics: dict | None, cells: CellCounts, tasks: dict[str, dict] | None = None) -> None:
        """Queue a step; its ``step_stats`` rows are built from ``cells`` on the writer thread,
        off the trainer's."""
        self.queue.put((run_id, step, plan, outcomes, metrics, cells, tasks))

    def _loop(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                self.queue.task_done()
                return
            run_id, step, plan, outcomes, metrics, cells, tasks = item
            args = item  # until its rows are built
            try:
                rows = stat_rows(cells, self.table)
                args = (run_id, step, plan, outcomes, metrics, rows, tasks)
                if self.error is None:
                    self.store.write_step(run_id, step, plan, outcomes, metrics, step_stats=rows, tasks=tasks)
                else:
                    self.unwritten.append(args)  # kept, in order, for the checkpoint
            except BaseException as exc:  # handed to the trainer's thread by _raise
                self.error = exc
                self.unwritten.append(args)
            finally:
                self.queue.task_done()

    def raise_if_failed(self) -> None:
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise StepWriteFailed(f"writing a step to {self.store.safe_url!r} failed: {self.error}") from self.error

    def flush(self) -> None:
        self.queue.join()
        self._raise()

    def close(self) -> None:
        self.queue.join()
        self.queue.put(None)
        self.thread.join()
        atexit.unregister(self._drain_at_exit)
        self._raise()


def allocate(weights: np.ndarray, credit: np.ndarray, total: int) -> np.ndarray:
    """Integer prompts per domain summing to ``total``, by largest remainder of total·w + credit.

    Ties go to the lower index (deterministic); ``next_credit`` carries the difference over.
    """
    target = np.maximum(total * weights + credit, 0.0)
    counts = np.floor(target).astype(np.int64)
    short = total - int(counts.sum())
    frac = target - counts
    if short > 0:
        top = np.argsort(-frac, kind="stable")[:short]
        counts[top] += 1
    elif short < 0:  # only after clipping negative targets: take back from the smallest remainders
        order = np.argsort(frac, kind="stable")
        order = order[counts[order] > 0][:-short]
        counts[order] -= 1
    return counts


def next_credit(weights: np.ndarray, credit: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    # Bounded so a domain that was starved (or flooded) for a while cannot swing the next plans.
    return np.clip(total * weights + credit - counts, -1.0, 1.0)
