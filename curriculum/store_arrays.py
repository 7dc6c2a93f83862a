"""A step's plan and per-(domain, level) statistics as compressed binary arrays (schema version 2).

Version 1 stored them as rows — a ``plans`` row per domain that got prompts, a ``step_stats`` row
per (domain, level) with attempts, and the full weight and level vectors as JSON lists that
repeated every domain name every step. At hundreds of domains that was most of a sweep's
database. Version 2 keeps the domain names once per run (``run_domains``) and each step as one
``step_arrays`` row of zlib-compressed little-endian arrays, indexed by position in that list:

- ``weights`` float64 [D] (exact: ``rebuild_from_store`` replays them), ``levels`` int32 [D],
  ``prompts`` int32 [D] (prompts given per domain; most are zero, so it compresses to little);
- ``cells``: one record per (domain, level) that had attempts, in the ``CELL`` layout below.

The readers (``curriculum.store_read``) turn these back into the very rows version 1 returned, so
``compare``, ``report``, ``replay`` and ``rebuild_from_store`` read either layout alike.
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from curriculum.types import Plan

CELL = np.dtype([("domain", "<i4"), ("level", "<i4"), ("attempts", "<i4"), ("successes", "<i4"),
                 ("zero_var_groups", "<i4"), ("groups", "<i4"), ("reward_sum", "<f8"), ("abs_adv_sum", "<f8")])
_INT_STATS = ("attempts", "successes", "zero_var_groups", "groups")
_FLOAT_STATS = ("reward_sum", "abs_adv_sum")


def _pack(array: np.ndarray) -> bytes:
    # Level 6 keeps a sixth more off the disk than level 1 (weights that repeat a floor value,
    # mostly-zero counts) and costs microseconds on arrays of a few kilobytes.
    return zlib.compress(np.ascontiguousarray(array).tobytes(), 6)


def _unpack(blob: bytes, dtype: np.dtype | str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(blob), dtype=dtype)


def encode_step(plan: "Plan", stat_rows: list[dict]) -> dict[str, bytes]:
    """The ``step_arrays`` columns (without run and step) of one step's plan and statistics."""
    index = {name: i for i, name in enumerate(plan.domains)}
    prompts = np.zeros(len(plan.domains), dtype="<i4")
    for (domain, _level), n in plan.counts.items():
        prompts[index[domain]] += n
    cells = np.zeros(len(stat_rows), dtype=CELL)
    for k, row in enumerate(stat_rows):
        if row["domain"] not in index:
            raise ValueError(f"step statistics for domain {row['domain']!r}, which is not in the step's plan")
        cells[k] = (index[row["domain"]], row["level"], *(row[f] for f in _INT_STATS),
                    *(row[f] for f in _FLOAT_STATS))
    return {"weights": _pack(np.asarray(plan.weights, dtype="<f8")),
            "levels": _pack(np.asarray(plan.levels, dtype="<i4")),
            "prompts": _pack(prompts), "cells": _pack(cells)}


def decode_vector(row: dict, domains: list[str]) -> dict:
    """A ``plan_vectors`` row as version 1 returned it: {step, domains, weights, levels}."""
    return {"run_id": row["run_id"], "step": row["step"], "domains": list(domains),
            "weights": _unpack(row["weights"], "<f8").tolist(), "levels": _unpack(row["levels"], "<i4").tolist()}


def decode_plans(row: dict, domains: list[str]) -> list[dict]:
    """The ``plans`` rows of a step: one per domain that got prompts, by domain name."""
    weights, levels = _unpack(row["weights"], "<f8"), _unpack(row["levels"], "<i4")
    prompts = _unpack(row["prompts"], "<i4")
    given = sorted((domains[d], d) for d in np.nonzero(prompts)[0].tolist())
    return [{"run_id": row["run_id"], "step": row["step"], "domain": name, "weight": float(weights[d]),
             "level": int(levels[d]), "n_prompts": int(prompts[d])} for name, d in given]


def decode_stats(row: dict, domains: list[str]) -> list[dict]:
    """The ``step_stats`` rows of a step, by domain name and level (``mean_abs_adv`` recomputed)."""
    out = []
    for cell in _unpack(row["cells"], CELL).tolist():
        d, level, attempts, successes, zero_var, groups, reward_sum, abs_adv_sum = cell
        out.append({"run_id": row["run_id"], "step": row["step"], "domain": domains[d], "level": level,
                    "attempts": attempts, "successes": successes, "reward_sum": reward_sum,
                    "abs_adv_sum": abs_adv_sum, "mean_abs_adv": abs_adv_sum / attempts,
                    "zero_var_groups": zero_var, "groups": groups})
    return sorted(out, key=lambda r: (r["domain"], r["level"]))
