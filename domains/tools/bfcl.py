"""``bfcl``: single-call function calling on Berkeley Function Calling Leaderboard rows, as published.

A row is ``{"id", "question", "function", "ground_truth"}``: ``question`` is chat messages (BFCL v3
nests them one list per turn; both shapes are read), ``function`` the callable schemas, and
``ground_truth`` a list of ``{func_name: {param: [acceptable values]}}`` where ``""`` among the
values marks an optional parameter. BFCL publishes ground truth in separate ``possible_answer``
files; give that file as ``answers_path`` to join it by ``id``, or merge it into the rows.

The model answers with ``<tool_call>`` blocks (or a bare JSON call or list of calls). Grading
follows BFCL's Python AST checker (``ast_checker.py``), rewritten here:

- as many calls as ground-truth entries, matched without order, greedily, as BFCL's
  ``parallel_function_checker_no_order`` does (for one call this is the simple/multiple check);
- the function name matches (a dotted name may be written with ``_``, as BFCL allows);
- required parameters present, no parameter outside both the schema and the ground truth, and a
  ground-truth parameter may be left out only when ``""`` is acceptable;
- types as BFCL maps them (``float`` accepts an int; a value of the ground truth's own type is
  taken as a variable reference when that differs from the schema type);
- values among the acceptable ones; strings compared after BFCL's ``standardize_string``
  (lowercase, without spaces and ``,./-_*^``, ``'`` as ``"``), lists and dicts element-wise, and
  numbers by ``==`` (so ``5 == 5.0``).

Levels are BFCL's categories: 1 simple, 2 multiple (pick one of several functions), 3 parallel,
4 parallel-multiple (``live_`` rows join the same levels). Both published namings are read: v4's
``simple_python_N`` and v3's ``simple_N`` are the same Python category. The other categories
(irrelevance, relevance, Java, JavaScript, multi-turn, memory, web search, format sensitivity)
are not Python single-call tasks: a file's rows of them are skipped and counted in the log, and
one given to ``palestra verify`` is refused by name.
"""
from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

from domains.api import DomainConfig, Status, Task, TaskListDomain, VerifyResult
from domains.tools.calls import Call, CallFormatError, call_from_json, loads_strict, parse_turn, render_call

MAX_ANSWER_CHARS = 65_536  # BFCL arguments can be long (code, text); still bounded
LEVELS = {"simple": 1, "multiple": 2, "parallel": 3, "parallel_multiple": 4}
# BFCL v4 names its Python simple category ``simple_python`` (beside ``simple_java`` and
# ``simple_javascript``); v3 called it ``simple``. One level for both.
ALIASES = {"simple_python": "simple"}
TYPES = {"string": str, "integer": int, "float": float, "number": float, "boolean": bool,
         "array": list, "tuple": list, "dict": dict, "object": dict, "any": str}
SYSTEM = ("Call the function(s) that answer the user, as <tool_call>{\"name\":...,\"arguments\":{...}}"
          "</tool_call>. Functions: ")


log = logging.getLogger("palestra.bfcl")


def category(row_id: str) -> str:
    """``simple_12`` and ``simple_python_12`` -> ``simple``; ``live_parallel_multiple_3-1-0`` ->
    ``parallel_multiple``; a category this domain does not score comes back as named
    (``simple_java``, ``irrelevance``)."""
    name = re.sub(r"_\d.*$", "", row_id)  # v4's memory rows run on: ``memory_0-customer-0``
    name = name[len("live_"):] if name.startswith("live_") else name
    return ALIASES.get(name, name)


