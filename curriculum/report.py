"""PNG plots and an HTML page for one run or for a whole sweep (matplotlib, no display needed).

Run report: mixture weights over time (heat map, domains × steps), per-domain held-out success
(heat map), difficulty levels over time (heat map), macro and worst-decile held-out curves, and,
for simulated runs, the share of the batch that went to each kind of domain (plain, unlearnable,
noisy, locked) — the quickest way to see a policy chase noise.

Sweep report: macro held-out curves per policy (mean over seeds, min–max band), the paired
differences from the baseline with their 95% intervals for every metric, the batch share per
domain kind for each policy (its first seed), and the comparison table.

Needs matplotlib (``pip install palestra[report]``).
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from curriculum.canary_log import canary_alarm_steps
from curriculum.compare import HEADERS, METRICS, compare_sweep, format_table, load_run, split_labels

MAX_COLUMNS = 400  # time columns kept in heat maps (more than a PNG can show anyway)


def _plt():
    try:
        import matplotlib
    except ImportError as exc:
        raise ValueError("palestra report needs matplotlib: pip install 'palestra[report]'") from exc
    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def _thin(steps: np.ndarray, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most MAX_COLUMNS rows of a [T, D] matrix by averaging consecutive blocks."""
    if len(steps) <= MAX_COLUMNS:
        return steps, matrix
    k = int(np.ceil(len(steps) / MAX_COLUMNS))
    t = len(steps) // k * k
    return steps[:t:k], matrix[:t].reshape(-1, k, matrix.shape[1]).mean(axis=1)


def _heatmap(path: Path, steps: np.ndarray, matrix: np.ndarray, title: str, label: str, **kw) -> str:
    plt = _plt()
    steps, matrix = _thin(np.asarray(steps), np.asarray(matrix, dtype=float))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    extent = (steps[0], steps[-1], matrix.shape[1] - 0.5, -0.5) if len(steps) else None
    im = ax.imshow(matrix.T, aspect="auto", interpolation="nearest", extent=extent, **kw)
    ax.set_xlabel("step")
    ax.set_ylabel("domain")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def _kinds(run: dict, domains: list[str]) -> dict[str, np.ndarray]:
    """Masks over ``domains`` per simulated domain kind (empty for a trainer run)."""
    kinds = ((run.get("config") or {}).get("world") or {}).get("kinds") or {}
    kinds = {k: names for k, names in kinds.items() if names}
    if not kinds:
        return {}
    index = {d: i for i, d in enumerate(domains)}
    masks = {}
    special = np.zeros(len(domains), dtype=bool)
    for kind, names in kinds.items():
        m = np.zeros(len(domains), dtype=bool)
        m[[index[n] for n in names if n in index]] = True
        masks[kind] = m
        special |= m
    return {"plain": ~special, **masks}


def _kind_shares(ax, steps: np.ndarray, weights: np.ndarray, masks: dict[str, np.ndarray], title: str) -> None:
    steps, weights = _thin(steps, weights)
    for kind, m in masks.items():
        share = weights[:, m].sum(axis=1)
        ax.plot(steps, share, label=f"{kind} ({int(m.sum())} domains, uniform share {m.mean():.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("share of the batch")
    ax.set_title(title)
    ax.legend(fontsize=7)


# -- one run ------------------------------------------------------------------------------------------
def report_run(store, run_id: str, out: str | Path) -> str:
    """Write the run's PNGs and ``index.html`` into ``out``; returns the page's path."""
    plt = _plt()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    run = store.run(run_id)
    vectors = store.plan_vectors(run_id)
    if not vectors:
        raise ValueError(f"run {run_id} has no recorded steps")
    domains = list(vectors[0]["domains"])
    steps = np.array([v["step"] for v in vectors], dtype=float)
    weights = np.array([v["weights"] for v in vectors], dtype=float)
    levels = np.array([v["levels"] for v in vectors], dtype=float)
    from matplotlib.colors import LogNorm

    # weight × D: 1 is the uniform share; a log scale shows starved and favoured domains alike
    relative = np.clip(weights * len(domains), 0.05, 20.0)
    images = [_heatmap(out / "weights.png", steps, relative, "mixture weight relative to uniform (w·D)",
                       "w·D (log)", cmap="coolwarm", norm=LogNorm(vmin=0.05, vmax=20.0)),
              _heatmap(out / "levels.png", steps, levels, "difficulty level", "level", cmap="magma")]
    curves = load_run(store, run)
    alarms = canary_alarm_steps(store.metrics(run_id))  # drawn on the held-out timeline, listed below it
    if curves is not None and len(curves.domains):
        images.append(_heatmap(out / "heldout.png", curves.domain_steps, curves.domains,
                               "held-out success per domain", "success", cmap="RdYlGn", vmin=0, vmax=1))
    if curves is not None:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot(curves.steps, curves.macro, label="macro held-out")
        if np.isfinite(curves.worst10).any():
            ax.plot(curves.steps, curves.worst10, label="worst 10% of domains")
        for i, step in enumerate(sorted({step for step, _ in alarms})):
            ax.axvline(step, color="tab:red", ls="--", lw=0.8, label="canary alarm" if i == 0 else None)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out success")
        ax.set_ylim(0, 1)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "macro.png", dpi=90)
        plt.close(fig)
        images.insert(0, "macro.png")
    masks = _kinds(run, domains)
    if masks:
        fig, ax = plt.subplots(figsize=(8, 4))
        _kind_shares(ax, steps, weights, masks, "batch share per kind of domain")
        fig.tight_layout()
        fig.savefig(out / "kinds.png", dpi=90)
        plt.close(fig)
        images.append("kinds.png")
    policy = ((run.get("config") or {}).get("policy") or {}).get("type", "?")
    title = f"run {run_id} ({run['name']}, policy {policy}, seed {run['seed']}, {len(domains)} domains)"
    return _page(out, title, images, extra=_canary_alarms(alarms))


