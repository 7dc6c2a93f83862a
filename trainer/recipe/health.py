"""Health alarms: signs that a run is going wrong while it still looks busy.

- reward hacking: the training reward keeps rising while held-out success falls;
- forgetting: held-out success falls well below its best so far, whatever the reward does (the
  reward is a poor witness here: the difficulty controller lowers it each time it raises a level);
- KL to the reference or the policy's entropy leaving configured bounds (collapse or blow-up);
- a non-finite loss (the update is skipped by the recipe; the alarm says so);
- a domain whose verifier could not judge some completions (a missing code sandbox, a verifier
  that raises), which then train as failures: said once per domain, at the first such step;
- a domain whose completions are nearly all format errors over the last steps (a model that never
  writes the answer the way the verifier reads it — a pretrained chat model given prompts it does
  not follow, say): said once per domain, quoting one completion;
- under the async pipeline, the behaviour policy (the stale copy that sampled) drifting too far from
  the policy trained: the spread of the per-token log(pi_old / pi_behaviour) above ``behaviour_drift_max``.
Alarms are logged (``alarm/*`` metrics and a console line); they never stop the run.
"""
from __future__ import annotations

import math
from collections import deque

from pydantic import Field

from curriculum.steps import domain_values
from domains.config import StrictModel


class HealthConfig(StrictModel):
    kl_max: float | None = Field(None, gt=0)
    entropy_min: float | None = Field(None, ge=0)
    entropy_max: float | None = Field(None, gt=0)
    reward_window: int = Field(20, ge=2)  # steps of training reward compared between evaluations
    heldout_drop_max: float | None = Field(0.1, gt=0)  # held-out macro this far below its best: alarm
    # a domain with at least this share of format errors over its last format_window steps: alarm
    format_error_share: float | None = Field(0.95, gt=0, le=1)
    format_window: int = Field(20, ge=1)
    # async pipeline: std of the per-token log(pi_old / pi_behaviour) over a step's trained tokens
    # above this: the importance weights that correct for the stale sampler are too spread to trust
    behaviour_drift_max: float | None = Field(0.5, gt=0)