def standardize_string(text: str) -> str:
    """BFCL's string normalisation: no spaces or ``,./-_*^``, lowercase, single quotes doubled."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return standardize_string(value) if isinstance(value, str) else value


# -- rows ------------------------------------------------------------------------------------------------
def _messages(question: Any) -> list[dict[str, str]]:
    if isinstance(question, str):
        return [{"role": "user", "content": question}]
    if isinstance(question, list) and question and isinstance(question[0], list):
        if len(question) != 1:
            raise ValueError("multi-turn BFCL rows are not single-call tasks")
        question = question[0]
    if not isinstance(question, list) or not all(isinstance(m, dict) and "content" in m for m in question):
        raise ValueError("'question' must be chat messages")
    return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in question]


def row_to_task(row: dict[str, Any], domain: str) -> Task:
    missing = {"id", "question", "function", "ground_truth"} - row.keys()
    if missing:
        raise ValueError(f"BFCL row lacks {', '.join(sorted(missing))}")
    kind = category(str(row["id"]))
    if kind not in LEVELS:
        raise ValueError(f"BFCL category {kind!r} (row {row['id']}) is not scored here: only the Python "
                         f"single-call categories are ({', '.join(LEVELS)}, their live_ rows, v4's simple_python)")
    functions, truth = row["function"], row["ground_truth"]
    functions = functions if isinstance(functions, list) else [functions]
    if not isinstance(truth, list) or not all(isinstance(t, dict) and len(t) == 1 for t in truth):
        raise ValueError(f"row {row['id']}: ground_truth must be a list of {{name: {{param: [values]}}}}")
    system = SYSTEM + json.dumps(functions, separators=(",", ":"), ensure_ascii=False)
    return Task(domain=domain, level=LEVELS[kind],
                prompt=[{"role": "system", "content": system}, *_messages(row["question"])],
                payload={"functions": functions, "ground_truth": truth},
                meta={"bfcl_id": row["id"], "category": kind})


# -- reading the model's calls ---------------------------------------------------------------------------
def _as_calls(value: Any) -> list[Call]:
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item.values())), dict):
            (name, arguments), = item.items()  # BFCL's own {func: {param: value}} shape
            calls.append(Call(name, arguments))
        else:
            calls.append(call_from_json(item))
    return calls


def parse_calls(completion: str) -> list[Call]:
    if "<tool_call>" in completion or "</tool_call>" in completion:
        return parse_turn(completion, max_calls=32, max_call_chars=MAX_ANSWER_CHARS).calls
    text = completion.strip()
    if not text.startswith(("{", "[")):
        raise CallFormatError("no function call found")
    return _as_calls(loads_strict(text, MAX_ANSWER_CHARS))


# -- BFCL's checks ------------------------------------------------------------------------------------------
def _type_ok(value: Any, expected: type, acceptable: list[Any], nested: type | None) -> tuple[bool, bool]:
    """(type is fine, value is a variable reference): BFCL's ``type_checker``, one level deep."""
    given = next((type(a) for a in acceptable if a != ""), None)
    is_variable = given is not None and given is not expected
    if type(value) is expected:
        if nested is None or not value:
            return True, is_variable
        nested_ok = all(type(v) is nested or (nested is float and type(v) is int) for v in value)
        return nested_ok, is_variable
    if given is not None and type(value) is given:
        return True, True
    return False, False


def _dict_ok(value: dict, acceptable: list[Any]) -> bool:
    for option in acceptable:
        if option == "" or not isinstance(option, dict):
            continue
        if all(k in option and _std(v) in [_std(a) for a in option[k]] for k, v in value.items()) and \
                all(k in value or "" in allowed for k, allowed in option.items()):
            return True
    return False


def _list_dict_ok(value: list, acceptable: list[Any]) -> bool:
    return any(isinstance(option, list) and len(option) == len(value)
               and all(isinstance(v, dict) and _dict_ok(v, [o]) for v, o in zip(value, option))
               for option in acceptable)


def _value_ok(value: Any, expected: type, nested: type | None, acceptable: list[Any]) -> bool:
    if expected is dict:
        return _dict_ok(value, acceptable)
    if expected is list and nested is dict:
        return _list_dict_ok(value, acceptable)
    if expected is str:
        return _std(value) in [_std(a) for a in acceptable if isinstance(a, str)]
    if expected is list:
        return [_std(v) for v in value] in [[_std(a) for a in option] for option in acceptable if isinstance(option, list)]
    return value in acceptable


