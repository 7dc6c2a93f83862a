"""PromptSelector: which of a domain's candidate prompts go into the batch (docs/configuration.md: `selection`).

For dataset-backed domains, where the same prompts come back epoch after epoch, the trainer draws
``candidates(n)`` prompts for a (domain, level) slot and keeps the ``n`` that ``choose`` returns.
``record`` learns from the step's outcomes (every rolled-out group, discarded refills included:
they cost rollouts and say as much about the prompt). Three rules, combinable through
``SelectionConfig.mode``; a prompt never seen before is never filtered:

``streak`` — GRESO, "Act Only When It Pays" (Zheng et al., arXiv 2506.02177): prompts whose
    groups were zero-variance for the last z rollouts tend to stay so, so skip them before
    rollout with probability 1 − p_e^z. Here, with s = ``skip_prob`` and k = ``streak_threshold``,
    a prompt whose last z ≥ k groups were all-correct (or all-wrong) is skipped with probability
        (1 − (1 − s)^(z − k + 1)) · skip_decay^(steps since its last attempt − 1).
    Departures: nothing is skipped below k (GRESO starts at z = 1); GRESO tunes p_e online to
    hold a target share of zero-variance groups, we keep s fixed; and the skip chance fades with
    the time since the prompt was last tried, because a skipped prompt never gets a new rollout
    to break its streak, while the policy keeps moving (forgetting, or a hard prompt that has
    become solvable).

``beta`` — MoPPS, "Can Prompt Difficulty be Online Predicted…" (Qu et al., arXiv 2507.04632):
    a Beta(1 + s, 1 + f) posterior on each prompt's success rate, one Thompson draw per candidate,
    and the candidates whose draws are nearest ``target`` (0.5, where a group's mean |advantage|
    2·sqrt(p(1−p)) peaks) are taken; no extra rollouts. MoPPS forgets old evidence with a
    discount λ (α ← λα + (1−λ)·1 + s); ``discount`` does the same per observed step and defaults
    to 1 (no forgetting), which is the plain Beta(1 + s, 1 + f). Successes count ``correct``.

``retire`` — ScaleRL, "The Art of Scaling RL Compute" (arXiv 2510.13913), "no positive
    resampling": prompts with pass rate ≥ 0.9 leave the training set. Here a prompt retires once
    its success rate over ≥ ``retire_min_attempts`` attempts reaches ``retire_threshold``, and a
    ``replay_share`` of each pick is kept for retired prompts (ScaleRL has no replay; the issue
    asks for one, and it catches forgetting). Retirement is therefore not permanent: a replayed
    prompt that fails drops below the threshold and returns.

Picking: filtered-out prompts only fill the slots nothing eligible can (so ``choose`` always
returns ``n`` tasks when given at least ``n``); without ``beta`` the eligible candidates are taken
in the order given (the trainer's draw is already random). Every random number comes from a
generator seeded by (seed, step, domain, level, candidate ids), so ``choose`` is a pure function
of the recorded history and its inputs, like ``Scheduler.plan``.

Statistics live in memory and in the store (``StatsStore.write_prompt_step``: tables
``prompt_steps`` and ``prompt_stats``); ``rebuild_from_store`` replays the stored steps exactly.
"""
from __future__ import annotations

import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from curriculum.config import SelectionConfig
from curriculum.store import StatsStore, fold_prompt_delta
from curriculum.types import Outcome

if TYPE_CHECKING:
    from domains.api import Task

STATE_VERSION = 1
_COUNT_FIELDS = ("attempts", "successes", "groups", "all_correct_streak", "all_wrong_streak", "last_step")


