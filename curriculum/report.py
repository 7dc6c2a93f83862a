"""PNG plots and a one-file HTML page for one run or for a whole sweep (matplotlib, no display needed).

Run report: macro and worst-decile held-out curves; heat maps (``curriculum.heatmaps``) of the
mixture weight, the difficulty level and the held-out success per domain, rows named and
most-changed first; for simulated runs, the share of the batch that went to each kind of domain
(plain, unlearnable, noisy, locked) — the quickest way to see a policy chase noise; then a
per-domain table (``curriculum.run_summary``), the run's health alarms and its config.

Sweep report: the runs by policy and seed, macro held-out curves per policy (mean over seeds,
min–max band), the paired differences from the baseline with their 95% intervals for every metric,
the batch share per domain kind for each policy (its first seed), and the comparison table.

Every image is written as a PNG next to ``index.html`` and inlined in it. Needs matplotlib
(``pip install palestra[report]``).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from curriculum import report_page as page
from curriculum.canary_log import canary_alarm_steps
from curriculum.compare import HEADERS, METRICS, compare_sweep, format_table, load_run, split_labels
from curriculum.heatmaps import MAX_PAGES, ROWS_PER_PAGE, HeatMap, draw, thin
from curriculum.run_summary import VERDICT_COLUMNS, domain_table, heldout_series, run_alarms
from curriculum.tables import cell_text


def _plt():
    try:
        import matplotlib
    except ImportError as exc:
        raise ValueError("palestra report needs matplotlib: pip install 'palestra[report]'") from exc
    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


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
    steps, weights = thin(steps, weights)
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
    metrics = store.metrics(run_id)
    domains = list(vectors[0]["domains"])
    steps = np.array([v["step"] for v in vectors], dtype=float)
    weights = np.array([v["weights"] for v in vectors], dtype=float)
    curves = load_run(store, run)
    canary_steps = sorted({step for step, _ in canary_alarm_steps(metrics)})  # marked on the held-out timeline
    figures = ([page.save_figure(plt, _macro_figure(plt, curves, canary_steps), out, "macro.png")]
               if curves is not None else [])
    masks = _kinds(run, domains)
    if masks:
        fig, ax = plt.subplots(figsize=(8, 4))
        _kind_shares(ax, steps, weights, masks, "batch share per kind of domain")
        fig.tight_layout()
        figures.append(page.save_figure(plt, fig, out, "kinds.png"))
    policy = ((run.get("config") or {}).get("policy") or {}).get("type", "?")
    title = f"run {run_id} ({run['name']}, policy {policy}, seed {run['seed']}, {len(domains)} domains)"
    parts = [page.section("Held-out success and batch shares", page.images(figures))]
    for stem, heat, style in _run_heatmaps(vectors, metrics, domains):
        imgs = _paged(plt, out, stem, heat, style)
        more = f"{len(imgs) - 1} more pages: the domains that changed less"
        left = len(heat.names) - ROWS_PER_PAGE * MAX_PAGES
        if left > 0:
            more += f" (the {left} that changed least are in the per-domain table only)"
        parts.append(page.section(heat.title, page.images(imgs, fold_after=1, more=more)))
    parts += [page.section("Per domain", _domain_table(store, run_id, vectors, metrics, masks, domains)),
              page.section("Health alarms", _alarms(metrics)),
              page.section("Config", page.config_block(run.get("config")))]
    return page.write_page(out, title, parts)


def _macro_figure(plt, curves, canary_steps: list[int]):
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(curves.steps, curves.macro, label="macro held-out")
    if np.isfinite(curves.worst10).any():
        ax.plot(curves.steps, curves.worst10, label="worst 10% of domains")
    for i, step in enumerate(canary_steps):
        ax.axvline(step, color="tab:red", ls="--", lw=0.8, label="canary alarm" if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    return fig


def _run_heatmaps(vectors: list[dict], metrics: list[dict], domains: list[str]) -> list[tuple[str, HeatMap, dict]]:
    """(file stem, heat map, imshow style) of the weights, the levels and (if evaluated) held-out success."""
    from matplotlib.colors import LogNorm

    steps = np.array([v["step"] for v in vectors], dtype=float)
    # weight × D: 1 is the uniform share; a log scale shows starved and favoured domains alike
    relative = np.clip(np.array([v["weights"] for v in vectors], dtype=float) * len(domains), 0.05, 20.0)
    log = np.log(relative)
    maps = [("weights", HeatMap(steps, relative, domains, "mixture weight relative to uniform (w·D)", "w·D (log)",
                                change=log.max(axis=0) - log.min(axis=0)),
             {"cmap": "coolwarm", "norm": LogNorm(vmin=0.05, vmax=20.0)}),
            ("levels", HeatMap(steps, np.array([v["levels"] for v in vectors], dtype=float), domains,
                               "difficulty level", "level", discrete=True), {})]
    series = heldout_series(metrics, domains)
    if series:
        names = [d for d in domains if d in series[-1][1]]
        matrix = np.array([[found.get(d, np.nan) for d in names] for _, found in series], dtype=float)
        maps.append(("heldout", HeatMap(np.array([s for s, _ in series], dtype=float), matrix, names,
                                        "held-out success per domain", "success"),
                     {"cmap": "RdYlGn", "vmin": 0, "vmax": 1}))
    return maps


def _paged(plt, out: Path, stem: str, heat: HeatMap, style: dict) -> list:
    """The heat map's pages as ``stem.png``, ``stem-2.png``, ..."""
    return [page.save_figure(plt, fig, out, f"{stem}.png" if n == 1 else f"{stem}-{n}.png")
            for n, fig in enumerate(draw(plt, heat, **style), 1)]


