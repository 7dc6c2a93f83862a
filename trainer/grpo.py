"""The GRPO recipe: setup / train / save_checkpoint / cleanup.

One step: the scheduler plans how many prompts per (domain, level); tasks are drawn; G completions
per task are sampled in chunks, and each chunk's verification runs in the worker pool while the
next chunk generates; group-relative advantages feed the clipped policy loss; the step's outcomes
go back to the scheduler, which writes them to the store in one transaction.

Under ``torchrun`` the ranks share each step's sampling, verification and training; rank 0 alone
plans and records (``trainer/distributed.py`` explains the split).
"""
from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from curriculum.compare import DEFAULT_MASTERY, heldout_metrics
from curriculum.config import check_against_domains
from curriculum.prompts import PromptSelector
from curriculum.scheduler import Scheduler, StepWriteFailed
from curriculum.store import StatsStore, StoreUnavailable, without_password
from curriculum.types import Plan
from domains.api import Task, one_line
from domains.verify.backend import make_pool
from domains.verify.pool import Pool, VerifierPoolBroken
from domains.registry import load_all
from trainer import checkpoint, distributed, step_report
from trainer.batch import (StepBatch, chunk_seed, concat, generation_chunks, rollout_on_cpu, shrink_counts,
                           varied_groups)
from trainer.config import ConfigError, PalestraConfig, changed_settings
from trainer.evaluate import Hits, evaluate, format_eval, heldout_tasks, paired_gain_interval, summarise
from trainer.health import HealthMonitor
from trainer.losses import grpo_loss, group_advantages
from trainer.metrics import MetricsLogger
from trainer.models import check_model_source, check_resumable, load_model, load_policy, model_path, pick_device
from trainer.episodes import by_rollout, sample_rows
from trainer.rollout import Sampler, generate, sequence_logprobs
from trainer.schedule import apply_settings, lr_factor
from trainer.sft import reference_pairs, supervised_loss, warm_start, warm_start_counts
from trainer.tasks import TaskSource
from trainer.vllm_engine import VLLMEngine


