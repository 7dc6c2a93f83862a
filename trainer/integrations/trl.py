"""Palestra's curriculum inside TRL's ``GRPOTrainer``: per-domain statistics in the store, adaptive
mixing and difficulty — with TRL's own training loop unchanged.

    from trainer.integrations.trl import TRLCurriculum

    args = GRPOConfig(..., shuffle_dataset=False, max_steps=100, ignore_data_skip=True)
    with TRLCurriculum.build(["arithmetic", "fractions"], args, policy={"type": "learnability"},
                             evaluation={"every": 25}, resume_from_checkpoint=resume) as curriculum:
        trainer = GRPOTrainer(model, reward_funcs=curriculum.palestra_reward, args=args,
                              train_dataset=curriculum.dataset())
        curriculum.attach(trainer)  # its callback, bound to the trainer (evaluations log through it)
        trainer.train(resume_from_checkpoint=resume)  # resume: None, a checkpoint-N folder, or True

How the two loops line up. TRL reads a *generation batch* of ``generation_batch_size /
num_generations`` prompts, repeats each prompt ``num_generations`` times (and the whole batch
``num_iterations × steps_per_generation`` times, to reuse it), generates once and scores every
completion of the batch. Here one generation batch is one Palestra plan step: when TRL reads the
first prompt of a batch, the dataset asks the Curriculum for the next plan, draws its tasks and
yields one row per prompt, ``{prompt, domain, level, task_id, palestra_step, palestra_group}`` (the
payload the verifier needs stays in memory, out of the data stream). ``palestra_reward`` sends each
completion to its domain's verifier through a verifier pool — local worker processes, or Ray actors
with ``verifier={"backend": "ray"}`` (deadlines; a crash or a timeout is reward 0, counted, never
raised) and collects the verdicts per (plan step, prompt). A step is recorded — one store
transaction, then the policy and the difficulty controller learn — once every group of it is
scored, so a call that carries a slice of a batch, or the end of one batch and the start of the
next, is counted right.

Where this departs from Palestra's own trainer, and why:
- the mix adapts one step late: TRL's data loader reads a batch ahead (accelerate's look-ahead and
  the gradient-accumulation prefetch), so the plan of step t+1 is drawn before step t is scored.
  The curriculum allows exactly this overlap: a plan depends only on the steps recorded before it;
- the advantages stored with each result are Palestra's (``trainer.integrations.recording.record_step``), so
  the learnability signals mean what they mean in Palestra runs; TRL trains on its own advantages
  (it divides by the unbiased group std);
- tool domains need ``rollout_func=curriculum.rollout_func()`` (``trainer.integrations.trl_rollout``):
  Palestra's sampler then plays every prompt on TRL's model, a whole episode for a tool domain, and
  ``palestra_reward`` grades the episode's transcript; without it a tool domain's first completion
  is refused in one line (TRL's own generation gives an episode one turn and no tool's answer);
- held-out evaluation (``evaluation={...}``, ``trainer.integrations.trl_evaluation``) runs Palestra's
  own on TRL's model before the first step, every ``every`` steps and at the last one; its numbers
  go to TRL's logs and to the store, joined to the last recorded plan step;
- a checkpoint ``checkpoint-N`` gets the curriculum's state beside TRL's
  (``trainer.integrations.trl_checkpoint``): the scheduler, the task stream, the plans TRL's loader
  had read and not scored (handed out again on resume, as they were), the RNG states. A resumed
  run draws the plans and tasks the uninterrupted one would have (and, where the model's sampling
  is deterministic, as on the CPU, its completions); it needs ``ignore_data_skip=True`` (TRL
  would otherwise skip fresh plans of the live stream) and checkpoints between generation batches;
- no prompt selection or dynamic sampling here;
- on several processes (``accelerate launch``) rank 0 plans, draws and records, every rank verifies
  its own completions and learns every verdict (``trainer.integrations.trl_ranks``).

Nothing here imports ``trl``: the module reads TRL's settings from the config object it is given,
and imports ``datasets`` only when ``dataset()`` is called. Written against TRL 1.16, which takes an
``IterableDataset`` as train set and hands reward functions ``log_metric`` (without it, the
per-domain TRL logs are skipped; the store gets everything either way).
"""
from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from curriculum.config import DifficultyConfig, PolicyConfig
from curriculum.curriculum import Curriculum
from curriculum.store import StatsStore
from curriculum.types import Plan
from domains.api import FAILURE_STATUSES, Domain, Task
from domains.verify.backend import VerifierConfig, make_pool
from domains.verify.pool import Verdict, VerifierPool
from domains.registry import load_all
from trainer.distributed import SharedCurriculum, World
from trainer.integrations import trl_checkpoint, trl_ranks, trl_settings
from trainer.integrations.recording import record_step
from trainer.integrations.trl_settings import BatchShape, trl_batch_shape  # noqa: F401 (part of this module's API)
from trainer.integrations.trl_callback import CurriculumCallback
from trainer.integrations.trl_evaluation import EvaluationConfig, TRLEvaluation, evaluation_config
from trainer.integrations.trl_rollout import PalestraRollout