def check_call(function: dict[str, Any], call: Call, truth: dict[str, list[Any]]) -> str | None:
    """None when ``call`` is acceptable for one ground-truth entry, else why not."""
    name = function["name"]
    if call.name not in (name, name.replace(".", "_")):
        return f"function {call.name!r} is not {name!r}"
    params = function.get("parameters", {})
    properties, required = params.get("properties", {}), params.get("required", [])
    for param in required:
        if param not in call.arguments:
            return f"missing required parameter {param!r}"
    for param, value in call.arguments.items():
        if param not in properties or param not in truth:
            return f"unexpected parameter {param!r}"
        problem = _param_problem(param, value, properties[param], truth[param])
        if problem:
            return problem
    for param, acceptable in truth.items():
        if param not in call.arguments and "" not in acceptable:
            return f"parameter {param!r} is not optional"
    return None


def _param_problem(param: str, value: Any, schema: dict[str, Any], acceptable: list[Any]) -> str | None:
    expected = TYPES.get(schema.get("type", "any"), str)
    nested = TYPES.get(schema.get("items", {}).get("type", ""), None) if expected is list else None
    if expected is float and type(value) is int:
        value = float(value)  # BFCL lets Python's int stand for a float
    type_ok, is_variable = _type_ok(value, expected, acceptable, nested)
    if not type_ok:
        return f"parameter {param!r}: wrong type {type(value).__name__}"
    # a variable reference is compared as written, as BFCL does
    ok = (value in acceptable) if is_variable else _value_ok(value, expected, nested, acceptable)
    return None if ok else f"parameter {param!r}: {str(value)[:80]!r} is not acceptable"


def check_calls(functions: list[dict], calls: list[Call], truth: list[dict]) -> str | None:
    """BFCL's no-order matching: each ground-truth entry takes the first unused call it accepts."""
    if len(calls) != len(truth):
        return f"{len(calls)} calls, expected {len(truth)}"
    by_name = {f["name"]: f for f in functions}
    unused = list(range(len(calls)))
    for entry in truth:
        (name, params), = entry.items()
        function = by_name.get(name)
        if function is None:
            return f"ground truth names {name!r}, which is not among the functions"
        problems = [(i, check_call(function, calls[i], params)) for i in unused]
        match = next((i for i, problem in problems if problem is None), None)
        if match is None:
            return problems[0][1] if len(problems) == 1 else f"no call matches {name!r}"
        unused.remove(match)
    return None


# -- reference -----------------------------------------------------------------------------------------------
def _first(acceptable: list[Any]) -> Any:
    return next((a for a in acceptable if a != ""), "")


def _pick(acceptable: list[Any], schema: dict[str, Any]) -> Any:
    """One acceptable value, built out of nested ``{key: [values]}`` options where BFCL has them."""
    value = _first(acceptable)
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if _first(v) != ""}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [{k: _first(o) for k, o in v.items() if _first(o) != ""} for v in value]
    return value


def reference_calls(functions: list[dict], truth: list[dict]) -> str:
    by_name = {f["name"]: f for f in functions}
    blocks = []
    for entry in truth:
        (name, params), = entry.items()
        properties = by_name.get(name, {}).get("parameters", {}).get("properties", {})
        # an optional parameter the schema does not name (BFCL's ground truth has some) is left out:
        # the checker rejects a parameter outside the schema
        arguments = {p: _pick(values, properties.get(p, {})) for p, values in params.items()
                     if _first(values) != "" and not ("" in values and p not in properties)}
        blocks.append(render_call(name, **arguments))
    return "".join(blocks)


# -- the domain --------------------------------------------------------------------------------------------------
class BFCLConfig(DomainConfig):
    path: str | None = None  # JSONL of BFCL rows (BFCL's ``.json`` files are JSON lines)
    answers_path: str | None = None  # BFCL's possible_answer file, joined by id, when rows lack it


