"""Side-by-side comparison of the policies of a sweep, with paired-seed confidence intervals.

For every run of a sweep it reads the per-step metrics the simulator (or a trainer that logs the
same keys) wrote, cuts every run at the same budget and computes the metrics below. A simulated
sweep's budget is in rollouts — the smallest final budget of the sweep, counting every completion
generated, discarded or not. A training sweep's is in steps (the smallest last step): it evaluates
held-out success only every few steps, and its runs' rollout counts differ by the few groups that
dynamic sampling redraws, so a cut by rollouts would drop some runs' last evaluation.

- ``auc``: area under the macro held-out curve over rollouts, divided by the budget (a mean
  success over training; higher is better);
- ``final``: macro held-out success at the budget;
- ``worst10``: mean held-out success of the worst decile of domains at the budget;
- ``to_target``: first step at which macro held-out reaches ``target`` (a run that never does
  counts as its last step + 1, so the difference is a bound, flagged in the table);
- ``retention``: over the domains that were ever mastered, mean of held-out at the budget divided
  by their best earlier held-out (1 = nothing forgotten);
- ``zero_var``: share of groups whose rewards all agreed (wasted rollouts);
- ``completions``: completions generated up to the budget, refills included (what a policy spends:
  equal for a simulated sweep's runs, cut at one rollout budget, but not for a training sweep's).

Runs are grouped by policy (its ``type``; a type swept over several settings is split by setting;
a run with another difficulty controller than most of the sweep's is a group of its own) and
paired with the baseline run of the same seed. The interval is the t-based 95% interval of the
mean paired difference, policy − baseline: paired because a seed fixes the world and the
outcome stream for every policy, so world-to-world variation cancels out of the difference.

A t interval is only as good as its estimate of the spread, and with few seeds that estimate is
poor: two seeds that happen to differ by the same amount (−7 and −7 steps) give a spread of 0 and
an interval of width 0 that "excludes" zero. So a difference counts as significant only when it
rests on at least ``MIN_PAIRS`` seeds, its differences are not all alike (a tie gets no interval:
its spread is unknown, not zero) and its interval excludes zero.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from curriculum.config import ColdStartConfig

METRICS = ("auc", "final", "worst10", "to_target", "retention", "zero_var", "completions")
LOWER_IS_BETTER = {"to_target", "zero_var", "completions"}
WHOLE_NUMBERS = {"to_target", "completions"}


@dataclass
class RunCurves:
    """One run's curves, cut at the budget by ``cut``."""

    run_id: str
    label: str
    seed: int
    steps: np.ndarray  # [T]
    rollouts: np.ndarray  # [T] cumulative completions
    macro: np.ndarray  # [T]
    worst10: np.ndarray  # [T]
    zero_var: np.ndarray  # [T]
    domain_steps: np.ndarray  # [K] steps with a per-domain vector
    domains: np.ndarray  # [K, D] per-domain held-out success
    budget_unit: str = "rollouts"  # this run's natural budget: "rollouts" (simulated) or "steps" (trained)
    domain_names: tuple[str, ...] = ()  # the columns of ``domains`` where the run named them (a trainer's)

    def cut(self, budget: float, unit: str) -> "RunCurves":
        """The run up to ``budget`` in ``unit`` ("rollouts" or "steps")."""
        keep = self._axis(unit) <= budget + 1e-9
        dkeep = self.domain_steps <= (self.steps[keep].max() if keep.any() else -1)
        return RunCurves(self.run_id, self.label, self.seed, self.steps[keep], self.rollouts[keep],
                         self.macro[keep], self.worst10[keep], self.zero_var[keep],
                         self.domain_steps[dkeep], self.domains[dkeep], self.budget_unit, self.domain_names)

    def length(self, unit: str) -> float:
        """How far the run went, in ``unit``."""
        return float(self._axis(unit)[-1])

    def _axis(self, unit: str) -> np.ndarray:
        return self.rollouts if unit == "rollouts" else self.steps


