"""The GRPO recipe: setup / train / save_checkpoint / cleanup.

One step: the curriculum plans how many prompts per (domain, level) and draws the tasks; the
collector samples G completions per task and verifies them (``trainer/sampling/collect.py``);
group-relative advantages feed the policy update (``trainer/update/step.py``); the step's groups go
back to the curriculum, which records them in one store transaction and learns from them.

Under ``torchrun`` the ranks share each step's sampling, verification and training; rank 0 alone
holds the curriculum and the store (``trainer/distributed.py`` explains the split).

With ``trainer.system.pipeline=async`` the next step's rollouts are sampled during the update by a
copy of the policy one update old (``trainer/recipe/pipeline.py``).
"""
from __future__ import annotations

import contextlib
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from curriculum.config import check_against_domains
from curriculum.curriculum import Curriculum, domain_levels, mark_run
from curriculum.scheduler import StepWriteFailed
from curriculum.steps import format_error_examples, trained_metrics
from curriculum.store import StatsStore, StoreUnavailable, default_store_url, without_password
from domains.api import Task, one_line
from domains.canaries import canary_alarms, run_canaries
from domains.verify.backend import make_pool
from domains.verify.pool import Pool, VerifierPoolBroken
from domains.registry import load_all
from trainer import distributed
from trainer.config import ConfigError, PalestraConfig
from trainer.config_keys import as_stored_now, changed_settings
from trainer.models.adapters import attach_lora, base_state, save_plain, training_the_base
from trainer.models.loading import (check_model_source, check_resumable, checkpoint_activations, load_policy,
                                    model_path, pick_device)
from trainer.models.sharding import all_finite, gathered, is_sharded, shard
from trainer.recipe import checkpoint, step_report
from trainer.recipe.audit import CanaryPaid, canary_summary
from trainer.recipe.evaluate import HeldoutEvaluation, format_eval
from trainer.recipe.health import HealthMonitor
from trainer.recipe.metrics import MetricsLogger
from trainer.recipe.pipeline import RolloutPipeline
from trainer.recipe.sft import warm_start, warm_start_counts
from trainer.runtime import (StopOnSignal, arithmetic, autocast, library_versions, phase_threads, precision,
                             cap_kernel_caches, release_freed_memory, resident_gb, resume_hint, seed_everything,
                             trim_heap, within_share)
from trainer.sampling.collect import RolloutCollector
from trainer.sampling.decode import CapturedSampler
from trainer.sampling.rollout import Sampler, generate
from trainer.sampling.vllm_engine import VLLMEngine
from trainer.update.losses import group_advantages
from trainer.update.reference import make_reference
from trainer.update.schedule import apply_settings, lr_factor
from trainer.update.step import PolicyUpdate, SFTBlend, blend_for_rank


