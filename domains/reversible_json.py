"""Reversible JSON for arbitrary Python values: ``decode(encode(v))`` equals ``v``.

reasoning-gym entries hold tuples, sets, numpy scalars and int-keyed dicts, and some scorers compare
them by type (a tuple is not a list), so plain JSON would turn right answers wrong. Such values are
tagged (``{"__tuple__": [...]}`` and the like); a value with no JSON form is kept as its repr and
named in ``lossy``, so the caller can regenerate it instead.
"""
from __future__ import annotations

import math
from typing import Any

TUPLE, SET, ITEMS, FLOAT, REPR = "__tuple__", "__set__", "__items__", "__float__", "__repr__"


def encode(value: Any, lossy: list[str]) -> Any:
    """``value`` as JSON data that ``decode`` turns back into an equal value. Types with no JSON
    form are stored as their repr and named in ``lossy``."""
    if value is None or type(value) in (bool, int, str):
        return value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {FLOAT: repr(float(value))}
    if isinstance(value, str):  # subclasses such as numpy.str_
        return str(value)
    if isinstance(value, int):  # subclasses such as IntEnum
        return int(value)
    if isinstance(value, list):
        return [encode(v, lossy) for v in value]
    if isinstance(value, tuple):
        return {TUPLE: [encode(v, lossy) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {SET: sorted((encode(v, lossy) for v in value), key=repr)}
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {k: encode(v, lossy) for k, v in value.items()}
        return {ITEMS: [[encode(k, lossy), encode(v, lossy)] for k, v in value.items()]}
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return encode(value.item(), lossy)  # numpy scalars: equal to their Python value
    lossy.append(type(value).__name__)
    return {REPR: repr(value)}


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        tag, inner = next(iter(value.items()))
        if tag == TUPLE:
            return tuple(decode(v) for v in inner)
        if tag == SET:
            return {decode(v) for v in inner}
        if tag == ITEMS:
            return {decode(k): decode(v) for k, v in inner}
        if tag == FLOAT:
            return float(inner)
        if tag == REPR:
            return inner
    return {k: decode(v) for k, v in value.items()}