@dataclass
class Comparison:
    sweep_id: str
    baseline: str
    budget: float
    target: float
    metric_key: str
    budget_unit: str = "rollouts"
    # label -> metric -> dict(mean, values, seeds, n, diff, lo, hi, pairs, tied, significant, censored)
    policies: dict[str, dict[str, dict]] = field(default_factory=dict)
    # label -> domain -> the same summary of the final held-out success per domain (named domains only)
    domains: dict[str, dict[str, dict]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"sweep": self.sweep_id, "baseline": self.baseline, "budget": self.budget,
                "budget_unit": self.budget_unit, "target": self.target, "metric": self.metric_key,
                "policies": self.policies, "domains": self.domains}


# -- writing (simulator and trainer) -------------------------------------------------------------------
DEFAULT_MASTERY = 0.8  # held-out success that counts as mastered, where a run's config does not say


def heldout_metrics(heldout: np.ndarray, mastery: float, with_domains: bool) -> dict:
    """The ``heldout/*`` metrics a run stores for ``load_run``, from per-domain held-out success."""
    worst = np.sort(heldout)[: max(1, len(heldout) // 10)]
    metrics = {"heldout/macro": float(heldout.mean()), "heldout/worst_decile": float(worst.mean()),
               "heldout/mastered": int((heldout >= mastery).sum())}
    if with_domains:
        metrics["heldout/domains"] = np.rint(heldout * 1000).astype(int).tolist()
    return metrics


# -- loading -------------------------------------------------------------------------------------------
def load_run(store, run: dict, metric_key: str = "heldout/macro") -> RunCurves | None:
    """Curves of one run from its metrics rows; None when the run logged no ``metric_key``."""
    rows = [r for r in store.metrics(run["id"]) if r.get(metric_key) is not None]
    if not rows:
        return None
    steps = np.array([r["step"] for r in rows], dtype=float)
    macro = np.array([r[metric_key] for r in rows], dtype=float)
    # a trainer run's budget and zero-variance share come from its step statistics: read them once
    simulated = all("sim/rollouts" in r and "sim/zero_var_share" in r for r in rows)
    totals = {} if simulated else {t["step"]: t for t in store.step_totals(run["id"])}
    rollouts = _rollouts(rows, totals)
    worst = np.array([r.get("heldout/worst_decile", np.nan) for r in rows], dtype=float)
    zero_var = _zero_var(rows, totals)
    names = _domain_names(rows[-1])
    if names:  # a trainer run names each domain's held-out success
        domain_steps = steps
        domains = np.array([[r.get(f"heldout/{n}", np.nan) for n in names] for r in rows], dtype=float)
    else:  # the simulator stores only the vector, in thousandths
        vectors = [(r["step"], r["heldout/domains"]) for r in rows if r.get("heldout/domains") is not None]
        domain_steps = np.array([s for s, _ in vectors], dtype=float)
        domains = np.array([v for _, v in vectors], dtype=float) / 1000.0 if vectors else np.zeros((0, 0))
        names = _fitted_names(run, domains.shape[1] if domains.ndim == 2 else 0)
    return RunCurves(run["id"], run_label(run), int(run["seed"]), steps, rollouts, macro, worst, zero_var,
                     domain_steps, domains, "rollouts" if simulated else "steps", names)


SUMMARY_KEYS = {"macro", "worst_decile", "mastered", "domains"}  # heldout/* keys that are not domains


def _fitted_names(run: dict, width: int) -> tuple[str, ...]:
    """A simulated run's domain names where its world was fitted to a real run (``sim.fitted``)."""
    fitted = ((run.get("config") or {}).get("sim") or {}).get("fitted") or []
    names = tuple(d["name"] for d in fitted)
    return names if len(names) == width else ()


def _domain_names(row: dict) -> tuple[str, ...]:
    """The domains a row names under ``heldout/<domain>`` (not their levels), sorted."""
    found = (key.split("/", 1)[1] for key in row if key.startswith("heldout/"))
    return tuple(sorted(n for n in found if "/" not in n and n not in SUMMARY_KEYS))


def _rollouts(rows: list[dict], totals: dict[int, dict]) -> np.ndarray:
    if all("sim/rollouts" in r for r in rows):
        return np.array([r["sim/rollouts"] for r in rows], dtype=float)
    # a trainer run: every completion of every step up to the evaluation's (``step_totals`` by step)
    return np.array([_summed(totals, "attempts", 0, r["step"]) for r in rows], dtype=float)


def _zero_var(rows: list[dict], totals: dict[int, dict]) -> np.ndarray:
    if all("sim/zero_var_share" in r for r in rows):
        return np.array([r["sim/zero_var_share"] for r in rows], dtype=float)
    # a trainer run: the share over the steps since the evaluation before
    out, last = [], 0
    for r in rows:
        groups = _summed(totals, "groups", last, r["step"])
        out.append(_summed(totals, "zero_var_groups", last, r["step"]) / groups if groups else np.nan)
        last = r["step"]
    return np.array(out, dtype=float)


def _summed(totals: dict[int, dict], key: str, after: int, until: int) -> int:
    """``key`` summed over the steps in (after, until]."""
    return sum(t[key] for step, t in totals.items() if after < step <= until)


def run_label(run: dict) -> str:
    policy = (run.get("config") or {}).get("policy") or {}
    return str(policy.get("type", run.get("name", "?")))


def split_labels(runs: list[dict]) -> dict[str, str]:
    """run id -> label: the policy type (``headroom progress_z=1.0`` when a type appears with several
    settings), and, for a run whose difficulty controller or model arithmetic is not the one most of
    the sweep's runs use, which one it is (``uniform difficulty=fixed``, ``uniform model.dtype=bfloat16``):
    so one sweep holds a difficulty or precision ablation beside the policies."""
    policies, odd = _variants(runs, "policy"), _unusual(runs)
    return {run["id"]: policies[run["id"]] + odd[run["id"]] + _help_tags(run) for run in runs}


def _unusual(runs: list[dict]) -> dict[str, str]:
    """run id -> `` difficulty=fixed`` / `` model.dtype=bfloat16`` where its controller or dtype is
    not the one most of the sweep's runs use; empty for the usual ones."""
    settings = {"difficulty": _variants(runs, "difficulty"),
                "model.dtype": {run["id"]: _arithmetic(run) for run in runs}}
    usual = {key: Counter(values.values()).most_common(1)[0][0] for key, values in settings.items() if values}
    return {run["id"]: "".join(f" {key}={values[run['id']]}" for key, values in settings.items()
                               if values[run["id"]] != usual[key]) for run in runs}


def _arithmetic(run: dict) -> str:
    """What a training run computed in (``float32``, ``bfloat16``), as stored with it; for a run stored
    before that, its ``model.dtype`` setting (``auto`` then meant fp32 on a CPU, bf16 on CUDA)."""
    config = run.get("config") or {}
    return str(config.get("arithmetic") or (config.get("model") or {}).get("dtype", "auto"))


def _help_tags(run: dict) -> str:
    """`` cold_start=probe_rate=0.05,...`` for a run with cold-start help, `` refill_from=dropped``
    for refills from the groups left out: runs stored before either existed get no tag."""
    config = run.get("config") or {}
    defaults = ColdStartConfig().model_dump()
    cold = {k: v for k, v in (config.get("cold_start") or {}).items() if defaults.get(k) != v}
    refill = ((config.get("trainer") or {}).get("sampling") or {}).get("refill_from") \
        or (config.get("sim") or {}).get("refill_from") or "plan"
    tags = " cold_start=" + ",".join(f"{k}={v}" for k, v in sorted(cold.items())) if cold else ""
    return tags + (f" refill_from={refill}" if refill != "plan" else "")


def _variants(runs: list[dict], group: str) -> dict[str, str]:
    """run id -> the type of its ``group`` setting, followed, when that type appears in the sweep
    with several settings, by the keys in which they differ (``headroom progress_z=1.0``)."""
    def setting(run: dict) -> tuple[str, dict]:
        value = (run.get("config") or {}).get(group) or {}
        return (run_label(run) if group == "policy" else str(value.get("type", "?"))), value

    seen: dict[str, list[dict]] = {}
    for run in runs:
        kind, value = setting(run)
        if value not in seen.setdefault(kind, []):
            seen[kind].append(value)

    def label(kind: str, value: dict) -> str:
        others = seen[kind]
        keys = sorted({k for v in others for k in v if any(o.get(k) != v.get(k) for o in others)})
        # a key a run lacks was added after it was stored: it ran as that key's default did
        shown = [f"{k}={json.dumps(value[k], sort_keys=True)}" if k in value else f"{k}=unset" for k in keys]
        return f"{kind} {','.join(shown)}" if keys else kind

    return {run["id"]: label(*setting(run)) for run in runs}


# -- metrics -----------------------------------------------------------------------------------------
def run_metrics(c: RunCurves, target: float, mastery: float = DEFAULT_MASTERY) -> dict[str, float]:
    """The comparison metrics of one run already cut at the budget."""
    gained = np.diff(np.concatenate([[0.0], c.rollouts]))
    auc = float((c.macro * gained).sum() / max(c.rollouts[-1], 1.0))
    reached = np.nonzero(c.macro >= target)[0]
    to_target = float(c.steps[reached[0]]) if len(reached) else float(c.steps[-1] + 1)
    worst = c.worst10[-1] if np.isfinite(c.worst10[-1]) else _worst_decile(c)
    return {"auc": auc, "final": float(c.macro[-1]), "worst10": float(worst), "to_target": to_target,
            "retention": _retention(c, mastery), "zero_var": float(np.nanmean(c.zero_var)),
            "completions": float(c.rollouts[-1])}


def _worst_decile(c: RunCurves) -> float:
    if not len(c.domains):
        return float("nan")
    last = np.sort(c.domains[-1])
    return float(last[: max(1, len(last) // 10)].mean())


def _retention(c: RunCurves, mastery: float) -> float:
    if len(c.domains) < 2:
        return float("nan")
    peak = c.domains[:-1].max(axis=0)
    mastered = peak >= mastery
    if not mastered.any():
        return float("nan")
    return float(np.minimum(c.domains[-1][mastered] / peak[mastered], 1.0).mean())


MIN_PAIRS = 3  # fewer seeds than this never make a difference significant, however narrow its interval
TIE_TOLERANCE = 1e-9  # paired differences this close together are all alike: no spread to estimate


def paired_ci(diffs: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the mean paired difference; t-based. The bounds are NaN with fewer than
    2 pairs, and when every pair differs alike (``differences_tied``): no interval, not a width of 0."""
    diffs = diffs[np.isfinite(diffs)]
    if len(diffs) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(diffs.mean())
    if len(diffs) < 2 or differences_tied(diffs):
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs))
    return mean, mean - float(half), mean + float(half)


def differences_tied(diffs: np.ndarray) -> bool:
    """Whether two or more finite paired differences are all the same (up to rounding)."""
    diffs = diffs[np.isfinite(diffs)]
    return len(diffs) >= 2 and float(np.ptp(diffs)) <= TIE_TOLERANCE * max(1.0, float(np.abs(diffs).max()))


def is_significant(lo: float | None, hi: float | None, pairs: int) -> bool:
    """The one rule behind every star and red mark: an interval (so some spread) that excludes 0,
    on at least MIN_PAIRS seeds."""
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return False
    return pairs >= MIN_PAIRS and (lo > 0 or hi < 0)


def compare_curves(curves: list[RunCurves], sweep_id: str, baseline: str = "uniform",
                   target: float | None = None, metric_key: str = "heldout/macro",
                   mastery: float = DEFAULT_MASTERY) -> Comparison:
    """Cut every run at the common budget, score it, and pair each policy with ``baseline`` by seed."""
    if not curves:
        raise ValueError(f"sweep {sweep_id!r} has no runs with metric {metric_key!r}")
    unit = "rollouts" if all(c.budget_unit == "rollouts" for c in curves) else "steps"
    budget = min(c.length(unit) for c in curves)
    cut = [c.cut(budget, unit) for c in curves]
    if target is None:  # default: 90% of the baseline's final macro, a level the baseline reaches
        base_final = [c.macro[-1] for c in cut if c.label == baseline] or [c.macro[-1] for c in cut]
        target = round(0.9 * float(np.mean(base_final)), 3)
    scored: dict[str, dict[int, dict]] = {}
    for c in cut:
        if c.seed in scored.get(c.label, {}):  # pairs by seed would silently drop or mix runs
            raise ValueError(f"sweep {sweep_id!r} has two {c.label!r} runs with seed {c.seed}: runs are told apart "
                             "by policy, difficulty controller and seed only, so sweep no other setting")
        scored.setdefault(c.label, {})[c.seed] = run_metrics(c, target, mastery)
    if baseline not in scored:
        raise ValueError(f"sweep {sweep_id!r} has no {baseline!r} runs to compare with "
                         f"(policies: {', '.join(sorted(scored))})")
    last_step = {c.label: c.steps[-1] + 1 for c in cut}
    result = Comparison(sweep_id, baseline, budget, float(target), metric_key, unit)
    for label in _ordered(scored, baseline):
        result.policies[label] = {m: _summary(scored[label], scored[baseline], m, last_step[label])
                                  for m in METRICS}
    result.domains = _domain_effects(cut, baseline)
    return result


def _domain_effects(cut: list[RunCurves], baseline: str) -> dict[str, dict[str, dict]]:
    """label -> domain -> each named domain's final held-out success, paired with the baseline's."""
    finals: dict[str, dict[str, dict[int, dict]]] = {}  # domain -> label -> seed -> {"final": value}
    for c in cut:
        if c.domain_names and len(c.domains):
            for name, value in zip(c.domain_names, c.domains[-1]):
                finals.setdefault(name, {}).setdefault(c.label, {})[c.seed] = {"final": float(value)}
    effects: dict[str, dict[str, dict]] = {}
    for name, by_label in sorted(finals.items()):
        if baseline not in by_label:
            continue
        for label in _ordered(by_label, baseline):
            effects.setdefault(label, {})[name] = _summary(by_label[label], by_label[baseline], "final", 0)
    return effects


def _summary(runs: dict[int, dict], base: dict[int, dict], metric: str, never: float) -> dict:
    values = np.array([runs[s][metric] for s in sorted(runs)], dtype=float)  # in seed order
    seeds = sorted(set(runs) & set(base))
    diffs = np.array([runs[s][metric] - base[s][metric] for s in seeds], dtype=float)
    mean_diff, lo, hi = paired_ci(diffs)
    pairs = int(np.isfinite(diffs).sum())  # the seeds this cell rests on (a NaN metric drops its seed)
    out = {"mean": _num(np.nanmean(values)) if np.isfinite(values).any() else None,
           "n": len(values), "pairs": pairs, "diff": _num(mean_diff), "lo": _num(lo), "hi": _num(hi),
           "tied": differences_tied(diffs), "significant": is_significant(lo, hi, pairs),
           "seeds": sorted(runs), "values": [_num(v) for v in values]}
    if metric == "to_target":
        out["censored"] = int((values >= never).sum())
    return out


def _num(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 5)


def _ordered(scored: dict, baseline: str) -> list[str]:
    return [baseline] + sorted(k for k in scored if k != baseline)


def compare_sweep(store, sweep_id: str, baseline: str = "uniform", target: float | None = None,
                  metric_key: str = "heldout/macro") -> Comparison:
    runs = [r for r in store.sweep_runs(sweep_id) if r["status"] == "finished"]
    if not runs:
        raise ValueError(f"no finished runs with sweep id {sweep_id!r} in {store.url!r}")
    labels = split_labels(runs)
    curves = []
    for run in runs:
        c = load_run(store, run, metric_key)
        if c is not None:
            c.label = labels[run["id"]]
            curves.append(c)
    mastery = float(((runs[0].get("config") or {}).get("sim") or {}).get("mastery", DEFAULT_MASTERY))
    return compare_curves(curves, sweep_id, baseline, target, metric_key, mastery)


# -- printing ----------------------------------------------------------------------------------------
HEADERS = {"auc": "AUC", "final": "final", "worst10": "worst 10%", "to_target": "steps to target",
           "retention": "retention", "zero_var": "zero-var share", "completions": "completions"}


def format_table(cmp: Comparison) -> str:
    """A plain-text table: per policy, each metric's mean and its paired difference from baseline.

    ``seeds`` is the number of seeds paired with the baseline; a cell that rests on fewer (a metric
    undefined on some seeds) says ``n=``. A ``*`` marks a significant difference (``is_significant``);
    ``>`` marks steps-to-target bounds where some run never reached the target; ``tied`` a
    difference alike on every seed, which gets no interval.
    """
    lines = [f"sweep {cmp.sweep_id}: budget {int(cmp.budget)} {cmp.budget_unit} per run, target macro {cmp.target:.3f}, "
             f"differences vs {cmp.baseline} with paired-seed t-based 95% CIs (* excludes 0, "
             f"on at least {MIN_PAIRS} seeds that do not all differ alike)"]
    head = ["policy", "seeds"] + [HEADERS[m] for m in METRICS]
    rows = [head]
    for label, metrics in cmp.policies.items():
        is_base = label == cmp.baseline
        seeds = metrics["auc"]["n"] if is_base else max(metrics[m]["pairs"] for m in METRICS)
        rows.append([label, str(seeds)] + [_cell(metrics[m], m, is_base, seeds) for m in METRICS])
    return "\n".join(lines + [_aligned(rows)])


def format_domain_table(cmp: Comparison) -> str:
    """Each named domain's final held-out success per policy, and its paired difference from baseline."""
    if not cmp.domains:
        return "no per-domain held-out success in this sweep (a simulated world names its domains only when fitted)"
    labels = list(cmp.domains)
    names = sorted({name for effects in cmp.domains.values() for name in effects})
    rows = [["domain (final held-out)"] + labels]
    for name in names:
        rows.append([name] + [_cell(cmp.domains[label][name], "final", label == cmp.baseline,
                                    cmp.domains[label][name]["n"]) if name in cmp.domains[label] else "-"
                              for label in labels])
    return _aligned(rows)


def _aligned(rows: list[list[str]]) -> str:
    """Rows of cells as text columns, each as wide as its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows)


def _cell(s: dict, metric: str, is_base: bool, seeds: int) -> str:
    fmt = (lambda v: f"{v:.0f}") if metric in WHOLE_NUMBERS else (lambda v: f"{v:.3f}")
    if s["mean"] is None:
        return "-"
    mark = ">" if s.get("censored") else ""
    text = f"{mark}{fmt(s['mean'])}"
    if is_base or s["diff"] is None:
        return text
    sign = (lambda v: f"{v:+.0f}") if metric in WHOLE_NUMBERS else (lambda v: f"{v:+.3f}")
    notes = [f"n={s['pairs']}"] if s["pairs"] < seeds else []
    if s.get("tied"):
        notes.append("tied")
    if s["lo"] is not None:
        notes.insert(0, f"[{sign(s['lo'])},{sign(s['hi'])}]{'*' if s.get('significant') else ''}")
    return f"{text} ({' '.join([sign(s['diff'])] + notes)})"