class GRPORecipe:
    def __init__(self, cfg: PalestraConfig) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)
        self.start_step = 0
        self.resumed_changes: list[str] = []  # settings a resume launched with, where they differ from the run's start
        self.pool: Pool | None = None
        self.logger: MetricsLogger | None = None
        self.store: StatsStore | None = None
        self.run_id: str | None = None
        self.heldout_hits: dict[str, Hits] = {}  # "before"/"after" GRPO: held-out success, task by task
        self.health = HealthMonitor(cfg.health)
        self.world = distributed.World()  # setup joins the process group under torchrun

    # -- setup ------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.world = distributed.init()  # one process, or this rank of a torchrun launch
        # Domains first: an unknown or broken plugin fails before anything heavy happens.
        self.domains = load_all(cfg.domains, cfg.domain_options)
        try:
            check_against_domains(cfg.policy, cfg.difficulty, {n: tuple(d.levels) for n, d in self.domains.items()})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        check_model_source(cfg.model)
        seed_everything(cfg.seed)
        self.heldout = heldout_tasks(self.domains, cfg.eval.tasks_per_level, cfg.eval.seed)
        self.tasks = TaskSource(self.domains, {t.id for t in self.heldout}, cfg.seed)
        latest = self.world.broadcast(checkpoint.find(self.output_dir, cfg.resume) if self.world.is_main else None)
        if latest is not None:
            check_resumable(cfg.model, latest)
            # a resumed run goes on in its own folder (Hydra gives every launch a new one): the SFT
            # model that anchors the KL, the default SQLite store and the metrics are there
            self.output_dir = checkpoint.run_folder(latest) or self.output_dir
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.world.is_main:  # rank 0 alone records: one store connection, one run row; opened
            # before any model is built, so a store that cannot be used fails before that work
            self.store = StatsStore(cfg.store.url or f"sqlite:///{(self.output_dir / 'palestra.db').resolve()}")
        self.device = self.world.place(pick_device(cfg.model.device))
        if self.device.type == "cpu":
            torch.set_num_threads(self._sampling_threads())
        # rank 0 builds the tiny model's folder; the other ranks then read it
        path = self.world.main_first(lambda: model_path(cfg.model, self.output_dir, cfg.seed))
        self.tokenizer, self.model = load_policy(path, cfg.model, self.device)
        anchor = self.output_dir / "sft-model"  # written after SFT; present when resuming
        ref_path = str(anchor) if (anchor / "config.json").exists() else path
        self.ref_model = load_model(ref_path, self.device).eval() if cfg.trainer.beta > 0 else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay)
        t = cfg.trainer
        self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, t.warmup_steps, t.steps, t.lr_decay))
        self.pool = make_pool(self.domains, cfg.verifier)
        self.engine = (VLLMEngine(path, gpu_memory_utilization=cfg.trainer.vllm_gpu_memory_utilization, seed=cfg.seed)
                       if cfg.trainer.rollout_backend == "vllm" else None)
        self._engine_stale = False  # the engine holds the weights it loaded until the policy changes
        self.scheduler_args = dict(
            domain_levels={name: tuple(d.levels) for name, d in self.domains.items()},
            policy=cfg.policy, difficulty=cfg.difficulty, prompts_per_step=cfg.trainer.prompts_per_step,
            seed=cfg.seed, store=self.store, write_behind=True,  # the database write overlaps training
        )
        if latest is not None:
            self._resume(latest)
        elif self.world.is_main:
            self.run_id = self.store.start_run(cfg.name, self._run_config(), cfg.seed, sweep_id=cfg.sweep_id)
            self.scheduler = Scheduler(run_id=self.run_id, **self.scheduler_args)
            self.tasks.selector = self._selector()
        self.logger = (MetricsLogger(self.output_dir, cfg.trainer.steps - self.start_step, cfg.trainer.table_every)
                       if self.world.is_main else distributed.QuietLogger())
        if self.resumed_changes:
            self.logger.write(f"resuming run {self.run_id} at step {self.start_step} with settings changed since it "
                              f"started: {'; '.join(self.resumed_changes)}")

    def _run_config(self) -> dict[str, Any]:
        """The config a run is stored with: its settings and the library versions it ran under."""
        return {**self.cfg.model_dump(mode="json"), "versions": library_versions()}

    def _selector(self) -> PromptSelector:
        return PromptSelector(self.cfg.selection, seed=self.cfg.seed, store=self.store, run_id=self.run_id)

    def _resume(self, path: Path) -> None:
        state = checkpoint.load(path, self.model, self.optimizer, self.lr_schedule)
        apply_settings(self.optimizer, self.lr_schedule, self.cfg.trainer.lr, self.cfg.trainer.weight_decay)
        self._engine_stale = True
        self.start_step = state["step"]
        if not self.world.is_main:  # a replica needs the model, optimizer and schedule; rank 0 the rest
            self.run_id = state["run_id"]
            return
        assert self.store is not None
        try:
            started = self.store.run(state["run_id"])["config"]
        except KeyError:
            raise ConfigError(f"resume: {path} is of run {state['run_id']}, which is not in the store "
                              f"{self.store.safe_url}; set store.url to the run's database") from None
        self.run_id = state["run_id"]
        if started:  # the library versions are stored beside the settings: an upgrade is a change too
            # runs stored before passwords were hidden hold theirs: hide it on both sides
            self.resumed_changes = changed_settings(without_password(started), without_password(self._run_config()))
        # Steps after the checkpoint are redone; their rows must not count twice. Steps the store
        # could not take before the checkpoint travel in it and are written now.
        self.store.discard_after(self.run_id, self.start_step)
        for run_id, step, plan, outcomes, metrics, stats, tasks in state.get("unwritten", []):
            self.store.write_step(run_id, step, plan, outcomes, metrics, step_stats=stats, tasks=tasks)
        self.scheduler = Scheduler(run_id=self.run_id, **self.scheduler_args)
        self.scheduler.load_state_dict(state["scheduler"])
        self.tasks.load_state_dict(state["tasks"])
        self.tasks.selector = self._selector()
        self.tasks.selector.load_state_dict(state["selector"])
        checkpoint.restore_rng(state["rng"])
        if "health" in state:  # checkpoints from before the alarms were saved start them afresh
            self.health.load_state_dict(state["health"])
        self.heldout_hits = state.get("heldout_hits", {})
        settings = self._evaluation_settings()
        if (state.get("heldout_ids") != [t.id for t in self.heldout]
                or state.get("heldout_settings", settings) != settings):
            # eval settings or domains changed since the checkpoint: the evaluation before GRPO was
            # of other tasks, or decoded them another way, so nothing after can be compared with it
            self.heldout_hits = {}
            self.health.forget_evaluations()

    # -- train ------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        assert self.logger is not None
        if self.start_step == 0:
            self.logger.write(f"SFT warm start: {cfg.sft.steps} steps")
            with self._cpu_threads(cfg.sft.cpu_threads):
                warm_start(self.model, self.tokenizer, self.domains, cfg.sft, draw=self.tasks.draw, seed=cfg.seed,
                           log=self._log_sft)
            # every rank ran the same warm start; rank 0's weights win should a kernel differ
            self.world.broadcast_parameters(self.model)
            self._engine_stale = True
            if self.ref_model is not None:  # the KL anchor is the policy RL starts from, after SFT
                self.ref_model.load_state_dict(self.model.state_dict())
                if self.world.is_main:  # the anchor again on resume, and a model folder of its own
                    self.model.save_pretrained(self.output_dir / "sft-model")
                    self.tokenizer.save_pretrained(self.output_dir / "sft-model")
            self._evaluate(0, "held-out success before GRPO", keep="before")
        step = done = self.start_step
        self.logger.bar.reset(total=cfg.trainer.steps - self.start_step)  # the GRPO clock starts now
        try:
            with _StopOnSignal() as stop:
                for step in range(self.start_step + 1, cfg.trainer.steps + 1):
                    metrics = self.train_step(step)
                    done = step
                    self.logger.advance(step, metrics)
                    if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.trainer.steps:
                        self._evaluate(step, f"held-out success at step {step}")
                    if self.world.any(stop.requested):  # SIGTERM/SIGINT: finish the step, save, leave
                        path = self.save_checkpoint(step)
                        interrupt = KeyboardInterrupt(f"stopped by signal after step {step}; {_resume_hint(path)}")
                        interrupt.signum = stop.signum  # type: ignore[attr-defined]  # for the exit status
                        raise interrupt
                    if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
                        self.save_checkpoint(step)
            self._evaluate(cfg.trainer.steps, "held-out success after GRPO", keep="after")
            self.save_checkpoint(cfg.trainer.steps)
        except (StepWriteFailed, StoreUnavailable) as exc:
            # raised once the step is applied to the model and the scheduler (a prompt selector
            # whose store write failed skips that step's statistics), so ``step`` is complete
            self._checkpoint_unwritten(step, exc)
        except VerifierPoolBroken as exc:
            # broken at an evaluation after a finished step: that step is saved; a step the pool
            # broke in never reached the model, and the last periodic checkpoint stands
            path = self.save_checkpoint(done) if done == step and done > self.start_step else None
            raise VerifierPoolBroken(f"{exc}; {_resume_hint(path)}") from None
        return self.summary()

    def _log_sft(self, step: int, metrics: dict[str, float]) -> None:
        assert self.pool is not None and self.logger is not None
        self.pool.raise_if_broken()  # a pool whose workers cannot start ends the run now, not after SFT
        self.logger.log(step, metrics, phase="sft")

    @contextlib.contextmanager
    def _cpu_threads(self, threads: int | None):
        """Torch's CPU threads set to ``threads`` for a phase (None: this rank's share of the cores),
        then back to the sampling count."""
        if self.device.type != "cpu":
            yield
            return
        torch.set_num_threads(_within_share(threads))
        try:
            yield
        finally:
            torch.set_num_threads(self._sampling_threads())

    def _sampling_threads(self) -> int:
        return _within_share(self.cfg.trainer.cpu_threads)

    def summary(self) -> dict[str, Any]:
        hits = self.heldout_hits
        before, after = (summarise(hits[k]) if k in hits else {} for k in ("before", "after"))
        summary = {"run_id": self.run_id, "before": before, "after": after, "macro_gain": None}
        if before and after:
            summary["macro_gain"] = after["eval/macro"] - before["eval/macro"]
            summary["macro_gain_ci95"] = paired_gain_interval(hits["before"], hits["after"], seed=self.cfg.eval.seed)
        return summary

    def _evaluate(self, step: int, title: str, keep: str | None = None) -> dict[str, float]:
        """Held-out success, logged and printed; ``keep`` files it under "before" or "after" GRPO."""
        if not self.world.is_main:  # rank 0 evaluates; the others wait for it at the next step
            return {}
        assert self.pool is not None and self.logger is not None
        hits = evaluate(
            self.model, self.tokenizer, self.heldout, self.pool, max_new_tokens=self.cfg.trainer.max_new_tokens,
            max_episode_tokens=self.cfg.trainer.max_episode_tokens,
            temperature=self.cfg.eval.temperature, batch_size=self.cfg.trainer.rollout_batch_size, seed=self.cfg.eval.seed,
            samples=self.cfg.eval.samples,
            sampler=self._sampler(),
        )
        metrics = summarise(hits)
        if keep:
            self.heldout_hits[keep] = hits
        self.logger.log(step, metrics, phase="eval")
        self.logger.write(format_eval(metrics, title))
        self._store_heldout(step, metrics)
        self._alarm(step, self.health.after_eval(metrics["eval/macro"]))
        return metrics

    def _evaluation_settings(self) -> dict[str, Any]:
        """What decides how the held-out tasks are decoded and scored, besides the tasks themselves."""
        cfg = self.cfg
        return {"temperature": cfg.eval.temperature, "samples": cfg.eval.samples,
                "max_new_tokens": cfg.trainer.max_new_tokens, "max_episode_tokens": cfg.trainer.max_episode_tokens}

    def _store_heldout(self, step: int, metrics: dict[str, float]) -> None:
        """The evaluation joins the step's metrics in the store, under the keys ``palestra compare``
        and ``report`` read (the same as the simulator's), so training sweeps compare like simulated ones."""
        assert self.store is not None and self.scheduler is not None
        # a domain with no held-out tasks (a dataset with heldout_fraction 0) has no rate to store
        per_domain = np.array([metrics[f"eval/{n}"] for n in self.scheduler.domains if f"eval/{n}" in metrics])
        if not len(per_domain):
            return
        values = {**{k.replace("eval/", "heldout/", 1): v for k, v in metrics.items()},
                  **heldout_metrics(per_domain, mastery=DEFAULT_MASTERY, with_domains=True)}
        self.scheduler.flush()  # the step's own row first: merging into it must not race its write
        try:
            self.store.merge_metrics(self.run_id, step, values)
        except StoreUnavailable as exc:  # metrics.jsonl has them; training goes on
            self.logger.write(f"warning: held-out metrics of step {step} not stored: {one_line(exc, 200)}")

    def _alarm(self, step: int, alarms: list[str]) -> None:
        assert self.logger is not None
        for alarm in alarms:
            self.logger.write(f"alarm at step {step}: {alarm}")
        if alarms:
            self.logger.log(step, {"alarms": alarms}, phase="alarm")

    def train_step(self, step: int) -> dict[str, Any]:
        t = self.cfg.trainer
        timer: dict[str, float] = defaultdict(float)
        plan = self.world.broadcast(self.scheduler.plan(step) if self.world.is_main else None)
        batch, recorded, kept = self._collect_with_refill(plan, timer)
        advantages = group_advantages(batch.rewards, t.advantage_std)  # [P, G]
        start = time.perf_counter()
        sft_tasks = self._sft_tasks(step, batch)
        with self._cpu_threads(t.update_cpu_threads):
            update = self._update(batch, advantages.flatten(), sft_tasks)
        timer["train"] = time.perf_counter() - start
        metrics = step_report.step_metrics(step, plan, batch, recorded, update, timer)
        if self.world.is_main:  # every rank holds the whole step; rank 0 records it
            self._record(step, recorded, kept, advantages, metrics)
        return metrics

    def _record(self, step: int, recorded: list[StepBatch], kept: list[tuple[int, int]], advantages: torch.Tensor,
                metrics: dict[str, Any]) -> None:
        start = time.perf_counter()
        outcomes = step_report.outcomes(recorded, kept, advantages, self.domains)
        tasks = {task.id: task.to_json() for b in recorded for task in b.tasks}  # for replay
        # the selector counted while this step's tasks were drawn; its counts must be in the
        # metrics before the scheduler takes its copy for the store
        metrics.update(self.tasks.selector.metrics())
        self.scheduler.record(step, outcomes, metrics, tasks=tasks)
        self.tasks.selector.record(step, outcomes)
        metrics["time/record"] = time.perf_counter() - start
        assert self.logger is not None
        self.logger.log(step, metrics)
        self._alarm(step, self.health.after_step(metrics))

    # -- rollouts -----------------------------------------------------------------------------------
    def _collect_with_refill(self, plan: Plan, timer: dict[str, float]
                             ) -> tuple[StepBatch, list[StepBatch], list[tuple[int, int]]]:
        """Generate and verify the plan's tasks; with dynamic sampling, replace zero-variance groups.

        Returns the batch to train on, every batch generated (discarded groups count in the
        rollout budget and are recorded in the store) and, for each trained group in order, where
        it was generated: (batch, group) — a task drawn twice is two groups, not one."""
        t = self.cfg.trainer
        generated = [self._collect(self._draw(plan.counts, plan.step), timer, (plan.step, 0))]
        everything = list(range(len(generated[0].tasks)))
        kept = [(0, p) for p in (varied_groups(generated[0]) if t.dynamic_sampling else everything)]
        for refill_round in range(1, 1 + (t.max_refill_rounds if t.dynamic_sampling else 0)):
            missing = t.prompts_per_step - len(kept)
            if missing <= 0:
                break
            # refill in the plan's own proportions of (domain, level)
            planned = Counter((task.domain, task.level) for b in generated for task in b.tasks)
            refill = self._collect(self._draw(shrink_counts(planned, missing), plan.step), timer, (plan.step, refill_round))
            generated.append(refill)
            # keep a random subset of an overshooting refill: the first groups would always favour the
            # kinds sampled first (math before code before tool episodes)
            varied = varied_groups(refill)
            chosen = random.Random(f"refill/{self.cfg.seed}/{plan.step}/{refill_round}").sample(
                varied, min(missing, len(varied)))
            kept += [(refill_round, p) for p in sorted(chosen)]
        kept = kept or [(0, p) for p in everything]  # nothing varied: train on zeros (a no-op)
        parts = [generated[r].select([p for r2, p in kept if r2 == r]) for r in range(len(generated))]
        return concat([b for b in parts if b.tasks], self.tokenizer.pad_token_id), generated, kept

    def _draw(self, counts: dict[tuple[str, int], int], step: int) -> list[Task]:
        """Rank 0 draws (it owns the task source and the prompt selector); every rank gets the list."""
        return self.world.broadcast(self.tasks.draw(counts, step=step) if self.world.is_main else None)

    def _collect(self, tasks: list[Task], timer: dict[str, float], seed_key: tuple[int, int]) -> StepBatch:
        """Sample G completions per task in chunks; verification of one chunk overlaps the next.

        Each rank samples and verifies its contiguous share of the tasks; the shares are gathered,
        so every rank returns the whole batch. A chunk's sampling noise is seeded by (seed, step,
        round, position of its first task) — ``seed_key`` is (step, round) — never by the rank: a
        chunk gets the same completions in any number of processes, and again after a resume."""
        t = self.cfg.trainer
        assert self.pool is not None
        per_chunk = max(1, t.rollout_batch_size // t.group_size)
        tasks = [task for kind in by_rollout(tasks, self.domains) for task in kind]  # shares split kinds alike
        lo, hi = self.world.share(len(tasks))
        parts, futures = [], []
        start = time.perf_counter()
        self.model.eval()
        for first, chunk in generation_chunks(tasks[lo:hi], per_chunk, self.domains):
            rows = [task for task in chunk for _ in range(t.group_size)]
            noise = torch.Generator(device=self.device).manual_seed(chunk_seed(self.cfg.seed, *seed_key, lo + first))
            with self._autocast():
                rollout, texts = sample_rows(
                    self.model, self.tokenizer, rows, self.domains, max_new_tokens=t.max_new_tokens,
                    max_episode_tokens=t.max_episode_tokens, temperature=t.temperature, top_p=t.top_p,
                    generator=noise, sampler=self._sampler())
            futures.append([self.pool.submit(task, text) for task, text in zip(rows, texts)])
            parts.append(StepBatch(chunk, t.group_size, rollout_on_cpu(rollout), texts, []))
        self.model.train()
        timer["generate"] += time.perf_counter() - start
        start = time.perf_counter()
        for part, pending in zip(parts, futures):
            part.verdicts = [f.result() for f in pending]
        self.pool.raise_if_broken()  # before a batch of error verdicts reaches the model or the store
        parts = [part for share in self.world.gather(parts) for part in share]  # rank order = task order
        timer["verify_wait"] += time.perf_counter() - start  # with several ranks: until every share is in
        return concat(parts, self.tokenizer.pad_token_id)

    # -- update ---------------------------------------------------------------------------------------
    def _update(self, batch: StepBatch, advantages: torch.Tensor, sft_tasks: list[Task]) -> dict[str, float]:
        """mu passes of the clipped objective over the batch in micro-batches, plus the SFT blend's
        supervised loss on the references of ``sft_tasks``; one optimizer step per pass.

        With several ranks, each trains on its contiguous share of the rows and weights every
        loss term by its share of the *whole step's* normaliser — tokens for token_mean, sequences
        for seq_mean and constant, reference tokens for the SFT blend — so the gradients summed over
        the ranks are the one-process gradient, and so are the summed statistics."""
        t = self.cfg.trainer
        r = batch.rollout
        mask = r.completion_mask.float()
        if t.mask_truncated:
            mask[r.truncated] = 0.0
        step_rows, total_tokens = mask.shape[0], float(mask.sum().clamp(min=1.0))  # the whole step's
        trained = self._rows_to_train(advantages).nonzero().flatten()
        # kl, entropy and the clip fractions are reported as means over the rows trained on
        stat_rows, stat_tokens = max(1, len(trained)), float(mask[trained].sum().clamp(min=1.0))
        first, last = self.world.share(len(trained))
        mine = trained[first:last]  # this rank's rows: an even share of those trained on
        seqs, attn = r.sequences[mine].to(self.device), r.attention_mask[mine].to(self.device)
        mask, adv = mask[mine].to(self.device), advantages[mine].to(self.device)
        rows = seqs.shape[0]
        chunks = [slice(i, min(i + t.micro_batch_size, rows)) for i in range(0, rows, t.micro_batch_size)]
        old_logp = self._frozen_logprobs(self.model, seqs, attn, r.prompt_width, chunks) if t.mu > 1 else None
        ref_logp = self._frozen_logprobs(self.ref_model, seqs, attn, r.prompt_width, chunks) if self.ref_model else None
        # the SFT blend splits the step's tasks, not its rows: each task's references go to one rank
        sft_pairs, sft_share = (self._sft_share(sft_tasks, *self.world.share(len(sft_tasks)))
                                if sft_tasks else ([], None))
        stats: dict[str, float] = defaultdict(float)
        grad_norm = 0.0
        for _ in range(t.mu):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in chunks:
                if t.aggregation == "token_mean":
                    tokens = float(mask[mb].sum())
                    weight, stat_weight = tokens / total_tokens, tokens / stat_tokens
                else:
                    weight, stat_weight = (mb.stop - mb.start) / step_rows, (mb.stop - mb.start) / stat_rows
                left, right = _padding_bounds(attn[mb], mask[mb], r.prompt_width)
                with self._autocast():
                    logp, entropy = sequence_logprobs(self.model, seqs[mb, left:r.prompt_width + right],
                                                      attn[mb, left:r.prompt_width + right], r.prompt_width - left,
                                                      with_entropy=True, temperature=t.temperature)
                out = grpo_loss(
                    logp, old_logp[mb, :right] if old_logp is not None else logp.detach(), adv[mb], mask[mb, :right],
                    eps_low=t.eps_low, eps_high=t.eps_high, aggregation=t.aggregation, max_tokens=t.max_new_tokens,
                    ref_logp=ref_logp[mb, :right] if ref_logp is not None else None, beta=t.beta,
                    entropy=entropy if t.entropy_coef > 0 else entropy.detach(), entropy_coef=t.entropy_coef,
                )
                (out.loss * weight).backward()
                for key in ("kl", "clip_low_frac", "clip_high_frac", "entropy"):
                    stats[key] += getattr(out, key) * stat_weight / t.mu
                stats["policy_loss"] += out.policy_loss * weight / t.mu
                stats["loss"] += out.loss.item() * weight / t.mu
            if sft_pairs:
                sft = supervised_loss(self.model, sft_pairs, self.tokenizer.pad_token_id)
                (t.sft_coef * sft_share * sft).backward()
                stats["sft_loss"] += sft.item() * sft_share / t.mu
            grad_norm += self._optimizer_step() / t.mu
        # a step that trained no row measured no KL or entropy: those keys stay out (not zeros)
        keys = ["loss", "policy_loss"] + (["kl", "clip_low_frac", "clip_high_frac", "entropy"] if len(trained) else [])
        update = self.world.sum_floats(stats, keys + (["sft_loss"] if sft_share is not None else []))
        update.update(grad_norm=grad_norm, lr=self.lr_schedule.get_last_lr()[0], trained_row_share=len(trained) / step_rows)
        self.lr_schedule.step()
        return update

    def _rows_to_train(self, advantages: torch.Tensor) -> torch.Tensor:
        """Which rows of the step enter the update (a bool per row).

        A row whose advantage is zero (mostly: its group's rewards all agree) adds nothing to the
        policy loss; with ``skip_zero_advantage`` it is left out, and so is its forward, backward
        and reference pass. The loss keeps the whole step's normaliser, so the gradient is unchanged
        when beta and entropy_coef are 0; otherwise those rows' KL and entropy terms go too, and the
        KL anchor holds only where the policy is still learning. The tolerance catches flat groups
        of partial rewards whose float mean is not exact."""
        if not self.cfg.trainer.skip_zero_advantage:
            return torch.ones_like(advantages, dtype=torch.bool)
        return advantages.abs() > 1e-6

    def _sft_tasks(self, step: int, batch: StepBatch) -> list[Task]:
        """The tasks whose references the SFT blend trains on (none without a blend): the step's
        own, or (sft_source warm_start) as many drawn with the warm start's distribution over domains and levels.
        That draw has a generator of its own, seeded by the step, so the training stream is left
        alone and a resumed run draws what the first one would have. Rank 0 draws and every rank
        gets the list, as for the training tasks: a domain's sampler may depend on more than the
        generator (reasoning-gym falls back to an easier level after a deadline)."""
        t = self.cfg.trainer
        if t.sft_coef == 0:
            return []
        if t.sft_source == "step":
            return batch.tasks
        rng = random.Random(f"sft-blend/{self.cfg.seed}/{step}")
        counts = warm_start_counts(self.domains, self.cfg.sft.level_decay, len(batch.tasks), rng)
        return self.world.broadcast(self.tasks.draw(counts, rng=rng) if self.world.is_main else None)

    def _sft_share(self, tasks: list[Task], lo: int, hi: int) -> tuple[list, float | None]:
        """This rank's reference examples for the SFT blend (tasks[lo:hi]) and their share of the
        step's reference tokens (the supervised loss is a token mean over all of them); the share
        is None when no task of the step has a reference."""
        per_task = [reference_pairs(self.tokenizer, [task], self.domains) for task in tasks]
        tokens = [sum(sum(mask) for *_, mask in pairs) for pairs in per_task]
        if not sum(tokens):
            return [], None
        return [pair for pairs in per_task[lo:hi] for pair in pairs], sum(tokens[lo:hi]) / sum(tokens)

    def _sampler(self) -> Sampler:
        """The trainer's own sampler, or the vLLM engine once it holds the current weights."""
        if self.engine is None:
            return generate
        if self._engine_stale:
            self.engine.push_weights(self.model)
            self._engine_stale = False
        return self.engine

    def _optimizer_step(self) -> float:
        self._engine_stale = True
        self.world.sum_gradients(self.model)  # each rank's share of the step's gradient -> the whole
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip))
        if not math.isfinite(grad_norm):
            # A NaN/inf gradient would poison the weights; skip this update and say so.
            assert self.logger is not None
            self.logger.write(f"alarm: non-finite gradient norm ({grad_norm}); update skipped")
            self.optimizer.zero_grad(set_to_none=True)
            return float("nan")
        self.optimizer.step()
        return grad_norm

    @torch.no_grad()
    def _frozen_logprobs(self, model, seqs, attn, prompt_width, chunks) -> torch.Tensor:
        """Log-probs [B, L] under a frozen model (old policy or reference), micro-batch by micro-batch."""
        out = torch.zeros(seqs.shape[0], seqs.shape[1] - prompt_width, device=seqs.device)
        with self._autocast():
            for mb in chunks:
                left = _padding_bounds(attn[mb], None, prompt_width)[0]
                out[mb] = sequence_logprobs(model, seqs[mb, left:], attn[mb, left:], prompt_width - left,
                                            temperature=self.cfg.trainer.temperature)[0]
        return out

    def _autocast(self):
        if self.device.type == "cuda" and self.cfg.model.dtype in ("auto", "bfloat16"):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- checkpoints and cleanup --------------------------------------------------------------------
    def _checkpoint_unwritten(self, step: int, exc: Exception) -> None:
        """The store stayed unreachable: save a checkpoint that carries the unwritten steps, then stop."""
        unwritten = self.scheduler.take_unwritten()
        path = self.save_checkpoint(step, unwritten=unwritten)
        saved = (f"saved checkpoint {path} with {len(unwritten)} unwritten step(s)" if path is not None
                 else f"saved no checkpoint (non-finite weights): {len(unwritten)} unwritten step(s) are lost")
        raise StoreUnavailable(f"the stats store is unreachable ({one_line(exc)}); {saved}; "
                               f"fix the store, then {_resume_hint(path)}") from exc

    def save_checkpoint(self, step: int, unwritten: list[tuple] | None = None) -> Path | None:
        if not self.world.is_main:  # the ranks hold the same weights; rank 0 holds everything else
            return None
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            # never let a poisoned model replace a good checkpoint
            self._alarm(step, ["non-finite weights: checkpoint not saved"])
            return None
        return checkpoint.save(
            self.output_dir, step, keep=self.cfg.checkpoint.keep, model=self.model, tokenizer=self.tokenizer,
            optimizer=self.optimizer, lr_schedule=self.lr_schedule,
            state={"run_id": self.run_id, "scheduler": self.scheduler.state_dict(allow_unwritten=unwritten is not None),
                   "unwritten": unwritten or [], "tasks": self.tasks.state_dict(),
                   "selector": self.tasks.selector.state_dict(),
                   "rng": checkpoint.capture_rng(), "heldout_hits": self.heldout_hits,
                   "health": self.health.state_dict(),
                   "heldout_ids": [t.id for t in self.heldout], "heldout_settings": self._evaluation_settings()},
        )

    def cleanup(self, status: str = "finished") -> None:
        if self.pool is not None:
            self.pool.close()
        if getattr(self, "scheduler", None) is not None:
            try:
                self.scheduler.close()  # waits for the write-behind thread
            except StepWriteFailed:  # already reported, and carried by the checkpoint
                status = "failed"
        if self.store is not None and self.run_id is not None:
            try:
                self.store.finish_run(self.run_id, status)
            except Exception as exc:  # an unreachable store was already reported; never mask that
                print(f"warning: could not mark run {self.run_id} {status}: {one_line(exc, 200)}")
        if self.logger is not None:
            self.logger.close()
        distributed.shutdown()


