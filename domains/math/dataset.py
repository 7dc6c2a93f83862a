"""A math domain backed by a file of problems (JSONL or Parquet) with gold answers.

Each row has ``prompt`` (text, or a list of chat messages) and ``answer`` (the gold answer, any
form math-verify can parse), and optionally ``level`` (an integer difficulty) and ``id``. With the
option ``reference_field`` (e.g. MATH's ``solution``), that field is a worked solution the SFT warm
start trains on instead of the bare boxed answer; it must box its final answer, and a row without
it falls back to the box. Long solutions need a generation budget to match (the domain's own
``max_new_tokens``), or every sampled completion is cut off before its box. Files are
JSONL (one object per line; a ``.json`` file may instead hold one array) or Parquet (pyarrow). The field
names for prompt and answer can be changed with options, so a GSM8K- or MATH-style file loads
without rewriting it. Levels are the distinct levels in the file, or ``default_level`` for rows
without one.

Held-out rows: a fixed fraction of rows (``heldout_fraction``), chosen by a hash of the row's id
(or of its content when it has none), is reserved for evaluation. ``sample`` never returns them
and ``heldout`` returns only them, so the split does not depend on the seed, the order of the file
or on which other rows exist.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from domains.api import Messages, Task, stable_hash, user_prompt
from domains.math.answer import BOX_REQUEST, MathAnswerDomain, MathConfig, extract_final_answer

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class DatasetConfig(MathConfig):
    path: str | None = None  # required before the domain can sample
    name: str | None = None  # the domain's name in the run (two files: two named instances, docs/domains.md)
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    reference_field: str | None = None  # a worked solution for the SFT warm start, when the file has one
    default_level: int = 1
    heldout_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)


class DatasetError(ValueError):
    """A dataset file that is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Row:
    prompt: Messages
    answer: str
    level: int
    key: str  # the row's id, or a hash of its content
    line: int  # 1-based line (JSONL) or row number (Parquet), for messages
    reference: str | None = None  # worked solution, from ``reference_field``


def _read_json_array(path: Path) -> list[tuple[int, Any]]:
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(records, list):
        raise DatasetError(f"{path}: a .json file must hold one array of rows (or one row per line)")
    return list(enumerate(records, start=1))  # numbered by position in the array


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    with path.open(encoding="utf-8") as handle:
        if path.suffix.lower() == ".json" and handle.read(4096).lstrip().startswith("["):
            return _read_json_array(path)
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    return records


def _read_parquet(path: Path) -> list[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    return list(enumerate(table.to_pylist(), start=1))


def read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) pairs from a JSONL or Parquet file, chosen by the file's suffix."""
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}" + (" (a folder)" if path.is_dir() else ""))
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        try:
            return _read_jsonl(path)
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if suffix in PARQUET_SUFFIXES:
        return _read_parquet(path)
    raise DatasetError(f"{path}: unknown dataset format {suffix!r} (use one of {JSONL_SUFFIXES + PARQUET_SUFFIXES})")


def _as_messages(value: Any, where: str) -> Messages:
    if isinstance(value, str) and value.strip():
        return user_prompt(value)
    if isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    ):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DatasetError(f"{where}: prompt must be a non-empty string or a list of {{role, content}} messages")


