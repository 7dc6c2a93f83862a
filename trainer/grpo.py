"""The GRPO recipe: setup / train / save_checkpoint / cleanup.

One step: the scheduler plans how many prompts per (domain, level); tasks are drawn; G completions
per task are sampled in chunks, and each chunk's verification runs in the worker pool while the
next chunk generates; group-relative advantages feed the clipped policy loss; the step's outcomes
go back to the scheduler, which writes them to the store in one transaction.
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

from curriculum.prompts import PromptSelector
from curriculum.scheduler import Scheduler, StepWriteFailed
from curriculum.store import StatsStore, StoreUnavailable
from curriculum.types import Outcome, Plan
from domains.api import Status, Task, stable_hash
from domains.pool import VerifierPool
from domains.registry import load_all
from trainer import checkpoint
from trainer.batch import StepBatch, concat
from trainer.config import PalestraConfig
from trainer.evaluate import evaluate, format_eval, heldout_tasks
from trainer.health import HealthMonitor
from trainer.losses import grpo_loss, group_advantages
from trainer.metrics import MetricsLogger
from trainer.models import load_model, load_tokenizer, model_path, pick_device
from trainer.episodes import by_domain, sample_rows
from trainer.rollout import sequence_logprobs
from trainer.sft import reference_pairs, supervised_loss, warm_start
from trainer.tasks import TaskSource


class GRPORecipe:
    def __init__(self, cfg: PalestraConfig) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)
        self.start_step = 0
        self.pool: VerifierPool | None = None
        self.logger: MetricsLogger | None = None
        self.store: StatsStore | None = None
        self.run_id: str | None = None
        self.history: dict[str, dict[str, float]] = {}
        self.health = HealthMonitor(cfg.health)

    # -- setup ------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        # Domains first: an unknown or broken plugin fails before anything heavy happens.
        self.domains = load_all(cfg.domains, cfg.domain_options)
        seed_everything(cfg.seed)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.device = pick_device(cfg.model.device)
        if self.device.type == "cpu":
            torch.set_num_threads(cfg.trainer.cpu_threads)
        path = model_path(cfg.model, self.output_dir, cfg.seed)
        self.tokenizer = load_tokenizer(path, tiny=cfg.model.type == "tiny")
        self.model = load_model(path, self.device)
        anchor = self.output_dir / "sft-model"  # written after SFT; present when resuming
        ref_path = str(anchor) if (anchor / "config.json").exists() else path
        self.ref_model = load_model(ref_path, self.device).eval() if cfg.trainer.beta > 0 else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay)
        warmup = max(1, cfg.trainer.warmup_steps)
        self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.pool = VerifierPool(self.domains, workers=cfg.trainer.verifier_workers)
        self.store = StatsStore(cfg.store.url or f"sqlite:///{(self.output_dir / 'palestra.db').resolve()}")
        self.heldout = heldout_tasks(self.domains, cfg.eval.tasks_per_level, cfg.eval.seed)
        self.tasks = TaskSource(self.domains, {t.id for t in self.heldout}, cfg.seed)
        self.scheduler_args = dict(
            domain_levels={name: tuple(d.levels) for name, d in self.domains.items()},
            policy=cfg.policy, difficulty=cfg.difficulty, prompts_per_step=cfg.trainer.prompts_per_step,
            seed=cfg.seed, store=self.store, write_behind=True,  # the database write overlaps training
        )
        latest = checkpoint.find(self.output_dir, cfg.resume)
        if latest is not None:
            self._resume(latest)
        else:
            stored_config = {**cfg.model_dump(mode="json"), "versions": library_versions()}
            self.run_id = self.store.start_run(cfg.name, stored_config, cfg.seed, sweep_id=cfg.sweep_id)
            self.scheduler = Scheduler(run_id=self.run_id, **self.scheduler_args)
            self.tasks.selector = self._selector()
        self.logger = MetricsLogger(self.output_dir, cfg.trainer.steps - self.start_step, cfg.trainer.table_every)

    def _selector(self) -> PromptSelector:
        return PromptSelector(self.cfg.selection, seed=self.cfg.seed, store=self.store, run_id=self.run_id)

    def _resume(self, path: Path) -> None:
        state = checkpoint.load(path, self.model, self.optimizer, self.lr_schedule)
        self.start_step = state["step"]
        self.run_id = state["run_id"]
        assert self.store is not None
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
        self.generator.set_state(state["generator"])
        checkpoint.restore_rng(state["rng"])
        self.history = state.get("history", {})

    # -- train ------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        assert self.logger is not None
        if self.start_step == 0:
            self.logger.write(f"SFT warm start: {cfg.sft.steps} steps")
            warm_start(self.model, self.tokenizer, self.domains, cfg.sft, draw=self.tasks.draw, seed=cfg.seed,
                       log=lambda s, m: self.logger.log(s, m, phase="sft"))
            if self.ref_model is not None:  # the KL anchor is the policy RL starts from, after SFT
                self.ref_model.load_state_dict(self.model.state_dict())
                self.model.save_pretrained(self.output_dir / "sft-model")  # the anchor again on resume
            self.history["before"] = self._evaluate(0, "held-out success before GRPO")
        step = self.start_step
        self.logger.bar.reset(total=cfg.trainer.steps - self.start_step)  # the GRPO clock starts now
        try:
            with _StopOnSignal() as stop:
                for step in range(self.start_step + 1, cfg.trainer.steps + 1):
                    metrics = self.train_step(step)
                    self.logger.advance(step, metrics)
                    if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.trainer.steps:
                        self._evaluate(step, f"held-out success at step {step}")
                    if stop.requested:  # SIGTERM/SIGINT: finish the step, save, leave
                        self.save_checkpoint(step)
                        raise KeyboardInterrupt(f"stopped by signal after step {step}; resume with resume=auto")
                    if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
                        self.save_checkpoint(step)
            self.history["after"] = self._evaluate(cfg.trainer.steps, "held-out success after GRPO")
            self.save_checkpoint(cfg.trainer.steps)
        except StepWriteFailed as exc:
            # raised once the step is fully applied (model and scheduler), so ``step`` is complete
            self._checkpoint_unwritten(step, exc)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        before, after = self.history.get("before", {}), self.history.get("after", {})
        return {"run_id": self.run_id, "before": before, "after": after,
                "macro_gain": after.get("eval/macro", 0.0) - before.get("eval/macro", 0.0)}

    def _evaluate(self, step: int, title: str) -> dict[str, float]:
        assert self.pool is not None and self.logger is not None
        metrics = evaluate(
            self.model, self.tokenizer, self.heldout, self.pool, max_new_tokens=self.cfg.trainer.max_new_tokens,
            max_episode_tokens=self.cfg.trainer.max_episode_tokens,
            temperature=self.cfg.eval.temperature, batch_size=self.cfg.trainer.rollout_batch_size, seed=self.cfg.eval.seed,
        )
        self.logger.log(step, metrics, phase="eval")
        self.logger.write(format_eval(metrics, title))
        self._alarm(step, self.health.after_eval(metrics["eval/macro"]))
        return metrics

    def _alarm(self, step: int, alarms: list[str]) -> None:
        assert self.logger is not None
        for alarm in alarms:
            self.logger.write(f"alarm at step {step}: {alarm}")
        if alarms:
            self.logger.log(step, {"alarms": alarms}, phase="alarm")

    def train_step(self, step: int) -> dict[str, Any]:
        t = self.cfg.trainer
        timer: dict[str, float] = defaultdict(float)
        plan = self.scheduler.plan(step)
        batch, recorded = self._collect_with_refill(plan, timer)
        advantages = group_advantages(batch.rewards, t.advantage_std)  # [P, G]
        start = time.perf_counter()
        update = self._update(batch, advantages.flatten())
        timer["train"] = time.perf_counter() - start
        metrics = self._step_metrics(step, plan, batch, recorded, update, timer)
        start = time.perf_counter()
        outcomes = self._outcomes(recorded, batch, advantages)
        tasks = {task.id: task.to_json() for b in recorded for task in b.tasks}  # for replay
        self.scheduler.record(step, outcomes, metrics, tasks=tasks)
        self.tasks.selector.record(step, outcomes)
        metrics.update(self.tasks.selector.metrics())
        metrics["time/record"] = time.perf_counter() - start
        assert self.logger is not None
        self.logger.log(step, metrics)
        self._alarm(step, self.health.after_step(metrics))
        return metrics

    # -- rollouts -----------------------------------------------------------------------------------
    def _collect_with_refill(self, plan: Plan, timer: dict[str, float]) -> tuple[StepBatch, list[StepBatch]]:
        """Generate and verify the plan's tasks; with dynamic sampling, replace zero-variance groups.

        Returns the batch to train on and every batch generated (discarded groups count in the
        rollout budget and are recorded in the store)."""
        t = self.cfg.trainer
        generated = [self._collect(self.tasks.draw(plan.counts, step=plan.step), timer)]
        keep = [generated[0].select(_varied(generated[0]))] if t.dynamic_sampling else [generated[0]]
        for _ in range(t.max_refill_rounds if t.dynamic_sampling else 0):
            missing = t.prompts_per_step - sum(len(b.tasks) for b in keep)
            if missing <= 0:
                break
            # refill in the plan's own proportions of (domain, level)
            planned = Counter((task.domain, task.level) for b in generated for task in b.tasks)
            refill = self._collect(self.tasks.draw(_shrink(planned, missing), step=plan.step), timer)
            generated.append(refill)
            keep.append(refill.select(_varied(refill)[:missing]))
        keep = [b for b in keep if b.tasks] or [generated[0]]  # nothing varied: train on zeros (no-op)
        return concat(keep, self.tokenizer.pad_token_id), generated

    def _collect(self, tasks: list[Task], timer: dict[str, float]) -> StepBatch:
        """Sample G completions per task in chunks; verification of one chunk overlaps the next."""
        t = self.cfg.trainer
        assert self.pool is not None
        per_chunk = max(1, t.rollout_batch_size // t.group_size)
        parts, futures = [], []
        start = time.perf_counter()
        self.model.eval()
        for kind in by_domain(tasks):
            for first in range(0, len(kind), per_chunk):
                chunk = kind[first:first + per_chunk]
                rows = [task for task in chunk for _ in range(t.group_size)]
                with self._autocast():
                    rollout, texts = sample_rows(
                        self.model, self.tokenizer, rows, self.domains, max_new_tokens=t.max_new_tokens,
                        max_episode_tokens=t.max_episode_tokens, temperature=t.temperature, top_p=t.top_p,
                        generator=self.generator)
                futures.append([self.pool.submit(task, text) for task, text in zip(rows, texts)])
                parts.append(StepBatch(chunk, t.group_size, rollout, texts, []))
        self.model.train()
        timer["generate"] += time.perf_counter() - start
        start = time.perf_counter()
        for part, pending in zip(parts, futures):
            part.verdicts = [f.result() for f in pending]
        timer["verify_wait"] += time.perf_counter() - start
        return concat(parts, self.tokenizer.pad_token_id)

    # -- update ---------------------------------------------------------------------------------------
    def _update(self, batch: StepBatch, advantages: torch.Tensor) -> dict[str, float]:
        """mu passes of the clipped objective over the batch, in micro-batches (one optimizer step each)."""
        t = self.cfg.trainer
        r = batch.rollout
        seqs, attn = r.sequences.to(self.device), r.attention_mask.to(self.device)
        mask = r.completion_mask.float()
        if t.mask_truncated:
            mask[r.truncated] = 0.0
        mask, adv = mask.to(self.device), advantages.to(self.device)
        rows = seqs.shape[0]
        chunks = [slice(i, min(i + t.micro_batch_size, rows)) for i in range(0, rows, t.micro_batch_size)]
        old_logp = self._frozen_logprobs(self.model, seqs, attn, r.prompt_width, chunks) if t.mu > 1 else None
        ref_logp = self._frozen_logprobs(self.ref_model, seqs, attn, r.prompt_width, chunks) if self.ref_model else None
        total_tokens = float(mask.sum().clamp(min=1.0))
        sft_pairs = reference_pairs(self.tokenizer, batch.tasks, self.domains) if t.sft_coef > 0 else []
        stats: dict[str, float] = defaultdict(float)
        for _ in range(t.mu):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in chunks:
                weight = (float(mask[mb].sum()) / total_tokens) if t.aggregation == "token_mean" else (mb.stop - mb.start) / rows
                left, right = _padding_bounds(attn[mb], mask[mb], r.prompt_width)
                with self._autocast():
                    logp, entropy = sequence_logprobs(self.model, seqs[mb, left:r.prompt_width + right],
                                                      attn[mb, left:r.prompt_width + right], r.prompt_width - left,
                                                      with_entropy=True)
                out = grpo_loss(
                    logp, old_logp[mb, :right] if old_logp is not None else logp.detach(), adv[mb], mask[mb, :right],
                    eps_low=t.eps_low, eps_high=t.eps_high, aggregation=t.aggregation, max_tokens=t.max_new_tokens,
                    ref_logp=ref_logp[mb, :right] if ref_logp is not None else None, beta=t.beta,
                    entropy=entropy if t.entropy_coef > 0 else entropy.detach(), entropy_coef=t.entropy_coef,
                )
                (out.loss * weight).backward()
                for key in ("policy_loss", "kl", "clip_low_frac", "clip_high_frac", "entropy"):
                    stats[key] += getattr(out, key) * weight / t.mu
                stats["loss"] += out.loss.item() * weight / t.mu
            if sft_pairs:
                sft = supervised_loss(self.model, sft_pairs, self.tokenizer.pad_token_id)
                (t.sft_coef * sft).backward()
                stats["sft_loss"] += sft.item() / t.mu
            stats["grad_norm"] += self._optimizer_step() / t.mu
        stats["lr"] = self.lr_schedule.get_last_lr()[0]
        self.lr_schedule.step()
        return dict(stats)

    def _optimizer_step(self) -> float:
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
                out[mb] = sequence_logprobs(model, seqs[mb, left:], attn[mb, left:], prompt_width - left)[0]
        return out

    def _autocast(self):
        if self.device.type == "cuda" and self.cfg.model.dtype in ("auto", "bfloat16"):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- records and metrics --------------------------------------------------------------------------
    def _outcomes(self, recorded: list[StepBatch], trained: StepBatch, advantages: torch.Tensor) -> list[Outcome]:
        trained_adv = {(task.id, g): float(advantages[p, g]) for p, task in enumerate(trained.tasks)
                       for g in range(trained.group_size)}
        outcomes, group = [], 0
        for batch in recorded:
            for p, task in enumerate(batch.tasks):
                prompt_hash = stable_hash(task.prompt)
                version = self.domains[task.domain].version
                for g in range(batch.group_size):
                    row = p * batch.group_size + g
                    verdict, text = batch.verdicts[row], batch.texts[row]
                    outcomes.append(Outcome(
                        domain=task.domain, level=task.level, task_id=task.id, group=group,
                        reward=verdict.result.reward, correct=verdict.result.correct,
                        status=verdict.result.status.value, advantage=trained_adv.get((task.id, g), 0.0),
                        prompt_hash=prompt_hash, completion_hash=stable_hash(text), latency_s=verdict.latency_s,
                        completion=text, verifier_version=version,
                    ))
                group += 1
        return outcomes

    def _step_metrics(self, step, plan, batch, recorded, update, timer) -> dict[str, Any]:
        r = batch.rollout
        lengths = r.completion_mask.sum(dim=1).float()
        rewards = batch.rewards
        generated_tokens = sum(int(b.rollout.completion_mask.sum()) for b in recorded)
        all_tasks = [t for b in recorded for t in b.tasks]
        all_verdicts = [v for b in recorded for v in b.verdicts]
        metrics: dict[str, Any] = {
            "step": step,
            "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
            "zero_variance_share": float(torch.cat([b.zero_variance() for b in recorded]).float().mean()),
            "completion_len/mean": float(lengths.mean()), "completion_len/max": float(lengths.max()),
            "truncated_rate": float(r.truncated.float().mean()),
            "rollouts": sum(len(b.verdicts) for b in recorded),
            "tokens_per_s": generated_tokens / max(timer["generate"], 1e-9),
            "time/generate": timer["generate"], "time/verify_wait": timer["verify_wait"], "time/train": timer["train"],
            **update,
        }
        per_domain = _per_domain(all_tasks, all_verdicts, batch.group_size, recorded)
        for i, name in enumerate(plan.domains):
            row = per_domain.get(name, {})
            metrics[f"domain/{name}/weight"] = float(plan.weights[i])
            metrics[f"domain/{name}/level"] = int(plan.levels[i])
            metrics[f"domain/{name}/prompts"] = sum(n for (d, _), n in plan.counts.items() if d == name)
            for key, value in row.items():
                metrics[f"domain/{name}/{key}"] = value
        return metrics

    # -- checkpoints and cleanup --------------------------------------------------------------------
    def _checkpoint_unwritten(self, step: int, exc: Exception) -> None:
        """The store stayed unreachable: save a checkpoint that carries the unwritten steps, then stop."""
        unwritten = self.scheduler.take_unwritten()
        path = self.save_checkpoint(step, unwritten=unwritten)
        raise StoreUnavailable(
            f"the stats store is unreachable ({' '.join(str(exc).split())[:300]}); saved checkpoint {path} "
            f"with {len(unwritten)} unwritten step(s); fix the store, then run again with resume=auto"
        ) from exc

    def save_checkpoint(self, step: int, unwritten: list[tuple] | None = None) -> Path | None:
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
                   "generator": self.generator.get_state(), "rng": checkpoint.capture_rng(), "history": self.history},
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
                print(f"warning: could not mark run {self.run_id} {status}: {' '.join(str(exc).split())[:200]}")
        if self.logger is not None:
            self.logger.close()


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


def _varied(batch: StepBatch) -> list[int]:
    return [p for p, flat in enumerate(batch.zero_variance().tolist()) if not flat]


def _shrink(counts: Counter, total: int) -> dict[tuple[str, int], int]:
    """Take ``total`` slots from ``counts`` in proportion, deterministically."""
    slots = [slot for slot, n in sorted(counts.items()) for _ in range(n)]
    step = max(1, len(slots) // total)
    picked = Counter(slots[::step][:total])
    return dict(picked)


def _per_domain(tasks, verdicts, group_size, recorded) -> dict[str, dict[str, float]]:
    """Reward, zero-variance share, error counts, success by level and (tool domains) call stats."""
    rows: dict[str, list] = defaultdict(list)
    for i, verdict in enumerate(verdicts):
        rows[tasks[i // group_size].domain].append((tasks[i // group_size].level, verdict.result))
    zero_var: dict[str, list[bool]] = defaultdict(list)
    for b in recorded:
        for task, flat in zip(b.tasks, b.zero_variance().tolist()):
            zero_var[task.domain].append(flat)
    out = {}
    for name, results in rows.items():
        statuses = Counter(r.status for _, r in results)
        stats = {
            "reward": float(np.mean([r.reward for _, r in results])), "zero_var": float(np.mean(zero_var[name])),
            "errors": statuses[Status.ERROR] + statuses[Status.TIMEOUT] + statuses[Status.SANDBOX_VIOLATION],
            "format_errors": statuses[Status.FORMAT_ERROR],
        }
        for level in sorted({lv for lv, _ in results}):
            stats[f"level{level}/success"] = float(np.mean([r.correct for lv, r in results if lv == level]))
        episodes = [r.details for _, r in results if "turns" in r.details]
        if episodes:  # tool domains: their verifier reports what it replayed
            calls = sum(d.get("calls", 0) for d in episodes)
            stats["tool_calls"] = calls / len(episodes)
            stats["turns"] = float(np.mean([d["turns"] for d in episodes]))
            stats["invalid_call_rate"] = sum(d.get("invalid_calls", 0) for d in episodes) / max(1, calls)
        out[name] = stats
    return out


class _StopOnSignal:
    """Turn SIGTERM/SIGINT into a request to stop after the current step (main thread only)."""

    def __enter__(self) -> "_StopOnSignal":
        self.requested = False
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._request)
        return self

    def _request(self, signum, frame) -> None:
        if self.requested:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested = True

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