def _within_share(threads: int | None) -> int:
    """``threads``, but never more than this rank's share of the cores (None: the whole share):
    ranks (or a rank and its verifier workers) that oversubscribe them spin-wait on each other."""
    share = distributed.core_share()
    return share if threads is None else min(threads, share)


def _resume_hint(path: Path | None) -> str:
    """How to go on: a saved checkpoint's path, or why there is none (other ranks do not save, and a
    model with non-finite weights is never saved)."""
    if path is None:
        return "resume from the last checkpoint saved (none was saved now)"
    return f"resume with resume={path}"


def _padding_bounds(attn: torch.Tensor, mask: torch.Tensor | None, prompt_width: int) -> tuple[int, int]:
    """Columns a micro-batch can drop: the prompt padding every row shares on the left, and (given
    the loss mask) the completion columns after its last counted token. Batches that mix short
    math answers with long tool episodes would otherwise pay for the longest row everywhere."""
    real = attn[:, :prompt_width].any(dim=0).nonzero()
    left = int(real[0]) if len(real) else 0
    if mask is None:
        return left, attn.shape[1] - prompt_width
    counted = mask.any(dim=0).nonzero()
    right = int(counted[-1]) + 1 if len(counted) else 1
    return left, right


class _StopOnSignal:
    """Turn SIGTERM/SIGINT into a request to stop after the current step (main thread only)."""

    def __enter__(self) -> "_StopOnSignal":
        self.requested = False
        self.signum = signal.SIGINT
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._request)
        return self

    def _request(self, signum, frame) -> None:
        if self.requested:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def library_versions() -> dict[str, str]:
    """Versions of what decides rewards and updates, stored with the run for audits."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("palestra", "math-verify", "sympy", "torch", "transformers", "jsonschema"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
