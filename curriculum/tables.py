"""How a value reads in a table cell: the per-domain tables of the trainer's console, of
``palestra stats`` and of the report page all write their numbers the same way."""
from __future__ import annotations

from typing import Any


def cell_text(value: Any) -> str:
    """``-`` for a missing value, three decimals for a float, else the value as text."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