@dataclass
class PromptStats:
    """What the selector knows of one prompt (the ``prompt_stats`` row plus the Beta posterior)."""

    domain: str
    attempts: int = 0
    successes: int = 0
    groups: int = 0
    all_correct_streak: int = 0
    all_wrong_streak: int = 0
    last_step: int = -1
    alpha: float = 1.0  # Beta posterior: 1 + successes (discounted when discount < 1)
    beta: float = 1.0  # 1 + failures

    @property
    def streak(self) -> int:
        return max(self.all_correct_streak, self.all_wrong_streak)  # at most one is non-zero


def step_deltas(outcomes: Iterable[Outcome], domains: Sequence[str] | None = None) -> list[dict]:
    """Per prompt summary of one step: attempts, successes, groups and the trailing all-correct /
    all-wrong run of its groups (in group order), for ``StatsStore.write_prompt_step``.

    A group (outcomes sharing ``group``) is all-correct when every reward is 1 and all-wrong when
    every reward is 0; a group of equal partial rewards is neither and breaks both streaks.
    """
    keep = None if domains is None else set(domains)
    groups: dict[int, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        if keep is None or o.domain in keep:
            groups[int(o.group)].append(o)
    per_task: dict[str, dict] = {}
    for index in sorted(groups):
        members = groups[index]
        first = members[0]
        d = per_task.setdefault(first.task_id, dict(domain=first.domain, task_id=first.task_id, attempts=0,
                                                    successes=0, groups=0, tail_correct=0, tail_wrong=0))
        d["attempts"] += len(members)
        d["successes"] += sum(bool(m.correct) for m in members)
        d["groups"] += 1
        rewards = [float(m.reward) for m in members]
        d["tail_correct"] = d["tail_correct"] + 1 if min(rewards) >= 1.0 else 0
        d["tail_wrong"] = d["tail_wrong"] + 1 if max(rewards) <= 0.0 else 0
    return list(per_task.values())


class PromptSelector:
    """Per-prompt statistics and the ``choose`` rule of ``SelectionConfig`` (see the module doc).

    ``store`` and ``run_id`` are optional: with them, ``record`` also writes each step's
    per-prompt statistics to the store (one transaction).
    """

    def __init__(self, cfg: SelectionConfig, seed: int = 0, store: StatsStore | None = None,
                 run_id: str | None = None) -> None:
        if store is not None and run_id is None:
            raise ValueError("a PromptSelector with a store needs the run id to write under")
        self.cfg, self.seed = cfg, int(seed)
        self.store, self.run_id = store, run_id
        self._reset()

    def _reset(self) -> None:
        self.prompts: dict[str, PromptStats] = {}
        self.last_step: int | None = None
        # what choose() did since the last metrics() call, by the step drawn for: the trainer's async
        # pipeline draws step t+1 before it records step t, whose counts must not take t+1's
        self._counts: dict[int, Counter] = {}

    # -- what the trainer asks ------------------------------------------------------------------
    def tracks(self, domain: str) -> bool:
        """Whether ``domain``'s prompts are selected (and recorded) at all."""
        return self.cfg.active and (self.cfg.domains is None or domain in self.cfg.domains)

    def candidates(self, domain: str, n: int) -> int:
        """How many candidates to draw for ``n`` prompts of ``domain`` (``n`` when not selecting)."""
        return n * self.cfg.candidates_factor if self.tracks(domain) else n

    def stats(self, task_id: str) -> PromptStats | None:
        return self.prompts.get(task_id)

    def choose(self, domain: str, level: int, candidates: "list[Task]", n: int, step: int) -> "list[Task]":
        """``n`` of ``candidates`` (fewer only if fewer were given), in the order given."""
        if n <= 0:
            return []
        if not self.tracks(domain) or len(candidates) <= n:
            return list(candidates[:n])
        pool = _unique(candidates)
        rng = self._rng(domain, level, step, pool)
        stats = [self.prompts.get(t.id) for t in pool]
        modes = self.cfg.mode
        retired = self._retired(stats) if "retire" in modes else np.zeros(len(pool), bool)
        skipped = self._skipped(stats, step, rng) if "streak" in modes else np.zeros(len(pool), bool)
        score = self._beta_score(stats, rng) if "beta" in modes else np.arange(len(pool), dtype=float)
        picks, replayed = self._pick(n, retired, skipped, score, rng)
        chosen = [pool[i] for i in sorted(picks)]
        self._count(self._counts.setdefault(int(step), Counter()), domain, stats, retired, skipped, picks, replayed)
        return chosen + _pad(candidates, chosen, n)

    def record(self, step: int, outcomes: list[Outcome]) -> None:
        """Learn from one step's outcomes (every domain's; untracked ones are ignored): store
        first (one transaction), then memory. A no-op when no rule is active."""
        if not self.cfg.active:
            return
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} is not after the last recorded step {self.last_step}; "
                             "to redo steps, rebuild_from_store() or load_state_dict() first")
        deltas = step_deltas(outcomes, self.cfg.domains)
        if self.store is not None:
            self.store.write_prompt_step(self.run_id, step, deltas)
        self._apply(step, deltas)

    def metrics(self, step: int | None = None) -> dict[str, int]:
        """Counts since the last call, per domain: considered, unseen, skipped, retired, replayed; of
        the draws for ``step`` and the steps before it (all of them without a step)."""
        total: Counter = Counter()
        for s in sorted(s for s in self._counts if step is None or s <= step):
            total.update(self._counts.pop(s))  # update, not +: a count of 0 stays a stored 0
        return {f"selection/{domain}/{key}": int(v) for (domain, key), v in sorted(total.items())}

    # -- the rules ------------------------------------------------------------------------------
    def _rng(self, domain: str, level: int, step: int, pool: "list[Task]") -> np.random.Generator:
        ids = zlib.crc32("\n".join(t.id for t in pool).encode())
        return np.random.default_rng([self.seed, int(step), zlib.crc32(domain.encode()), int(level) % 2**32, ids])

    def _retired(self, stats: list[PromptStats | None]) -> np.ndarray:
        c = self.cfg
        return np.array([s is not None and s.attempts >= c.retire_min_attempts
                         and s.successes >= c.retire_threshold * s.attempts for s in stats], dtype=bool)

    def skip_probability(self, s: PromptStats | None, step: int) -> float:
        """The streak rule (module doc): 0 for unseen prompts and streaks under the threshold."""
        c = self.cfg
        if s is None or s.streak < c.streak_threshold:
            return 0.0
        grown = 1.0 - (1.0 - c.skip_prob) ** (s.streak - c.streak_threshold + 1)
        idle = max(0, int(step) - s.last_step - 1)  # steps it could have been tried and was not
        return grown * c.skip_decay ** idle

    def _skipped(self, stats: list[PromptStats | None], step: int, rng: np.random.Generator) -> np.ndarray:
        p = np.array([self.skip_probability(s, step) for s in stats])
        return rng.random(len(stats)) < p

    def _beta_score(self, stats: list[PromptStats | None], rng: np.random.Generator) -> np.ndarray:
        """|Thompson draw − target|: lower is better; unseen prompts draw from Beta(1, 1)."""
        a = np.array([s.alpha if s else 1.0 for s in stats])
        b = np.array([s.beta if s else 1.0 for s in stats])
        return np.abs(rng.beta(a, b) - self.cfg.target)

    def _pick(self, n: int, retired: np.ndarray, skipped: np.ndarray, score: np.ndarray,
              rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """Replay slots from the retired, the rest from the eligible, shortfalls from the others."""
        by_score = lambda mask: [int(i) for i in np.nonzero(mask)[0][np.argsort(score[mask], kind="stable")]]  # noqa: E731
        replay_pool = by_score(retired)
        n_replay = 0
        if "retire" in self.cfg.mode:  # a share worth 0.3 prompt replays one prompt 30% of the time
            n_replay = min(int(np.floor(self.cfg.replay_share * n + rng.random())), len(replay_pool))
        replayed = replay_pool[:n_replay]
        picks = replayed + by_score(~retired & ~skipped)[:n - n_replay]
        if len(picks) < n:  # too few eligible: the skipped first, then the retired, best score first
            taken = set(picks)
            rest = sorted((i for i in range(len(score)) if i not in taken), key=lambda i: (retired[i], score[i]))
            picks += rest[:n - len(picks)]
        return picks, replayed

    @staticmethod
    def _count(c: Counter, domain, stats, retired, skipped, picks, replayed) -> None:
        c[(domain, "considered")] += len(stats)
        c[(domain, "unseen")] += sum(s is None for s in stats)
        c[(domain, "skipped")] += int(np.sum(skipped & ~retired))
        c[(domain, "retired")] += int(np.sum(retired))
        c[(domain, "replayed")] += len(replayed)

    # -- learning -------------------------------------------------------------------------------
    def _apply(self, step: int, deltas: list[dict]) -> None:
        lam = self.cfg.discount
        for d in deltas:
            s = self.prompts.get(d["task_id"]) or PromptStats(domain=d["domain"])
            total = fold_prompt_delta({k: getattr(s, k) for k in _COUNT_FIELDS}, d, step)
            for key in _COUNT_FIELDS:
                setattr(s, key, total[key])
            # MoPPS's streaming update; with lam = 1 it is alpha = 1 + successes, beta = 1 + failures
            s.alpha = lam * s.alpha + (1 - lam) + d["successes"]
            s.beta = lam * s.beta + (1 - lam) + d["attempts"] - d["successes"]
            self.prompts[d["task_id"]] = s
        self.last_step = int(step)

    # -- persistence ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain lists (JSON-safe): under ``prompts``, one list per field over the known prompts."""
        ids = list(self.prompts)
        rows = [self.prompts[i] for i in ids]
        columns = {key: [getattr(s, key) for s in rows] for key in (*_COUNT_FIELDS, "alpha", "beta")}
        return {"version": STATE_VERSION, "seed": self.seed, "last_step": self.last_step,
                "prompts": {"ids": ids, "domains": [s.domain for s in rows], **columns}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"prompt selector state version {state.get('version')} is not {STATE_VERSION}")
        self._reset()
        self.last_step = state["last_step"]
        columns = state["prompts"]
        keys = (*_COUNT_FIELDS, "alpha", "beta")
        for k, task_id in enumerate(columns["ids"]):
            values = {key: columns[key][k] for key in keys}
            self.prompts[task_id] = PromptStats(domain=columns["domains"][k], **values)

    def rebuild_from_store(self, store: StatsStore, run_id: str, until_step: int | None = None) -> None:
        """Reset, then replay the run's stored per-prompt steps (up to ``until_step``) in order.

        Reads only; pass the checkpoint's step as ``until_step`` on resume, so the tail a crashed
        run left after its checkpoint is ignored (the next ``record`` deletes it from the store).
        """
        self._reset()
        by_step: dict[int, list[dict]] = defaultdict(list)
        for row in store.prompt_steps(run_id, until_step):
            by_step[row["step"]].append(row)
        for step in sorted(by_step):
            self._apply(step, by_step[step])


def _unique(tasks: "Sequence[Task]") -> "list[Task]":
    seen: set[str] = set()
    out = []
    for t in tasks:
        if t.id not in seen:
            seen.add(t.id)
            out.append(t)
    return out


def _pad(candidates: "Sequence[Task]", chosen: "list[Task]", n: int) -> "list[Task]":
    """Repeats (in the order given) when fewer than ``n`` distinct prompts were offered."""
    if len(chosen) >= n:
        return []
    seen: set[str] = set()
    repeats = []
    for t in candidates:
        if t.id in seen:
            repeats.append(t)
        seen.add(t.id)
    return repeats[:n - len(chosen)]


__all__ = ["PromptSelector", "PromptStats", "step_deltas"]
