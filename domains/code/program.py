"""From a completion to the program a code verifier runs, and how outputs are compared.

The program: the first fenced block of the completion (``extract_code``), put after the task's
prompt code when the completion continues it (``assemble``), ``from __future__`` imports first,
and the ``typing`` names imported for code that uses them (``typing_preamble``). The comparisons:
plain data that crossed JSON (``values_match``) and stdout line by line (``stdout_matches``).
Everything here is pure and runs in the verifier process; ``domains.code.verifier`` runs the
programs in the sandbox.
"""
from __future__ import annotations

import ast
import math
import re
import typing
from typing import Any



# -- completion → program -------------------------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str) -> str:
    """The first ```python fenced block (any fenced block if none is labelled), else the text."""
    blocks = _FENCE.findall(completion)
    for label, body in blocks:
        if label.lower() in ("python", "py", "python3"):
            return body.strip("\n")
    if blocks:
        return blocks[0][1].strip("\n")
    return completion.strip("\n")


def defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def assemble(completion: str, payload: dict[str, Any]) -> str:
    """The program to run: the task's prompt code, then the extracted code.

    A completion that continues the prompt (HumanEval's convention) is appended as is. One that
    writes the whole function still runs after a prompt that is a complete program (HumanEval's:
    imports, helpers, a signature with a docstring), whose imports it may use; its definition
    replaces the prompt's. An incomplete starter (APPS's ``class Solution`` stub) is left out."""
    code = extract_code(completion)
    prompt_code = payload.get("prompt_code") or ""
    if not (payload.get("entry_point") and prompt_code):
        return code
    if not defines(code, payload["entry_point"]):
        return prompt_code + code
    return futures_first(prompt_code.rstrip("\n") + "\n\n\n" + code) if _compiles(prompt_code) else code


_FUTURE_IMPORT = re.compile(r"^from\s+__future__\s+import\b.*$", re.MULTILINE)


def futures_first(program: str) -> str:
    """``program`` with its top-level ``from __future__`` imports moved to the start, where Python
    requires them: code put after a prompt or a preamble may begin with one."""
    futures = _FUTURE_IMPORT.findall(program)
    return "\n".join(futures + [_FUTURE_IMPORT.sub("", program)]) if futures else program


def _compiles(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


# -- comparing plain data -------------------------------------------------------------------------
def values_match(got: Any, expected: Any, tol: float = 1e-6) -> bool:
    """Equality for data that crossed JSON: bool is not int, tuples equal lists, floats with tolerance."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, int) and isinstance(got, int):
        return got == expected  # exact: a relative tolerance would let 10**9 + 8 pass for 10**9 + 7
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, float) and math.isnan(expected):
            return isinstance(got, float) and math.isnan(got)
        return math.isclose(got, expected, rel_tol=tol, abs_tol=tol)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(values_match(g, e, tol) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        g = {str(k): v for k, v in got.items()}  # JSON turns every dict key into a string
        e = {str(k): v for k, v in expected.items()}
        return len(g) == len(got) and g.keys() == e.keys() and all(values_match(g[k], e[k], tol) for k in e)
    if type(got) is not type(expected):
        return False
    return got == expected


def call_output_matches(got: Any, expected: Any) -> bool:
    """APPS stores call-based outputs sometimes wrapped in a one-element list; accept both."""
    if values_match(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and values_match(got, expected[0])


def stdout_matches(got: str, expected: str, tol: float = 1e-6) -> bool:
    """Line by line after stripping trailing space; integer tokens equal as integers, other
    tokens that both parse as numbers within ``tol``."""
    got_lines, want_lines = _lines(got), _lines(expected)
    if len(got_lines) != len(want_lines):
        return False
    return all(g == w or _tokens_match(g, w, tol) for g, w in zip(got_lines, want_lines))


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.rstrip().split("\n")]
    return lines if lines != [""] else []


_INTEGER = re.compile(r"^[+-]?\d+$")


def _canonical_integer(token: str) -> str:
    sign = "-" if token.startswith("-") else ""
    digits = token.lstrip("+-").lstrip("0") or "0"
    return ("" if digits == "0" else sign) + digits


def _tokens_match(got: str, want: str, tol: float) -> bool:
    g, w = got.split(), want.split()
    if len(g) != len(w):
        return False
    for a, b in zip(g, w):
        if a == b:
            continue
        if _INTEGER.match(a) and _INTEGER.match(b):  # exact, however many digits (int() stops at 4300)
            if _canonical_integer(a) != _canonical_integer(b):
                return False
            continue
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        if not math.isclose(x, y, rel_tol=tol, abs_tol=tol):
            return False
    return True


# -- the typing preamble ------------------------------------------------------------------------
# LeetCode-style starters annotate with List, Optional, …, which that judge imports for them.
CALL_PREAMBLE = "from typing import *\n"
TYPING_NAMES = frozenset(typing.__all__)


def typing_preamble(code: str) -> str:
    """CALL_PREAMBLE for a program that names something ``typing`` exports, else nothing.

    Importing ``typing`` takes about 20 ms in the sandbox's interpreter, as long as the rest of a
    trivial program's start, so programs that never name one of its exports skip it.
    Departures: a name reached only through ``eval``, ``globals()`` or a string annotation resolved
    at run time (``get_type_hints``) is not seen; the names are this interpreter's ``typing``
    exports, so a newer sandbox interpreter's additions (``override`` in 3.12) are not either.
    """
    names = {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)}
    return CALL_PREAMBLE if names & TYPING_NAMES else ""
