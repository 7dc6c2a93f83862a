"""A code domain whose tasks come from a JSONL file of dataset rows.

Rows in HumanEval's published shape, APPS / CodeContests rows (stdin/stdout cases, or call-based
with ``fn_name``) and rows with ``tests: [{input, output}]`` are each normalised into a Task whose
payload holds the hidden tests in one of the three formats ``domains.code.verifier`` verifies. A row's level
is its ``level`` field, else its ``difficulty`` word (introductory/easy 1, interview/medium 2,
competition/hard 3), else 1.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from domains.api import Task, TaskListDomain, user_prompt
from domains.code.verifier import CodeConfig, CodeDomain


def detect_format(row: dict[str, Any]) -> str:
    if {"prompt", "test", "entry_point"} <= row.keys() and "def check" in str(row["test"]):
        return "humaneval"
    io = _input_output(row)
    if io is not None:
        return "call" if (io.get("fn_name") or row.get("fn_name")) else "stdio"
    if row.get("fn_name") and ("tests" in row or "inputs" in row):
        return "call"
    raise ValueError(f"unrecognised code task row (fields: {', '.join(sorted(row))})")


def _input_output(row: dict[str, Any]) -> dict[str, Any] | None:
    io = row.get("input_output")
    if isinstance(io, str) and io.strip():
        io = json.loads(io)
    return io if isinstance(io, dict) and "inputs" in io and "outputs" in io else None


def _pairs(row: dict[str, Any]) -> list[tuple[Any, Any]]:
    io = _input_output(row) or row
    if "tests" in io:
        return [(t["input"], t["output"]) for t in io["tests"]]
    if len(io["inputs"]) != len(io["outputs"]):
        raise ValueError("inputs and outputs differ in length")
    return list(zip(io["inputs"], io["outputs"]))


def _as_text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def row_to_task(row: dict[str, Any], domain: str, level: int = 1) -> Task:
    """Normalise one JSONL row (any supported format) into a Task with hidden tests."""
    fmt = detect_format(row)
    meta = {"task_id": row.get("task_id", row.get("problem_id")), "format": fmt}
    if fmt == "humaneval":
        payload = {"format": fmt, "entry_point": row["entry_point"], "test": row["test"], "prompt_code": row["prompt"]}
        text = f"Complete the following Python function.\n\n```python\n{row['prompt']}```"
        reference = row.get("canonical_solution")
    else:
        text = str(row.get("question") or row.get("prompt") or row.get("problem") or row.get("description") or "")
        reference = _first_solution(row)
        if fmt == "call":
            name = (_input_output(row) or {}).get("fn_name") or row["fn_name"]
            cases = [{"args": i if isinstance(i, list) else [i], "expected": o} for i, o in _pairs(row)]
            payload = {"format": fmt, "entry_point": name, "cases": cases}
            if row.get("starter_code"):
                payload["prompt_code"] = row["starter_code"]
        else:
            payload = {"format": fmt, "cases": [{"input": _as_text(i), "output": _as_text(o)} for i, o in _pairs(row)]}
    if reference:
        payload["reference"] = reference
    return Task(domain=domain, level=level, prompt=user_prompt(text), payload=payload, meta=meta)


def _first_solution(row: dict[str, Any]) -> str | None:
    for key in ("canonical_solution", "solution", "reference"):
        if isinstance(row.get(key), str):
            return row[key]
    solutions = row.get("solutions")
    if isinstance(solutions, str) and solutions.strip():
        solutions = json.loads(solutions)
    return solutions[0] if isinstance(solutions, list) and solutions else None


_DIFFICULTY = {"introductory": 1, "easy": 1, "interview": 2, "medium": 2, "competition": 3, "hard": 3}


def row_level(row: dict[str, Any]) -> int:
    if isinstance(row.get("level"), int):
        return row["level"]
    return _DIFFICULTY.get(str(row.get("difficulty", "")).lower(), 1)


def load_jsonl(path: str | Path, domain: str) -> list[Task]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    tasks = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            tasks.append(row_to_task(row, domain, row_level(row)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: {exc}") from exc
    return tasks


# what a chat-style prompt asks for, by test format: the verifier runs the first ```python block
CODE_REQUESTS = {
    "humaneval": "Reply with the completed function in a ```python code block.",
    "call": "Reply with the function in a ```python code block.",
    "stdio": "Write a program that reads standard input and prints the answer, in a ```python code block.",
}


class CodeDatasetConfig(CodeConfig):
    path: str | None = None  # JSONL file of task rows (HumanEval, APPS-style stdin/stdout or call-based)


class CodeDatasetDomain(TaskListDomain, CodeDomain):
    """Code tasks from a JSONL file; levels from each row's ``level`` or ``difficulty`` field."""

    name = "code_dataset"
    Config = CodeDatasetConfig

    def __init__(self, config: CodeDatasetConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self.tasks: list[Task] = []
        self._on_configure()

    def _on_configure(self) -> None:
        self.tasks = [self._styled(t) for t in load_jsonl(self.config.path, self.name)] if self.config.path else []
        self.levels = tuple(sorted({t.level for t in self.tasks})) or (1,)

    def task_from_row(self, row: dict[str, Any]) -> Task:
        """One raw dataset row (HumanEval, APPS-style, call-based) as a task of this domain."""
        return self._styled(row_to_task(row, self.name, row_level(row)))

    def _styled(self, task: Task) -> Task:
        """The row's question in this domain's prompt style (chat: the answer format asked for)."""
        prompt = self.restyle(task.prompt, CODE_REQUESTS[task.payload["format"]])
        return task if prompt == task.prompt else replace(task, prompt=prompt, id="")

    def task_from_json(self, data: dict[str, Any]) -> Task:
        """``palestra verify`` input: a Task's JSON, a raw dataset row, or just the ``task_id`` of a
        row in the configured file (the shape of HumanEval's own samples files)."""
        if {"domain", "prompt", "payload"} <= data.keys():
            return Task.from_json(data)
        if data.keys() == {"task_id"}:
            for task in self.tasks:
                if task.meta.get("task_id") == data["task_id"]:
                    return task
            raise ValueError(f"no task {data['task_id']!r} in {self.config.path}")
        return self.task_from_row(data)


CODE_DATASET = CodeDatasetDomain()