class BFCLDomain(TaskListDomain):
    # Single-turn (the Domain defaults: not multi_turn, no stop_text): one completion holds every
    # call, parallel ones included, so generation must not stop at the first closing tag.
    name = "bfcl"
    levels = (1, 2, 3, 4)
    Config = BFCLConfig

    def __init__(self, config: DomainConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self.tasks: list[Task] = []
        self.answers: dict[str, Any] = {}
        self.skipped: dict[str, int] = {}  # rows of the file in categories not scored, by category
        self.unanswerable: list[str] = []  # ids of rows left out: no call passes their ground truth

    def _on_configure(self) -> None:
        self.answers = {}
        for where, row in _jsonl(self.config.answers_path):
            try:
                self.answers[row["id"]] = row["ground_truth"]
            except (KeyError, TypeError) as exc:
                raise ValueError(f"{where}: an answer row needs id and ground_truth ({type(exc).__name__}: {exc})") from None
        tasks, skipped = self._read_rows()
        # A row whose ground truth contradicts its own schema (a required parameter with no
        # acceptable value, one the schema does not name) has no answer that BFCL's checks pass:
        # training on it would only teach that the right call is wrong. Left out, and named.
        self.tasks = [t for t in tasks if self._answerable(t)]
        self.unanswerable = sorted({t.meta["bfcl_id"] for t in tasks} - {t.meta["bfcl_id"] for t in self.tasks})
        self.skipped = dict(skipped)
        if skipped:
            counts = ", ".join(f"{kind} {n}" for kind, n in sorted(skipped.items()))
            log.info("%s: %d tasks read from %s; skipped %d rows of categories not scored here (%s)",
                     self.name, len(self.tasks), self.config.path, sum(skipped.values()), counts)
        if self.unanswerable:
            log.warning("%s: left out %d rows of %s that no call can pass (their ground truth contradicts "
                        "their schema): %s", self.name, len(self.unanswerable), self.config.path,
                        ", ".join(self.unanswerable[:8]) + (", …" if len(self.unanswerable) > 8 else ""))

    def _answerable(self, task: Task) -> bool:
        try:
            return self.verify(task, self.reference(task)).correct
        except (KeyError, TypeError, ValueError):  # ground truth too broken to write a call from
            return False

    def _read_rows(self) -> tuple[list[Task], Counter[str]]:
        """The file's rows of the categories scored here as tasks, and a count of the others."""
        tasks: list[Task] = []
        skipped: Counter[str] = Counter()
        for where, row in _jsonl(self.config.path):
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a row must be a JSON object")
            kind = category(str(row.get("id", "")))
            if kind not in LEVELS:  # other categories are skipped, not errors
                skipped[kind] += 1
                continue
            try:
                tasks.append(self.task_from_json(row))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {type(exc).__name__}: {exc}") from None
        return tasks, skipped

    def task_from_json(self, data: dict[str, Any]) -> Task:
        """A Task's JSON or a raw BFCL row (``palestra verify --domain bfcl`` with no flags)."""
        if {"domain", "prompt", "payload"} <= data.keys():
            return Task.from_json(data)
        if "ground_truth" not in data and data.get("id") in self.answers:
            data = {**data, "ground_truth": self.answers[data["id"]]}
        return row_to_task(data, self.name)

    def reference(self, task: Task) -> str:
        return reference_calls(task.payload["functions"], task.payload["ground_truth"])

    def verify(self, task: Task, completion: str) -> VerifyResult:
        try:
            calls = parse_calls(completion)
        except CallFormatError as exc:
            return VerifyResult.failure(Status.FORMAT_ERROR, str(exc), calls=0)
        problem = check_calls(task.payload["functions"], calls, task.payload["ground_truth"])
        details = {"calls": len(calls), "names": [c.name[:64] for c in calls[:8]]}
        if problem:
            return VerifyResult.failure(Status.WRONG, problem, **details)
        return VerifyResult(1.0, True, Status.OK, details)


def _jsonl(path: str | None) -> list[tuple[str, Any]]:
    """The rows of a JSON-lines file, each with its ``path:line`` for messages."""
    if not path:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    return rows


BFCL = BFCLDomain()