TABLE_COLUMNS = {"domain": "domain", "kind": "kind", "share": "share of rollouts",
                 "planned_share": "planned share", "trained_share": "trained share",
                 "varied_share": "share of varied groups", "attempts": "rollouts",
                 "level": "level (last)", "highest_level": "level (highest)",
                 "train_first": "training success (first 10%)", "train_last": "training success (last 10%)",
                 "heldout_first": "held-out (first)", "heldout_last": "held-out (last)"}


def _domain_table(store, run_id: str, vectors: list[dict], metrics: list[dict], masks: dict, domains: list[str]) -> str:
    rows = domain_table(store, run_id, vectors, metrics)
    columns = dict(TABLE_COLUMNS)
    if masks:
        kind = {d: k for k, m in masks.items() for d, inside in zip(domains, m) if inside}
        for row in rows:
            row["kind"] = kind.get(row["domain"], "")
    else:
        del columns["kind"]
    # verdicts only where the run stored them (the simulator keeps no per-completion rows by default)
    if any(r[c] for r in rows for c in [*VERDICT_COLUMNS, "unscored"]):
        columns.update({c: c.replace("_", " ") for c in [*VERDICT_COLUMNS, "unscored"]})
        note = ""
    else:
        note = "<p>Verdicts by status are counted from the stored per-completion rows; this run stored none.</p>"
    if rows and all(r["trained_share"] is None for r in rows):
        note += "<p>This run stored no per-domain counts of the groups trained on (it predates them).</p>"
    shares = ("share", "planned_share", "trained_share", "varied_share")
    return note + page.table(rows, columns, {key: _percent for key in shares})


def _percent(value: float | None) -> str:
    return cell_text(value) if value is None else f"{value:.2%}"


def _alarms(metrics: list[dict]) -> str:
    alarms = run_alarms(metrics)
    if not alarms:
        return "<p>No health alarm was stored for this run.</p>"
    return "<ul>" + "".join(f"<li>step {step}: {html.escape(text)}</li>" for step, text in alarms) + "</ul>"


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
        curves.setdefault(label, []).append(c.cut(result.budget, result.budget_unit))
        if label not in first or run["seed"] < first[label]["seed"]:
            first[label] = run
    images = [_curves_png(plt, out / "curves.png", curves, result.policies),
              _diffs_png(plt, out / "comparison.png", result)]
    shares = _shares_png(plt, store, out / "kinds.png", first, list(result.policies))
    if shares:
        images.append(shares)
    parts = [page.section("Runs", page.table(_runs_by_policy(runs, labels), RUN_COLUMNS)),
             page.section("Comparison", page.preformatted(format_table(result))),
             page.section("Curves and differences", page.images(images))]
    return page.write_page(out, f"sweep {sweep_id}", parts)


RUN_COLUMNS = {"policy": "policy", "seeds": "seeds", "runs": "runs", "setting": "policy setting"}


def _runs_by_policy(runs: list[dict], labels: dict[str, str]) -> list[dict]:
    """One row per policy (label): its seeds, run ids and settings, so every curve can be traced."""
    rows: dict[str, dict] = {}
    for run in sorted(runs, key=lambda r: (labels[r["id"]], r["seed"])):
        row = rows.setdefault(labels[run["id"]], {"policy": labels[run["id"]], "seeds": [], "runs": [],
                                                 "setting": json.dumps((run.get("config") or {}).get("policy"),
                                                                       sort_keys=True)})
        row["seeds"].append(run["seed"])
        row["runs"].append(str(run["id"])[:8])
    return [{**r, "seeds": ", ".join(map(str, r["seeds"])), "runs": " ".join(r["runs"])} for r in rows.values()]


def _curves_png(plt, path: Path, curves: dict[str, list], order: dict) -> page.Image:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label in order:
        runs = curves.get(label) or []
        if not runs:
            continue
        n = min(len(c.macro) for c in runs)
        stack = np.array([c.macro[:n] for c in runs])
        x = runs[0].rollouts[:n]
        seeds = ", ".join(str(c.seed) for c in sorted(runs, key=lambda c: c.seed))
        line, = ax.plot(x, stack.mean(axis=0), label=f"{label} (seeds {seeds})")
        ax.fill_between(x, stack.min(axis=0), stack.max(axis=0), color=line.get_color(), alpha=0.15)
    ax.set_xlabel("rollouts (completions generated)")
    ax.set_ylabel("macro held-out success")
    ax.set_title("macro held-out success: mean over seeds, min–max band")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return page.save_figure(plt, fig, path.parent, path.name, dpi=90)


def _diffs_png(plt, path: Path, result) -> page.Image:
    others = [p for p in result.policies if p != result.baseline]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(3.2 * len(METRICS), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], METRICS):
        for i, label in enumerate(others):
            s = result.policies[label][metric]
            if s["diff"] is None:
                continue
            lo = s["lo"] if s["lo"] is not None else s["diff"]
            hi = s["hi"] if s["hi"] is not None else s["diff"]
            ax.errorbar([s["diff"]], [i], xerr=[[s["diff"] - lo], [hi - s["diff"]]], fmt="o",
                        color="tab:red" if s["significant"] else "tab:gray", capsize=3)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(others)))
        ax.set_yticklabels(others if ax is axes[0][0] else [""] * len(others))
        ax.set_title(f"Δ {HEADERS[metric]}", fontsize=9)
    fig.suptitle(f"difference from {result.baseline}, paired-seed 95% CI (red: significant, as * in the table)",
                 fontsize=10)
    fig.tight_layout()
    return page.save_figure(plt, fig, path.parent, path.name, dpi=90)


def _shares_png(plt, store, path: Path, first: dict[str, dict], order: list[str]) -> page.Image | None:
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
    return page.save_figure(plt, fig, path.parent, path.name, dpi=80)