def _as_answer(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise DatasetError(f"{where}: answer must be a non-empty string or a number")
    return str(value).strip()


def _missing(value: Any) -> bool:
    """None, or the NaN that pandas writes for a missing value in a column of numbers."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _as_level(value: Any, default: int, where: str) -> int:
    if _missing(value):
        return default
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().lstrip("-").isdigit():
        raise DatasetError(f"{where}: level must be an integer, got {value!r}")
    return int(value)


def parse_row(number: int, record: Any, config: DatasetConfig, where: str) -> Row:
    """One validated row; errors name the file and line."""
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: expected an object with fields, got {type(record).__name__}")
    missing = [f for f in (config.prompt_field, config.answer_field) if record.get(f) is None]
    if missing:
        raise DatasetError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    prompt = _as_messages(record[config.prompt_field], where)
    answer = _as_answer(record[config.answer_field], where)
    level = _as_level(record.get("level"), config.default_level, where)
    key = str(record["id"]) if record.get("id") is not None else stable_hash(prompt, answer)
    return Row(prompt=prompt, answer=answer, level=level, key=key, line=number,
               reference=_as_reference(record, config.reference_field, where))


def _as_reference(record: dict, field: str | None, where: str) -> str | None:
    """The row's worked solution, or None when it has none; one that is there must box an answer,
    or the warm start would teach completions the verifier scores as format errors."""
    value = record.get(field) if field else None
    if _missing(value) or value == "":
        return None
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: {field} must be a worked solution (text), got {value!r:.40}")
    if extract_final_answer(value).answer is None:
        raise DatasetError(f"{where}: {field} has no final \\boxed{{...}} answer for the verifier to read")
    return value


def is_heldout(key: str, fraction: float) -> bool:
    """Deterministic split: the row's hash, read as a number in [0, 1), below ``fraction``."""
    return int(stable_hash("heldout", key), 16) / 16 ** 16 < fraction


class MathDataset(MathAnswerDomain):
    """Problems with gold answers from a JSONL or Parquet file; see the module docstring."""

    name = "math_dataset"
    levels = (1,)
    Config = DatasetConfig

    def __init__(self, config: DatasetConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self._train: dict[int, list[Row]] = {}
        self._heldout: dict[int, list[Row]] = {}
        if self.config.name:
            self.name = self.config.name
        if self.config.path:
            self._on_configure()

    def _on_configure(self) -> None:
        config: DatasetConfig = self.config  # type: ignore[assignment]
        if config.name:
            self.name = config.name
        if not config.path:
            raise DatasetError(f"domain {self.name!r} needs the option 'path' (a .jsonl or .parquet file)")
        rows = self._load(Path(config.path).expanduser())
        self.levels = tuple(sorted({row.level for row in rows}))
        self._train, self._heldout = {}, {}
        for row in rows:
            split = self._heldout if is_heldout(row.key, config.heldout_fraction) else self._train
            split.setdefault(row.level, []).append(row)
        untrainable = sorted(set(self._heldout) - set(self._train))
        if untrainable:  # the difficulty controller would reach it and find nothing to train on
            level = untrainable[0]
            raise DatasetError(f"{config.path}: every row of level {level} ({len(self._heldout[level])}) is held out; "
                               "add rows at that level or lower heldout_fraction")

    def _load(self, path: Path) -> list[Row]:
        rows = []
        seen: dict[str, int] = {}
        for number, record in read_records(path):
            row = parse_row(number, record, self.config, f"{path}:{number}")  # type: ignore[arg-type]
            if row.key in seen:
                raise DatasetError(f"{path}:{number}: duplicate id {row.key!r} (first on line {seen[row.key]})")
            seen[row.key] = number
            rows.append(row)
        if not rows:
            raise DatasetError(f"{path}: no rows")
        field = self.config.reference_field  # type: ignore[attr-defined]
        if field and not any(row.reference for row in rows):  # a misspelt field would train on boxes alone
            raise DatasetError(f"{path}: no row has the reference field {field!r}")
        return rows

    def _rows(self, split: dict[int, list[Row]], level: int, what: str) -> list[Row]:
        if not self._train and not self._heldout:
            raise DatasetError(f"domain {self.name!r} has no data: configure it with the option 'path'")
        if level not in self.levels:
            raise ValueError(f"domain {self.name!r} has no level {level} (levels: {list(self.levels)})")
        rows = split.get(level, [])
        if not rows and what == "training":
            raise DatasetError(f"domain {self.name!r}: every row of level {level} is held out; lower heldout_fraction")
        return rows

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        """``n`` training rows of ``level``: without repeats when the level has enough rows."""
        rows = self._rows(self._train, level, "training")
        chosen = rng.sample(rows, n) if n <= len(rows) else [rng.choice(rows) for _ in range(n)]
        return [self._task(row) for row in chosen]

    def heldout(self, level: int, n: int, seed: int) -> list[Task]:
        """Up to ``n`` held-out rows of ``level`` (fewer when the slice is smaller), fixed by ``seed``."""
        rows = self._rows(self._heldout, level, "held-out")
        chosen = random.Random(f"heldout/{self.name}/{level}/{seed}").sample(rows, min(n, len(rows)))
        return [self._task(row) for row in chosen]

    def _task(self, row: Row) -> Task:
        meta = {"row_id": row.key, "line": row.line} | ({"solution": row.reference} if row.reference else {})
        return Task(domain=self.name, level=row.level, prompt=self.restyle(row.prompt, BOX_REQUEST),
                    payload={"answer": row.answer}, meta=meta, id=stable_hash(self.name, row.key))


MATH_DATASET = MathDataset()
