"""Heat maps of one value per (step, domain) whose rows a reader can name.

Each row carries its domain's name; the rows come most-changed first (the domain whose value moved
most over the run on top), ``ROWS_PER_PAGE`` to an image, so a run over hundreds of domains gives a
few readable pages instead of one image of hairlines. Beyond ``MAX_PAGES`` pages the rest — the
domains that changed least — are left to the report's per-domain table. Discrete values (difficulty
levels) get one colour per value and a colour bar that names them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_COLUMNS = 400  # time columns kept (more than a PNG can show anyway)
ROWS_PER_PAGE = 40
MAX_PAGES = 10


@dataclass
class HeatMap:
    """A [T, D] matrix over ``steps`` with one named column per domain, and how to draw it."""

    steps: np.ndarray  # [T]
    matrix: np.ndarray  # [T, D]
    names: list[str]  # [D]
    title: str
    label: str  # the colour bar's
    discrete: bool = False  # one colour per distinct value (levels), taken rather than averaged when thinned
    change: np.ndarray | None = None  # [D] how much each domain moved; default: its range over the run


def thin(steps: np.ndarray, matrix: np.ndarray, take: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """At most MAX_COLUMNS rows of a [T, D] matrix: consecutive blocks averaged (or, ``take``, the
    block's first row: a level averaged over steps is no level)."""
    if len(steps) <= MAX_COLUMNS:
        return steps, matrix
    k = int(np.ceil(len(steps) / MAX_COLUMNS))
    t = len(steps) // k * k
    if take:
        return steps[:t:k], matrix[:t:k]
    return steps[:t:k], matrix[:t].reshape(-1, k, matrix.shape[1]).mean(axis=1)


def most_changed(matrix: np.ndarray, change: np.ndarray | None = None) -> np.ndarray:
    """Column order, the most-changed domain first (ties keep the given order)."""
    if change is None:
        finite = np.where(np.isfinite(matrix), matrix, np.nan)
        with np.errstate(all="ignore"):
            change = np.nan_to_num(np.nanmax(finite, axis=0) - np.nanmin(finite, axis=0), nan=0.0)
    return np.argsort(-np.asarray(change, dtype=float), kind="stable")


def pages(n_domains: int) -> list[slice]:
    """The row slices of the pages drawn (at most MAX_PAGES)."""
    return [slice(i, min(i + ROWS_PER_PAGE, n_domains))
            for i in range(0, min(n_domains, ROWS_PER_PAGE * MAX_PAGES), ROWS_PER_PAGE)]


def draw(plt, heat: HeatMap, **style) -> list:
    """One figure per page of ``heat``, most-changed domains first; ``style`` goes to imshow."""
    steps, matrix = thin(np.asarray(heat.steps, dtype=float), np.asarray(heat.matrix, dtype=float),
                         take=heat.discrete)
    order = most_changed(np.asarray(heat.matrix, dtype=float), heat.change)
    values = None
    if heat.discrete:
        values = np.unique(matrix[np.isfinite(matrix)])
        style = {**_discrete_style(plt, len(values)), **style}
        matrix = np.searchsorted(values, matrix).astype(float)  # colour by rank: gaps between levels need no colour
    figures = []
    chunks = pages(len(order))
    for rows in chunks:
        chosen = order[rows]
        title = heat.title if len(chunks) == 1 else (
            f"{heat.title} — domains {rows.start + 1}–{rows.stop} of {len(order)}, most changed first")
        fig = _page(plt, steps, matrix[:, chosen], [heat.names[i] for i in chosen], title, heat.label, style)
        if values is not None:  # name the colours by the values they stand for
            bar = fig.axes[-1]
            bar.set_yticks(range(len(values)), [f"{v:g}" for v in values])
        figures.append(fig)
    return figures


def _discrete_style(plt, n: int) -> dict:
    """One colour for each of ``n`` ranks 0..n-1."""
    from matplotlib.colors import ListedColormap

    colours = plt.get_cmap("viridis")(np.linspace(0, 1, n) if n > 1 else [0.5])
    return {"cmap": ListedColormap(colours), "vmin": -0.5, "vmax": max(n, 1) - 0.5}


def _page(plt, steps: np.ndarray, matrix: np.ndarray, names: list[str], title: str, label: str, style: dict):
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.2 * len(names)))
    extent = (steps[0], steps[-1], len(names) - 0.5, -0.5) if len(steps) else None
    im = ax.imshow(matrix.T, aspect="auto", interpolation="nearest", extent=extent, **style)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.set_xlabel("step")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    return fig