class HealthMonitor:
    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg
        self.rewards: deque[float] = deque(maxlen=2 * cfg.reward_window)
        # (held-out macro, mean training reward then); the reward is None before any training step
        self.last_eval: tuple[float, float | None] | None = None
        self.best_macro: float | None = None
        self.unjudged_domains: set[str] = set()  # said once each: a missing sandbox would say it every step
        # per domain, (format errors, completions) of its last format_window steps; said once each
        self.format_counts: dict[str, deque[tuple[int, int]]] = {}
        self.format_domains: set[str] = set()

    def state_dict(self) -> dict:
        return {"rewards": list(self.rewards), "last_eval": self.last_eval, "best_macro": self.best_macro,
                "unjudged_domains": sorted(self.unjudged_domains),
                "format_counts": {d: list(window) for d, window in self.format_counts.items()},
                "format_domains": sorted(self.format_domains)}

    def load_state_dict(self, state: dict) -> None:
        """What a checkpoint saved; the alarms then compare with evaluations from before the resume."""
        self.rewards.extend(state["rewards"])
        self.last_eval = tuple(state["last_eval"]) if state["last_eval"] is not None else None
        self.best_macro = state["best_macro"]
        self.unjudged_domains = set(state.get("unjudged_domains", []))  # absent from older checkpoints
        self.format_counts = {d: deque(map(tuple, window), maxlen=self.cfg.format_window)
                              for d, window in state.get("format_counts", {}).items()}
        self.format_domains = set(state.get("format_domains", []))

    def forget_evaluations(self) -> None:
        """The held-out tasks changed: earlier evaluations are no yardstick for later ones."""
        self.last_eval, self.best_macro = None, None

    def after_step(self, metrics: dict, format_examples: dict[str, str] | None = None) -> list[str]:
        """The step's alarms; ``format_examples`` holds one format-error completion per domain, to quote."""
        alarms = []
        loss = metrics.get("loss", 0.0)
        if not math.isfinite(loss) or not math.isfinite(metrics.get("grad_norm", 0.0)):
            alarms.append("non-finite loss or gradient: update skipped")
        # an update that trained no row (skip_zero_advantage) measured neither: nothing to bound
        kl, entropy = metrics.get("kl"), metrics.get("entropy")
        if self.cfg.kl_max is not None and kl is not None and kl > self.cfg.kl_max:
            alarms.append(f"KL {kl:.4f} above {self.cfg.kl_max}")
        if self.cfg.entropy_min is not None and entropy is not None and entropy < self.cfg.entropy_min:
            alarms.append(f"entropy {entropy:.4f} below {self.cfg.entropy_min}")
        if self.cfg.entropy_max is not None and entropy is not None and entropy > self.cfg.entropy_max:
            alarms.append(f"entropy {entropy:.4f} above {self.cfg.entropy_max}")
        for domain, count in sorted(domain_values(metrics, "unscored").items()):
            if count and domain not in self.unjudged_domains:
                self.unjudged_domains.add(domain)
                alarms.append(f"the verifier of {domain} could not judge {count} completions of step "
                              f"{metrics.get('step', '?')}; they count as failures (palestra verify says why)")
        drift, bound = metrics.get("async/log_ratio_std"), self.cfg.behaviour_drift_max
        if bound is not None and drift is not None and drift > bound:
            alarms.append(f"behaviour policy drift: std of log(pi_old / pi_behaviour) {drift:.4f} above {bound} "
                          "(the stale sampler is too far from the trained policy: a lower trainer.optim.lr, or "
                          "trainer.system.pipeline=sync)")
        alarms += self._format_alarms(metrics, format_examples or {})
        if math.isfinite(metrics.get("reward/mean", float("nan"))):
            self.rewards.append(metrics["reward/mean"])
        return alarms

    def _format_alarms(self, metrics: dict, examples: dict[str, str]) -> list[str]:
        alarms = []
        for domain, completions in sorted(domain_values(metrics, "completions").items()):
            if not completions:
                continue
            window = self.format_counts.setdefault(domain, deque(maxlen=self.cfg.format_window))
            window.append((int(metrics.get(f"domain/{domain}/format_errors", 0)), int(completions)))
            errors, total = (sum(column) for column in zip(*window))
            bound = self.cfg.format_error_share
            if bound is not None and errors >= bound * total and domain not in self.format_domains:
                self.format_domains.add(domain)
                quote = " ".join(examples.get(domain, "").split())[:120]
                alarms.append(f"{errors} of the {total} completions of {domain} over its last {len(window)} steps were "
                              f"format errors (the verifier found no answer where it reads one), e.g. {quote!r}: "
                              "does the prompt ask for the format its verifier reads?")
        return alarms

    def after_eval(self, heldout_macro: float) -> list[str]:
        """Compare with the previous evaluation (reward up and held-out down suggests hacking) and
        with the best one (a large fall suggests forgetting)."""
        reward = sum(self.rewards) / len(self.rewards) if self.rewards else None
        alarms = []
        if self.last_eval is not None and reward is not None and self.last_eval[1] is not None:
            previous_macro, previous_reward = self.last_eval
            if reward > previous_reward + 0.05 and heldout_macro < previous_macro - 0.05:
                alarms.append(
                    f"training reward rose {previous_reward:.3f} -> {reward:.3f} while held-out success fell "
                    f"{previous_macro:.3f} -> {heldout_macro:.3f} (reward hacking?)"
                )
        drop = self.cfg.heldout_drop_max
        if drop is not None and self.best_macro is not None and heldout_macro < self.best_macro - drop:
            alarms.append(f"held-out success {heldout_macro:.3f} is {self.best_macro - heldout_macro:.3f} below its best "
                          f"({self.best_macro:.3f}): forgetting? (a lower trainer.optim.lr helps)")
        self.best_macro = heldout_macro if self.best_macro is None else max(self.best_macro, heldout_macro)
        self.last_eval = (heldout_macro, reward)
        return alarms