class GRPORecipe:
    def __init__(self, cfg: PalestraConfig) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)
        self.start_step = 0
        self.resumed_changes: list[str] = []  # settings a resume launched with, where they differ from the run's start
        self.pool: Pool | None = None
        self.logger: MetricsLogger | None = None
        self.store: StatsStore | None = None
        self.curriculum: distributed.SharedCurriculum | None = None
        self.run_id: str | None = None
        self.health = HealthMonitor(cfg.health)
        self.step_alarms: dict[int, list[str]] = {}  # the latest step's alarms, as stored
        self.world = distributed.World()  # setup joins the process group under torchrun
        self.pipeline: RolloutPipeline | None = None  # pipeline=async: the rollouts sampled ahead

    # -- setup ------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.world = distributed.init()  # one process, or this rank of a torchrun launch
        # Domains first: an unknown or broken plugin fails before anything heavy happens.
        self.domains = load_all(cfg.domains, cfg.domain_options, shared=cfg.model.domain_options())
        try:
            check_against_domains(cfg.policy, cfg.difficulty, domain_levels(self.domains))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        check_model_source(cfg.model)
        seed_everything(cfg.seed)
        self.heldout = HeldoutEvaluation(self.domains, cfg.eval, cfg.trainer.sampling)
        latest = self.world.broadcast(checkpoint.find(self.output_dir, cfg.resume) if self.world.is_main else None)
        if latest is not None:
            check_resumable(cfg.model, latest)
            # a resumed run goes on in its own folder (Hydra gives every launch a new one): the SFT
            # model that anchors the KL, the default SQLite store and the metrics are there
            self.output_dir = checkpoint.run_folder(latest) or self.output_dir
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.world.is_main:  # rank 0 alone records: one store connection, one run row; opened
            # before any model is built, so a store that cannot be used fails before that work
            self.store = StatsStore(cfg.store.url or default_store_url(self.output_dir))
        release_freed_memory(cfg.trainer.system.malloc_mmap_threshold_kb)  # before the models are built
        cap_kernel_caches(cfg.trainer.system.kernel_cache_capacity)  # before the first bf16 product
        self.device = self.world.place(pick_device(cfg.model.device))
        if self.device.type == "cpu":
            torch.set_num_threads(within_share(cfg.trainer.system.cpu_threads))
        path = self._build_models(resuming=latest is not None)
        parameters = sum(p.numel() for p in self.model.parameters())
        self.dtype = arithmetic(self.device, cfg.model.dtype, parameters)  # model.dtype=auto resolved
        self.pool = make_pool(self.domains, cfg.verifier)
        kind = cfg.trainer.sampler_kind(self.device.type)
        self.engine = (VLLMEngine(path, gpu_memory_utilization=cfg.trainer.sampling.vllm_gpu_memory_utilization,
                                  seed=cfg.seed) if kind == "vllm" else None)
        self.captured = CapturedSampler(cfg.trainer.sampling.sync_every) if kind == "captured" else None
        self._engine_stale = False  # the engine holds the weights it loaded until the policy changes
        self.collector = RolloutCollector(self.model, self.tokenizer, self.domains, self.pool, cfg.trainer,
                                          seed=cfg.seed, world=self.world, device=self.device,
                                          sampler=self._sampler, autocast=self._autocast)
        self.pipeline = self._pipeline()
        state = self._resume(latest) if latest is not None else None
        self.curriculum = distributed.SharedCurriculum(self.world, self._curriculum(state))
        self.run_id = self.curriculum.inner.run_id if self.world.is_main else self.run_id
        if self.pipeline is not None and state is not None:  # the next step's rollouts, sampled before the stop
            self.pipeline.load_state_dict(state, self.curriculum.inner)
        self.logger = (MetricsLogger(self.output_dir, cfg.trainer.steps - self.start_step, cfg.trainer.system.table_every)
                       if self.world.is_main else distributed.QuietLogger())
        self.update.alarm = self.logger.write
        self.logger.write(precision(self.device, cfg.model.dtype, parameters))
        if latest is not None:  # a requeued cluster job's log says it went on rather than started over
            changed = (f" with settings changed since it started: {'; '.join(self.resumed_changes)}"
                       if self.resumed_changes else "")
            self.logger.write(f"resuming run {self.run_id} at step {self.start_step}{changed}")

    def _pipeline(self) -> RolloutPipeline | None:
        """Under pipeline=async, the sampling copy of the policy and its own collector (eager sampler)."""
        cfg = self.cfg
        if cfg.trainer.system.pipeline != "async":
            return None
        if self.world.size > 1:
            raise ConfigError("trainer.system.pipeline=async runs in one process: launch without torchrun, or set "
                              "trainer.system.pipeline=sync")
        return RolloutPipeline(self.model, lambda model: RolloutCollector(
            model, self.tokenizer, self.domains, self.pool, cfg.trainer, seed=cfg.seed, world=self.world,
            device=self.device, sampler=lambda: generate, autocast=self._autocast))

    def _build_models(self, resuming: bool) -> str:
        """The policy (rank 0 builds the tiny model's folder; the other ranks then read it), the KL
        reference, the optimizer and its schedule; returns the policy's folder."""
        cfg, t = self.cfg, self.cfg.trainer
        path = self.world.main_first(lambda: model_path(cfg.model, self.output_dir, cfg.seed))
        anchor = self.output_dir / "sft-model"  # the post-SFT policy, written after SFT; read on resume
        post_sft = str(anchor) if resuming and (anchor / "config.json").exists() else path
        if resuming and cfg.model.lora.enabled and post_sft == path:
            raise ConfigError(f"resume: a LoRA run's adapters sit on its post-SFT base, and {anchor} is missing")
        # with LoRA a checkpoint holds only the adapters: the base is the post-SFT model
        self.tokenizer, self.model = load_policy(post_sft if cfg.model.lora.enabled else path, cfg.model, self.device)
        if cfg.model.gradient_checkpointing:
            checkpoint_activations(self.model)
        if cfg.model.lora.enabled:
            self.model = attach_lora(self.model, cfg.model.lora)
            self.world.broadcast_parameters(self.model)  # every rank starts from rank 0's adapters
        if t.system.sharding == "fsdp" and self.world.size > 1:
            bf16 = self.device.type == "cuda" and cfg.model.dtype == "bfloat16"  # gathered in bf16, reduced in fp32
            shard(self.model, self.world, self.device, bf16=bf16)
        self.reference = (make_reference(self.model, post_sft, cfg.model.reference_placement, self.device, self.world)
                          if t.loss.beta > 0 else None)
        trained = [p for p in self.model.parameters() if p.requires_grad]  # with LoRA: the adapters
        self.optimizer = torch.optim.AdamW(trained, lr=t.optim.lr, weight_decay=t.optim.weight_decay)
        self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, t.optim.warmup_steps, t.steps, t.optim.lr_decay))
        self.update = PolicyUpdate(self.model, self.optimizer, self.lr_schedule, t, reference=self.reference,
                                   world=self.world, autocast=self._autocast)
        return path

    @property
    def ref_model(self) -> torch.nn.Module | None:
        """The KL reference's own copy of the model: None at beta = 0, and with LoRA (the policy is its reference)."""
        return self.reference.model if self.reference is not None and self.reference.is_copy else None

    def _curriculum(self, state: dict | None) -> Curriculum | None:
        """Rank 0's curriculum: the run's plans, draws and every store write (the others hold none)."""
        if not self.world.is_main:
            return None
        cfg = self.cfg
        settings = dict(domains=self.domains, policy=cfg.policy, difficulty=cfg.difficulty, selection=cfg.selection,
                        cold_start=cfg.cold_start, group_size=cfg.trainer.group_size,
                        prompts_per_step=cfg.trainer.prompts_per_step, seed=cfg.seed,
                        write_behind=True,  # the database write overlaps training
                        heldout_ids={t.id for t in self.heldout.tasks})
        if state is None:
            return Curriculum.start(self.store, cfg.name, self._run_config(), sweep_id=cfg.sweep_id, **settings)
        return Curriculum.reopen(self.store, self.run_id, state, **settings)

    def _run_config(self) -> dict[str, Any]:
        """The config a run is stored with: its settings, the library versions it ran under, and the
        arithmetic it trains in (``model.dtype=auto`` is fp32 on one CPU and bf16 on another)."""
        return {**self.cfg.model_dump(mode="json"), "versions": library_versions(), "arithmetic": self.dtype}

    def _resume(self, path: Path) -> dict | None:
        """Model, optimizer and schedule from the checkpoint on every rank; rank 0 gets back the
        checkpoint's state for its curriculum, and the health alarms and evaluations."""
        state = checkpoint.load(path, self.model, self.optimizer, self.lr_schedule)
        apply_settings(self.optimizer, self.lr_schedule, self.cfg.trainer.optim.lr, self.cfg.trainer.optim.weight_decay)
        self._engine_stale = True
        self.start_step, self.run_id = state["step"], state["run_id"]
        if not self.world.is_main:  # a replica needs the model, optimizer and schedule; rank 0 the rest
            return None
        try:
            started = self.store.run(self.run_id)["config"]
        except KeyError:
            raise ConfigError(f"resume: {path} is of run {self.run_id}, which is not in the store "
                              f"{self.store.safe_url}; set store.url to the run's database") from None
        if started:  # the library versions are stored beside the settings: an upgrade is a change too
            # runs stored before passwords were hidden hold theirs: hide it on both sides
            self.resumed_changes = changed_settings(without_password(as_stored_now(started)),
                                                   without_password(self._run_config()))
        checkpoint.restore_rng(state["rng"])
        if "health" in state:  # checkpoints from before the alarms were saved start them afresh
            self.health.load_state_dict(state["health"])
        if not self.heldout.load_state_dict(state):
            # eval settings or domains changed since the checkpoint: the evaluation before GRPO was
            # of other tasks, or decoded them another way, so nothing after can be compared with it
            self.health.forget_evaluations()
        return state

    # -- train ------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        if cfg.audit.at_start:  # before any work: a verifier that pays for an exploit says so now
            self._check_canaries(self.start_step)
        if self.start_step == 0:
            self._warm_start()
        step = done = self.start_step
        self.logger.bar.reset(total=cfg.trainer.steps - self.start_step)  # the GRPO clock starts now
        try:
            with StopOnSignal() as stop:
                for step in range(self.start_step + 1, cfg.trainer.steps + 1):
                    metrics = self.train_step(step)
                    done = step
                    self.logger.advance(step, metrics)
                    if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.trainer.steps:
                        self._evaluate(step, f"held-out success at step {step}")
                    if cfg.audit.due(step):
                        self._check_canaries(step)
                    if self.world.any(stop.requested):  # SIGTERM/SIGINT: finish the step, save, leave
                        path = self.save_checkpoint(step)
                        interrupt = KeyboardInterrupt(f"stopped by signal after step {step}; {resume_hint(path)}")
                        interrupt.signum = stop.signum  # type: ignore[attr-defined]  # for the exit status
                        raise interrupt
                    if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < cfg.trainer.steps:
                        self.save_checkpoint(step)  # the last step's is saved by the closing evaluation
            self._closing_evaluation(cfg.trainer.steps)
            self.save_checkpoint(cfg.trainer.steps)
        except (StepWriteFailed, StoreUnavailable) as exc:
            # raised once the step is applied to the model and the scheduler (a prompt selector
            # whose store write failed skips that step's statistics), so ``step`` is complete
            self._checkpoint_unwritten(step, exc)
        except VerifierPoolBroken as exc:
            # broken at an evaluation after a finished step: that step is saved; a step the pool
            # broke in never reached the model, and the last periodic checkpoint stands
            path = self.save_checkpoint(done) if done == step and done > self.start_step else None
            raise VerifierPoolBroken(f"{exc}; {resume_hint(path)}") from None
        return self.summary()

    def _warm_start(self) -> None:
        """SFT on the domains' references, then the held-out evaluation GRPO starts from."""
        cfg = self.cfg
        self.logger.write(f"SFT warm start: {cfg.sft.steps} steps")
        with self._cpu_threads(cfg.sft.cpu_threads):
            # with LoRA the warm start trains the base, adapters off; sharded ranks all compute the
            # same batch's gradient and sum them, so each takes its share
            with training_the_base(self.model):
                warm_start(self.model, self.tokenizer, self.domains, cfg.sft, draw=self.curriculum.draw,
                           seed=cfg.seed, log=self._log_sft,
                           grad_scale=1 / self.world.size if is_sharded(self.model) else 1.0)
        if not is_sharded(self.model):  # every rank ran the same warm start; rank 0's weights win
            self.world.broadcast_parameters(self.model)  # should a kernel differ
        self._engine_stale = True
        if self.reference is not None or cfg.model.lora.enabled:
            post_sft = base_state(self.model)  # on every rank: a sharded model's weights are gathered
            if self.world.is_main:  # the anchor (and LoRA's base) again on resume, and a model folder of its own
                save_plain(self.model, self.output_dir / "sft-model", post_sft)
                self.tokenizer.save_pretrained(self.output_dir / "sft-model")
            if self.reference is not None:  # the KL anchor is the policy RL starts from, after SFT
                self.reference.take_weights(post_sft)  # last: a sharded copy may free the gathered tensors
        self._evaluate(0, "held-out success before GRPO", keep="before")

    def train_step(self, step: int) -> dict[str, Any]:
        t, began = self.cfg.trainer, time.perf_counter()
        timer: dict[str, float] = defaultdict(float)
        ahead = self.pipeline.take(step) if self.pipeline is not None else None
        if ahead is not None:  # async: sampled during the last update, by the policy from before it
            plan, rollouts = ahead.plan, ahead.rollouts
            timer.update(ahead.timer)
        else:
            plan = self.curriculum.plan(step)
            with gathered(self.model):  # sharded: the full weights, so ranks may sample unequal amounts
                rollouts = self.collector.collect_step(plan, self.curriculum, timer)
            self._trim_heap()
        advantages = group_advantages(rollouts.batch.rewards, t.loss.advantage_std)  # [P, G]
        start = time.perf_counter()
        blend = self._blend(step, rollouts.batch.tasks)  # its draw before the rollout thread draws
        overlapped = self.pipeline is not None and step < t.steps
        # overlapped, the update and the rollout thread split the update's share of the cores
        with self._cpu_threads(max(1, within_share(t.system.update_cpu_threads) // 2) if overlapped
                               else t.system.update_cpu_threads):
            if overlapped:  # the next step is planned now, before this one is recorded
                self.pipeline.start(self.curriculum.plan(step + 1), self.model, self.curriculum)
            update = self.update(rollouts.batch.rollout, advantages.flatten(), blend)
        self._engine_stale = True
        self._trim_heap()
        timer["train"] = time.perf_counter() - start
        if self.pipeline is not None:
            update.update({"async/staleness": float(ahead is not None), "time/rollout_wait": self.pipeline.wait()})
        start = time.perf_counter()
        groups = rollouts.groups(advantages)
        metrics = step_report.step_metrics(step, rollouts, update, timer)
        # the groups that reached the update, by domain (``groups`` also holds those dynamic sampling left out)
        metrics.update(trained_metrics((task.domain for task in rollouts.batch.tasks), plan.domains))
        metrics = self.curriculum.record(step, groups, metrics)
        metrics["time/record"] = time.perf_counter() - start
        metrics["time/step"] = time.perf_counter() - began  # the step's wall time (overlapping parts once)
        metrics["memory/rss_gb"], metrics["memory/peak_rss_gb"] = resident_gb()
        self.logger.log(step, metrics)
        self._alarm(step, self.health.after_step(metrics, format_error_examples(groups)))
        return metrics

    def _blend(self, step: int, tasks: list[Task]) -> SFTBlend | None:
        """This rank's part of the step's SFT blend (none without a blend)."""
        chosen = self.blend_tasks(step, tasks)
        return blend_for_rank(self.tokenizer, self.domains, chosen, *self.world.share(len(chosen))) if chosen else None

    def blend_tasks(self, step: int, tasks: list[Task]) -> list[Task]:
        """The tasks whose references the SFT blend trains on (none without a blend): the step's own
        ``tasks``, or (sft_source warm_start) as many drawn with the warm start's distribution over
        domains and levels. That draw has a generator of its own, seeded by the step, so the
        training stream is left alone and a resumed run draws what the first one would have."""
        t = self.cfg.trainer
        if t.loss.sft_coef == 0:
            return []
        if t.loss.sft_source == "step":
            return tasks
        rng = random.Random(f"sft-blend/{self.cfg.seed}/{step}")
        counts = warm_start_counts(self.domains, self.cfg.sft.level_decay, len(tasks), rng)
        return self.curriculum.draw(counts, rng=rng)

    # -- evaluation, alarms and threads -------------------------------------------------------------
    def _evaluate(self, step: int, title: str, keep: str | None = None) -> None:
        """Held-out success, logged, printed and stored; ``keep`` files it under "before" or "after" GRPO."""
        start = time.perf_counter()
        with gathered(self.model):  # sharded: every rank gathers the weights, rank 0 evaluates on them
            if not self.world.is_main:  # rank 0 evaluates; the others wait for it at the next step
                return
            metrics = self.heldout.run(self.model, self.tokenizer, self.pool, self._sampler(), keep=keep)
            self._trim_heap()
        self.logger.log(step, {**metrics, "time/eval": time.perf_counter() - start}, phase="eval")
        self.logger.write(format_eval(metrics, title))
        try:
            self.curriculum.inner.record_evaluation(step, metrics)
        except StoreUnavailable as exc:  # metrics.jsonl has them; training goes on
            self.logger.write(f"warning: held-out metrics of step {step} not stored: {one_line(exc, 200)}")
        self._alarm(step, self.health.after_eval(metrics["eval/macro"]))

    def _closing_evaluation(self, step: int) -> None:
        """The held-out evaluation after the last step, with AdamW's moments on disk rather than in
        memory. Nothing updates the model after it, and the moments (twice the weights) are what the
        evaluation's KV cache would otherwise sit on: together they were the run's peak
        (docs/performance.md). They leave with this step's checkpoint and come back from it for the
        final one, the same values. One process only: a replica or shard keeps its own. Every run saves
        the last step here, before an evaluation that could fail."""
        saved = self.save_checkpoint(step)  # None when the weights are not finite: keep the moments
        release = saved is not None and self.world.size == 1 and not is_sharded(self.model)
        if release:
            self.optimizer.state.clear()
            self._trim_heap()
        try:
            self._evaluate(step, "held-out success after GRPO", keep="after")
        finally:
            if release:
                self.optimizer.load_state_dict(checkpoint.optimizer_state(saved))

    def _check_canaries(self, step: int) -> None:
        """Verify every domain's canaries (rank 0); one that earns reward raises an alarm, and with
        ``audit.stop_on_canary`` stops the run, with a checkpoint when the step's is not there yet."""
        alarms: list[str] = []
        if self.world.is_main:
            results = run_canaries(self.domains, self.pool, self.cfg.audit.tasks_per_level, self.cfg.eval.seed)
            self.pool.raise_if_broken()
            self.logger.write(canary_summary(step, results))
            alarms = canary_alarms(results)
            self._alarm(step, alarms)
            try:
                self.curriculum.inner.record_canaries(step, results)
            except StoreUnavailable as exc:  # the console and metrics.jsonl have them; training goes on
                self.logger.write(f"warning: canary results of step {step} not stored: {one_line(exc, 200)}")
        if not (self.world.any(bool(alarms)) and self.cfg.audit.stop_on_canary):
            return
        # the launch's first step is a resumed checkpoint, or nothing trained yet (a fresh start)
        path = self.save_checkpoint(step) if step > self.start_step else None
        if path is None and self.start_step == 0 and step == 0:
            raise CanaryPaid("a canary earned reward before training (audit.stop_on_canary): fix the verifier, "
                             "then start again")
        raise CanaryPaid(f"a canary earned reward at step {step} (audit.stop_on_canary): fix the verifier, then "
                         f"{resume_hint(path)}")

    def _alarm(self, step: int, alarms: list[str]) -> None:
        for alarm in alarms:
            self.logger.write(f"alarm at step {step}: {alarm}")
        if alarms:
            self.logger.log(step, {"alarms": alarms}, phase="alarm")
            self._store_alarms(step, alarms)

    def _store_alarms(self, step: int, alarms: list[str]) -> None:
        """Keep the step's alarms with its stored metrics, for ``palestra report``; a step can alarm
        after its update and again after its evaluation, so what the step said before is kept too."""
        if not self.world.is_main:
            return
        self.step_alarms = {step: self.step_alarms.get(step, []) + alarms}
        try:
            self.curriculum.inner.record_alarms(step, self.step_alarms[step])
        except StoreUnavailable as exc:  # metrics.jsonl has them; training goes on
            self.logger.write(f"warning: alarms of step {step} not stored: {one_line(exc, 200)}")

    def _log_sft(self, step: int, metrics: dict[str, float]) -> None:
        self.pool.raise_if_broken()  # a pool whose workers cannot start ends the run now, not after SFT
        self.logger.log(step, metrics, phase="sft")

    def _cpu_threads(self, threads: int | None):
        return phase_threads(self.device, threads, back_to=self.cfg.trainer.system.cpu_threads)

    def _trim_heap(self) -> None:
        """Between phases, with ``trainer.system.trim_heap``: the heap's free pages back to the OS."""
        if self.cfg.trainer.system.trim_heap:
            trim_heap()

    def _sampler(self) -> Sampler:
        """The trainer's own sampler (eager or captured), or the vLLM engine once it holds the
        current weights."""
        if self.engine is None:
            return self.captured or generate
        if self._engine_stale:
            self.engine.push_weights(self.model)
            self._engine_stale = False
        return self.engine

    def _autocast(self):
        return autocast(self.device, self.dtype)

    def summary(self) -> dict[str, Any]:
        return {"run_id": self.run_id, **self.heldout.summary()}

    # -- checkpoints and cleanup --------------------------------------------------------------------
    def _checkpoint_unwritten(self, step: int, exc: Exception) -> None:
        """The store stayed unreachable: save a checkpoint that carries the unwritten steps, then stop."""
        unwritten = self.curriculum.inner.take_unwritten()
        # rank 0 alone is here: the other ranks cannot join a sharded save
        alone = is_sharded(self.model)
        path = None if alone else self.save_checkpoint(step, unwritten=unwritten)
        why = "sharded: rank 0 cannot save alone" if alone else "non-finite weights"
        saved = (f"saved checkpoint {path} with {len(unwritten)} unwritten step(s)" if path is not None
                 else f"saved no checkpoint ({why}): {len(unwritten)} unwritten step(s) are lost")
        raise StoreUnavailable(f"the stats store is unreachable ({one_line(exc)}); {saved}; "
                               f"fix the store, then {resume_hint(path)}") from exc

    def save_checkpoint(self, step: int, unwritten: list[tuple] | None = None) -> Path | None:
        # replicated ranks hold the same weights and rank 0 everything else; sharded ones each save their shards
        if not self.world.is_main and not is_sharded(self.model):
            return None
        if not all_finite(self.model, self.world):
            # never let a poisoned model replace a good checkpoint
            self._alarm(step, ["non-finite weights: checkpoint not saved"])
            return None
        state = {}
        if self.world.is_main:
            curriculum = self.curriculum.inner.state_dict(allow_unwritten=unwritten is not None)
            state = {"run_id": self.run_id, **curriculum, "unwritten": unwritten or [], "rng": checkpoint.capture_rng(),
                     "health": self.health.state_dict(), **self.heldout.state_dict(),
                     **(self.pipeline.state_dict() if self.pipeline is not None else {})}
        return checkpoint.save(
            self.output_dir, step, keep=self.cfg.checkpoint.keep, model=self.model, tokenizer=self.tokenizer,
            optimizer=self.optimizer, lr_schedule=self.lr_schedule, export_merged=self.cfg.model.lora.export_merged,
            state=state, world=self.world)

    def cleanup(self, status: str = "finished") -> None:
        if self.pipeline is not None:  # before the pool: a collection in flight still verifies
            self.pipeline.close()
        if self.pool is not None:
            self.pool.close()
        if self.curriculum is not None and self.curriculum.inner is not None:
            with contextlib.suppress(StepWriteFailed):  # already reported, and carried by the checkpoint
                self.curriculum.inner.finish(status)
        elif self.store is not None and self.run_id is not None:  # a resume failed before its curriculum
            mark_run(self.store, self.run_id, status)
        if self.logger is not None:
            self.logger.close()
        distributed.shutdown()