def _canary_alarms(alarms: list[tuple[int, str]]) -> str:
    if not alarms:
        return ""
    items = "".join(f"<li>step {step}: {html.escape(alarm)}</li>" for step, alarm in alarms)
    return f"<h2>Canary alarms</h2><ul class='canary-alarms'>{items}</ul>"


# -- a sweep ------------------------------------------------------------------------------------------
def report_sweep(store, sweep_id: str, out: str | Path, baseline: str = "uniform") -> str:
    plt = _plt()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = compare_sweep(store, sweep_id, baseline=baseline)
    runs = [r for r in store.sweep_runs(sweep_id) if r["status"] == "finished"]
    labels = split_labels(runs)
    curves: dict[str, list] = {}
    first: dict[str, dict] = {}
    for run in runs:
        c = load_run(store, run)
        if c is None:
            continue
        label = labels[run["id"]]
        curves.setdefault(label, []).append(c.cut(result.budget))
        if label not in first or run["seed"] < first[label]["seed"]:
            first[label] = run
    images = [_curves_png(plt, out / "curves.png", curves, result.policies),
              _diffs_png(plt, out / "comparison.png", result)]
    shares = _shares_png(plt, store, out / "kinds.png", first, list(result.policies))
    if shares:
        images.append(shares)
    table = "<pre>" + html.escape(format_table(result)) + "</pre>"
    return _page(out, f"sweep {sweep_id}", images, extra=table)


def _curves_png(plt, path: Path, curves: dict[str, list], order: dict) -> str:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label in order:
        runs = curves.get(label) or []
        if not runs:
            continue
        n = min(len(c.macro) for c in runs)
        stack = np.array([c.macro[:n] for c in runs])
        x = runs[0].rollouts[:n]
        line, = ax.plot(x, stack.mean(axis=0), label=f"{label} ({len(runs)} seeds)")
        ax.fill_between(x, stack.min(axis=0), stack.max(axis=0), color=line.get_color(), alpha=0.15)
    ax.set_xlabel("rollouts (completions generated)")
    ax.set_ylabel("macro held-out success")
    ax.set_title("macro held-out success: mean over seeds, min–max band")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def _diffs_png(plt, path: Path, result) -> str:
    others = [p for p in result.policies if p != result.baseline]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(3.2 * len(METRICS), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], METRICS):
        for i, label in enumerate(others):
            s = result.policies[label][metric]
            if s["diff"] is None:
                continue
            lo = s["lo"] if s["lo"] is not None else s["diff"]
            hi = s["hi"] if s["hi"] is not None else s["diff"]
            excludes = lo > 0 or hi < 0
            ax.errorbar([s["diff"]], [i], xerr=[[s["diff"] - lo], [hi - s["diff"]]], fmt="o",
                        color="tab:red" if excludes else "tab:gray", capsize=3)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(others)))
        ax.set_yticklabels(others if ax is axes[0][0] else [""] * len(others))
        ax.set_title(f"Δ {HEADERS[metric]}", fontsize=9)
    fig.suptitle(f"difference from {result.baseline}, paired-seed 95% CI (red: excludes 0)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def _shares_png(plt, store, path: Path, first: dict[str, dict], order: list[str]) -> str | None:
    panels = []
    for label in order:
        run = first.get(label)
        if run is None:
            continue
        vectors = store.plan_vectors(run["id"])
        masks = _kinds(run, list(vectors[0]["domains"])) if vectors else {}
        if masks:
            panels.append((label, run, vectors, masks))
    if not panels:
        return None
    cols = min(4, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (label, run, vectors, masks) in zip(axes.flat, panels):
        steps = np.array([v["step"] for v in vectors], dtype=float)
        weights = np.array([v["weights"] for v in vectors], dtype=float)
        _kind_shares(ax, steps, weights, masks, f"{label} (seed {run['seed']})")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path.name


def _page(out: Path, title: str, images: list[str], extra: str) -> str:
    body = "\n".join(f'<figure><img src="{html.escape(i)}" alt="{html.escape(i)}"></figure>' for i in images)
    page = (f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:2em} img{max-width:100%} pre{font-size:12px}</style>"
            f"</head><body><h1>{html.escape(title)}</h1>\n{extra}\n{body}\n</body></html>\n")
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return str(path)