ADVANTAGE_STD_MODES = ("group", "batch", "none")
_LIVE: "weakref.WeakValueDictionary[str, TRLCurriculum]" = weakref.WeakValueDictionary()


def completion_text(completion: Any) -> str:
    """The text a verifier grades: a plain completion, or the assistant turns of a chat one."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(_content_text(m.get("content")) for m in completion
                       if isinstance(m, dict) and m.get("role", "assistant") == "assistant")
    raise TypeError(f"a completion must be a string or a list of chat messages, not {type(completion).__name__}")


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # multimodal parts: keep the text ones
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


@dataclass
class _OpenStep:
    """A plan handed to TRL and the verdicts of its completions so far."""

    plan: Plan
    tasks: list[Task]  # [P] group p is the prompt tasks[p]
    scored: list[list[tuple[str, Verdict]]]  # [P][<= G] (completion text, verdict) in arrival order

    def add(self, step: int, group: int, text: str, verdict: Verdict, group_size: int) -> None:
        if len(self.scored[group]) >= group_size:
            raise ValueError(f"prompt {group} of plan step {step} got more than num_generations={group_size} "
                             "completions: build the curriculum from the GRPOConfig you train with")
        self.scored[group].append((text, verdict))

    def full_groups(self, group_size: int) -> list[int]:
        return [p for p, done in enumerate(self.scored) if len(done) == group_size]

    def complete(self, group_size: int) -> bool:
        return len(self.full_groups(group_size)) == len(self.tasks)


class TRLCurriculum:
    """The prompt source, the reward function and the callback that connect TRL to a Curriculum.

    ``build`` makes one from names and plain settings; the constructor takes loaded domains, typed
    configs and an open store (which the caller keeps owning unless ``owns_store``). On several
    processes (``world``) only rank 0 is given the store; the others pass None (``trl_ranks``).
    """

    def __init__(self, domains: dict[str, Domain], shape: BatchShape, policy: PolicyConfig,
                 difficulty: DifficultyConfig, store: StatsStore | None, *, seed: int = 0, run_name: str = "trl",
                 run_config: dict | None = None, verifier_workers: int | None = None,
                 verifier: VerifierConfig | None = None, advantage_std: str = "group",
                 owns_store: bool = False, evaluation: TRLEvaluation | None = None,
                 resume: dict | None = None, world: World = World()) -> None:
        _check_settings(domains, advantage_std)
        if world.is_main != (store is not None):
            raise ValueError("rank 0, and only rank 0, opens the store")
        verifier = trl_settings.verifier_config(verifier, verifier_workers)
        if resume is not None:
            if world.is_main:
                trl_checkpoint.check_stored(store, resume["run_id"])
            seed = int(resume["seed"])  # a resumed run keeps the seed it started with
        self.domains, self.shape, self.advantage_std, self.world = domains, shape, advantage_std, world
        self.store, self._owns_store, self.evaluation = store, owns_store, evaluation
        config = {"integration": "trl", "domains": sorted(domains), "policy": policy.model_dump(),
                  "difficulty": difficulty.model_dump(), "prompts_per_step": shape.prompts_per_step,
                  "group_size": shape.group_size, "advantage_std": advantage_std, **(run_config or {})}
        # The pool first (local worker processes unless ``verifier`` asks for Ray actors): a backend
        # that cannot start must not leave a run row behind that says "running" forever.
        self.pool = make_pool(domains, verifier) if verifier is not None else VerifierPool(domains, workers=verifier_workers)
        # the held-out tasks never reach training
        settings = dict(seed=seed, domains=domains, policy=policy, difficulty=difficulty,
                        prompts_per_step=shape.prompts_per_step,
                        heldout_ids=evaluation.heldout_ids if evaluation is not None else ())
        try:
            # the Curriculum itself lives on rank 0; every rank plans and draws through the shared one
            self.curriculum: Curriculum | None = None
            if world.is_main:
                self.curriculum = (Curriculum.start(store, run_name, config, **settings) if resume is None
                                   else trl_checkpoint.reopen(store, resume, settings))
            self.shared = SharedCurriculum(world, self.curriculum)
            self.run_id: str = world.broadcast(self.curriculum.run_id if world.is_main else None)
        except BaseException:
            self.pool.close()
            raise
        self._open: dict[int, _OpenStep] = {}
        self._next_step = 1
        self._reissue: list[tuple[int, Plan, list[Task]]] = []  # read before the checkpoint, never scored
        self.resumed_at: int | None = None  # the TRL global step of the checkpoint this resumed from
        self._resumed_rng: dict | None = None
        if resume is not None:
            self._restore(resume)
        self._lock = threading.Lock()  # rows() and palestra_reward() may be driven from different threads
        self._closed = False
        self.recorded_steps: list[int] = []
        _LIVE[self.run_id] = self

    def __reduce__(self):
        # datasets fingerprints a generator by pickling it, and may deep-copy it. A curriculum owns
        # worker processes and a database connection, so neither may copy it: both get a reference
        # to this live object instead (valid in this process only).
        return (_live_curriculum, (self.run_id,))

    @classmethod
    def build(cls, domains: Sequence[str], args: Any, *, policy: PolicyConfig | dict | None = None,
              difficulty: DifficultyConfig | dict | None = None, store_url: str | None = None,
              seed: int | None = None, domain_options: dict[str, dict] | None = None, run_name: str = "trl",
              verifier_workers: int | None = None, verifier: VerifierConfig | dict | None = None,
              advantage_std: str = "group", evaluation: EvaluationConfig | dict | None = None,
              resume_from_checkpoint: str | Path | bool | None = None) -> "TRLCurriculum":
        """A curriculum for the ``GRPOConfig`` ``args``: domains by name (or ``module:OBJECT``),
        policy and difficulty as configs or their dicts (default: learnability, threshold), the store
        at ``store_url`` (default: SQLite at ``<args.output_dir>/palestra.db``), seed from ``args``;
        ``verifier`` is the trainer's ``verifier`` section (e.g. ``{"backend": "ray", "workers": 8}``);
        ``evaluation`` the held-out evaluation's settings (``trl_evaluation``; None: none);
        ``resume_from_checkpoint`` (a ``checkpoint-N`` folder, or True for the newest in
        ``args.output_dir``) goes on with the run saved there, as ``trainer.train`` is given it."""
        shape = trl_batch_shape(args)  # cheap checks first: nothing is started if a setting is wrong
        world = trl_ranks.world_of(args)
        curriculum = trl_settings.curriculum_config(policy, difficulty)
        verifier = trl_settings.verifier_config(verifier, verifier_workers)
        evaluation = evaluation_config(evaluation) if evaluation is not None else None
        resume = (trl_checkpoint.resume_state(args, resume_from_checkpoint)
                  if resume_from_checkpoint not in (None, False) else None)
        loaded = load_all(list(domains), domain_options)
        _check_settings(loaded, advantage_std)
        seed = int(args.seed if seed is None else seed)
        heldout = TRLEvaluation(loaded, evaluation, args.max_completion_length) if evaluation is not None else None
        store = StatsStore(store_url or trl_settings.default_store_url(args.output_dir)) if world.is_main else None
        try:
            return cls(loaded, shape, curriculum.policy, curriculum.difficulty, store, seed=seed, run_name=run_name,
                       run_config={"trl": trl_settings.run_settings(args),
                                   "domains": list(domains),  # as given, so that `palestra replay`
                                   "domain_options": domain_options or {},  # can load them
                                   "evaluation": evaluation.model_dump() if evaluation is not None else None},
                       verifier_workers=verifier_workers, verifier=verifier, advantage_std=advantage_std,
                       owns_store=True, evaluation=heldout, resume=resume, world=world)
        except BaseException:
            if store is not None:
                store.close()
            raise

    # -- what TRL is given ----------------------------------------------------------------------
    def dataset(self):
        """The prompt rows as a ``datasets.IterableDataset`` for ``GRPOTrainer(train_dataset=...)``."""
        try:
            from datasets import IterableDataset
        except ImportError as exc:
            raise ImportError("the TRL curriculum needs the datasets package: pip install 'palestra[bench]'") from exc
        return IterableDataset.from_generator(self.rows)

    def rows(self) -> Iterator[dict]:
        """Endless prompt rows, a plan step at a time; each prompt once (TRL repeats it per generation)."""
        while True:
            step, tasks = self._open_next_step()
            for group, task in enumerate(tasks):
                yield {"prompt": task.prompt, "domain": task.domain, "level": task.level, "task_id": task.id,
                       "palestra_step": step, "palestra_group": group}

    def palestra_reward(self, prompts: list, completions: list, palestra_step: list[int] | None = None,
                        palestra_group: list[int] | None = None, palestra_text: list[str] | None = None,
                        log_metric: Callable | None = None, trainer_state: Any = None,
                        **_other_columns: Any) -> list[float]:
        """TRL reward function: each completion's reward from its domain's verifier (0 on a verifier
        error or timeout); records every plan step whose completions are all scored. ``palestra_text``,
        from ``rollout_func()``, is what to grade (a tool episode's transcript) instead of ``completions``."""
        if palestra_step is None or palestra_group is None:
            raise ValueError("palestra_reward needs the palestra_step and palestra_group columns: train on "
                             "curriculum.dataset() with GRPOConfig(remove_unused_columns=False)")
        if len(completions) != len(palestra_step):
            raise ValueError(f"{len(completions)} completions but {len(palestra_step)} palestra_step values")
        keys = [(int(s), int(g)) for s, g in zip(palestra_step, palestra_group)]
        texts = list(palestra_text) if palestra_text is not None else [completion_text(c) for c in completions]
        with self._lock:
            tasks = [self._task_at(step, group) for step, group in keys]
        if palestra_text is None:
            _refuse_episodes(tasks, self.domains)
        verdicts = self.pool.verify_many(list(zip(tasks, texts)))
        self.pool.raise_if_broken()
        # every rank's verdicts, in the order one process would have scored them (trl_ranks)
        scored = self.world.gather_lists(list(zip(keys, texts, verdicts)))
        with self._lock:
            for (step, group), text, verdict in scored:
                self._open[step].add(step, group, text, verdict, self.shape.group_size)
            recorded = self._record_closed(getattr(trainer_state, "global_step", None))
        if log_metric is not None:
            _log_to_trl(log_metric, tasks, verdicts, recorded)
        return [float(v.result.reward) for v in verdicts]

    def rollout_func(self, **options: Any) -> PalestraRollout:
        """For ``GRPOTrainer(rollout_func=...)``: Palestra's sampler plays every prompt, a whole
        episode for a tool domain (needed for multi-turn domains; ``trainer.integrations.trl_rollout``).
        ``options``: ``max_episode_tokens``, ``rollout_batch_size``, ``sampler``, ``keep_cache``."""
        return PalestraRollout(self.domains, self.shape.group_size, self.handed_out, **options)

    def handed_out(self) -> list[tuple[int, list[Task]]]:
        """The plan steps handed to TRL and not yet recorded, in order: (step, tasks)."""
        with self._lock:
            return [(step, list(open_step.tasks)) for step, open_step in sorted(self._open.items())]

    def callback(self) -> CurriculumCallback:
        """A TrainerCallback (``trl_callback``): checks TRL's settings at the start, saves the
        curriculum with each checkpoint, evaluates, records what is left at the end."""
        return CurriculumCallback(self)

    def attach(self, trainer: Any) -> Any:
        """Give ``trainer`` this curriculum's callback (once), bound to it so that held-out
        evaluations are logged through ``trainer.log``; needed with ``evaluation``. Returns it."""
        callbacks = trainer.callback_handler.callbacks
        ours = [c for c in callbacks if isinstance(c, CurriculumCallback) and c.curriculum is self]
        for callback in ours:
            callback.trainer = trainer
        if not ours:
            trainer.add_callback(CurriculumCallback(self, trainer))
        return trainer

    def evaluate(self, model: Any, tokenizer: Any, global_step: int, keep: str | None = None) -> dict[str, float]:
        """Held-out success now, stored as the own trainer stores it: joined to the last recorded
        plan step (0 before any), where ``palestra report`` and ``compare`` read it."""
        if self.evaluation is None:
            raise ValueError("this curriculum was built without evaluation={...}")
        if not self.world.is_main:
            raise ValueError("the held-out evaluation runs on rank 0, which holds the store")
        metrics = self.evaluation.run(model, tokenizer, self.pool, global_step, keep=keep)
        with self._lock:
            step = self.curriculum.scheduler.last_step or 0
        self.curriculum.record_evaluation(step, metrics)
        return metrics

    # -- plans out, results in -------------------------------------------------------------------
    def _open_next_step(self) -> tuple[int, list[Task]]:
        with self._lock:
            if self._closed:
                raise RuntimeError("this TRLCurriculum is closed")
            if len(self._open) >= self.shape.max_open_steps:
                raise RuntimeError(f"{len(self._open)} plan steps went to TRL without being scored: is "
                                   "curriculum.palestra_reward among reward_funcs, and shuffle_dataset off?")
            if self._reissue:  # first the steps the checkpointed run had handed out, as they were
                step, plan, tasks = self._reissue.pop(0)
            else:
                step = self._next_step
                self._next_step += 1
                plan = self.shared.plan(step)  # rank 0's plan and tasks, on every rank
                tasks = self.shared.draw(plan.counts)
            self._open[step] = _OpenStep(plan, tasks, [[] for _ in tasks])
        return step, tasks

    def _task_at(self, step: int, group: int) -> Task:
        open_step = self._open.get(step)
        if open_step is None or not 0 <= group < len(open_step.tasks):
            raise ValueError(f"a completion for prompt {group} of plan step {step}, which this curriculum did not "
                             "hand out or has already recorded")
        return open_step.tasks[group]

    def _record_closed(self, global_step: int | None, everything: bool = False) -> list[Plan]:
        """Record, in step order, the steps that will get no more completions: every complete step,
        and every step before one (TRL scores generation batches in order). Only full groups count;
        a step with none (drawn, then never trained on) is dropped."""
        group_size = self.shape.group_size
        complete = [s for s, o in self._open.items() if o.complete(group_size)]
        last = max(self._open, default=0) if everything else max(complete, default=0)
        recorded = []
        for step in sorted(s for s in self._open if s <= last):
            open_step = self._open.pop(step)
            if open_step.full_groups(group_size):
                self._record(step, open_step, global_step)
                recorded.append(open_step.plan)
        return recorded

    def _record(self, step: int, open_step: _OpenStep, global_step: int | None) -> None:
        groups = open_step.full_groups(self.shape.group_size)
        extra = {"trl/global_step": int(global_step)} if global_step is not None else None
        record_step(self.shared, step, [open_step.tasks[p] for p in groups], [open_step.scored[p] for p in groups],
                    self.advantage_std, extra)  # written by rank 0 alone
        self.recorded_steps.append(step)

    # -- lifecycle -------------------------------------------------------------------------------
    def check_args(self, args: Any) -> None:
        """Fail in one line if the trainer batches differently from what this curriculum was built for."""
        shape = trl_batch_shape(args)
        built = (self.shape.prompts_per_step, self.shape.group_size)
        if (shape.prompts_per_step, shape.group_size) != built:
            raise ValueError(f"the curriculum was built for {built[0]} prompts x {built[1]} completions per generation "
                             f"batch, the trainer uses {shape.prompts_per_step} x {shape.group_size}: build it from "
                             "the GRPOConfig you train with")

    def state_dict(self) -> dict:
        """What a checkpoint holds of the curriculum (``trl_checkpoint``): the Curriculum's state,
        and the steps handed out and not yet scored, which a resume hands out again: TRL's loader
        read them before the save, so the run that goes on from it never trains on them otherwise.
        Rank 0's (which holds the Curriculum): every rank holds the same steps handed out."""
        if self.curriculum is None:
            raise ValueError("the curriculum's state is saved by rank 0, which holds it")
        with self._lock:
            plans = {plan.step: plan for plan in self.curriculum.handed_out()}
            handed = [(step, plans[step], list(o.tasks)) for step, o in sorted(self._open.items())] + self._reissue
            last = self.curriculum.scheduler.last_step
            state = {**self.curriculum.state_dict(), "step": last if last is not None else 0,
                     "unwritten": self.curriculum.take_unwritten()}
            return {"run_id": self.run_id, "seed": self.curriculum.scheduler.seed, "curriculum": state,
                    "handed_out": handed, "next_step": self._next_step,
                    "evaluation": self.evaluation.state_dict() if self.evaluation is not None else None}

    def _restore(self, resume: dict) -> None:
        # Steps with verdicts at the save were being trained on across it, which the callback
        # refuses (checkpoints fall between generation batches): each goes out again whole.
        self._reissue = [(step, plan, list(tasks)) for step, plan, tasks in resume["handed_out"]]
        self.shared.reissue([plan for _, plan, _ in self._reissue])
        self._next_step = int(resume["next_step"])
        self.resumed_at = int(resume["global_step"])
        self._resumed_rng = trl_ranks.own_rng_states(self.world, resume)
        if self.evaluation is not None and resume.get("evaluation"):
            self.evaluation.load_state_dict(resume["evaluation"])

    def take_resumed_rng(self) -> dict | None:
        """The checkpoint's RNG states, once, for the first step after a resume (``trl_callback``)."""
        rng, self._resumed_rng = self._resumed_rng, None
        return rng

    def finish(self) -> None:
        """Record the full groups of steps still open, drop the rest, and wait for the store."""
        with self._lock:
            self._record_closed(None, everything=True)
        if self.curriculum is not None:
            self.curriculum.flush()

    def close(self, status: str = "finished") -> None:
        if self._closed:
            return
        try:
            self.finish()
        finally:
            self._closed = True
            self.pool.close()
            try:
                if self.curriculum is not None:  # rank 0
                    self.curriculum.finish(status)  # a failed write marks the run failed and is raised
            finally:
                if self._owns_store and self.store is not None:
                    self.store.close()

    def __enter__(self) -> "TRLCurriculum":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close("failed" if exc_type is not None else "finished")


# -- helpers ----------------------------------------------------------------------------------------
def _live_curriculum(run_id: str) -> TRLCurriculum:
    found = _LIVE.get(run_id)
    if found is None:
        raise RuntimeError(f"TRLCurriculum of run {run_id} is not alive in this process: a curriculum cannot be "
                           "copied to another process (keep dataloader_num_workers=0)")
    return found


def _check_settings(domains: dict[str, Domain], advantage_std: str) -> None:
    if advantage_std not in ADVANTAGE_STD_MODES:
        raise ValueError(f"advantage_std must be one of {', '.join(ADVANTAGE_STD_MODES)}, not {advantage_std!r}")
    if not domains:
        raise ValueError("the TRL curriculum needs at least one domain")


def _refuse_episodes(tasks: list[Task], domains: dict[str, Domain]) -> None:
    """A tool domain's completion is an episode only ``rollout_func()`` plays: TRL's own generation
    would have given it one turn without a tool's answer."""
    multi_turn = next((t.domain for t in tasks if domains[t.domain].multi_turn), None)
    if multi_turn is not None:
        raise ValueError(f"domain {multi_turn!r} is multi-turn: pass rollout_func=curriculum.rollout_func() "
                         "to GRPOTrainer")


def _log_to_trl(log_metric: Callable[[str, float], None], tasks: list[Task], verdicts: list[Verdict],
                recorded: list[Plan]) -> None:
    """Per-domain reward and success of this call, and the weights and levels of the plans just
    recorded, into TRL's logs (it averages them over each logging step)."""
    by_domain: dict[str, list[Verdict]] = defaultdict(list)
    for task, verdict in zip(tasks, verdicts):
        by_domain[task.domain].append(verdict)
    for name, found in sorted(by_domain.items()):
        log_metric(f"palestra/{name}/reward", sum(v.result.reward for v in found) / len(found))
        log_metric(f"palestra/{name}/success", sum(v.result.correct for v in found) / len(found))
    log_metric("palestra/verifier_failures", float(sum(v.result.status in FAILURE_STATUSES for v in verdicts)))
    # of those, the completions the verifier could not judge at all (it raised, no sandbox, ...)
    log_metric("palestra/unscored", float(sum(not v.result.scored for v in verdicts)))
    for plan in recorded:
        for i, name in enumerate(plan.domains):
            log_metric(f"palestra/{name}/weight", float(plan.weights[i]))
            log_metric(f"palestra/{name}/level", float(plan.levels[i]))
