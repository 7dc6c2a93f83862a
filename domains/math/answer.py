"""Final-answer extraction and comparison for math domains, built on math-verify.

``grade_answer(completion, gold, config)`` turns a model completion into a VerifyResult:

1. Answer region: only the text after the last ``</think>`` is graded, so reasoning cannot leak an
   answer. A ``<think>`` that is never closed means the model ran out of room before answering:
   ``format_error``.
2. Extraction: every ``\\boxed{...}`` (and ``\\fbox{...}``) in the region, found with a brace
   matcher of our own so nested braces such as ``\\boxed{\\frac{1}{2}}`` come out whole. The last
   box is the answer. Several boxes that disagree are hedging and score 0 (``wrong``).
3. Comparison: gold and prediction are parsed by math-verify (gold once per gold string, cached)
   and compared symbolically and numerically by ``math_verify.verify``.

Where this departs from math-verify's defaults, and why:

- math-verify reads several boxed answers as a set (``\\boxed{1}, \\boxed{2}`` equals ``{1, 2}``).
  Here only a single box is graded; a set answer must be written in one box
  (``\\boxed{1, 2}``). Otherwise a policy could hedge by boxing every candidate it thinks of.
- By default (``require_boxed``) text without a box is a ``format_error``; math-verify would fall
  back to the last number or expression anywhere in the text, which an RL policy learns to game by
  scattering numbers. ``require_boxed=False`` restores the library's extraction for such text.
- ``require_simplified`` (off by default, as in math-verify) additionally rejects answers that
  merely restate an unevaluated expression (``\\boxed{1+1}`` for 2) or an unreduced fraction
  (``\\boxed{2/4}``). The test is structural: the prediction may not carry more operations than
  the gold (sympy's ``count_ops``), and written fractions must be in lowest terms. It cannot spot
  every unsimplified form (``\\sqrt{8}`` for ``2\\sqrt{2}`` passes).
- math-verify's own timeouts use ``signal.alarm``, which only works in the main thread. They are
  used there (the verifier pool runs verifiers in its workers' main threads) and disabled
  elsewhere; the pool's hard deadline in the parent is the real guard either way. A math-verify
  timeout is reported as ``status=timeout`` instead of the library's silent ``False``.
- Boxed answers longer than ``max_answer_chars`` are a ``format_error`` before sympy sees them.
"""
from __future__ import annotations

import functools
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from domains.api import Canary, Domain, DomainConfig, Status, Task, VerifyResult
from domains.math.canaries import math_canaries

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
BOX_MACROS = ("\\boxed", "\\fbox")
# what a chat-style math prompt asks for: the verifier reads the last \boxed{} of the answer
BOX_REQUEST = "Put your final answer in \\boxed{}."
MAX_HEDGE_CANDIDATES = 8  # more distinct boxes than this is hedging without asking sympy
DETAIL_CHARS = 200  # answers are stored in the results table; keep the rows small


class MathConfig(DomainConfig):
    """Options shared by every domain graded with ``grade_answer``."""

    require_boxed: bool = True
    require_simplified: bool = False
    max_answer_chars: int | None = Field(default=1000, gt=0)  # None: no limit
    sympy_timeout_s: int = Field(default=5, ge=1)  # math-verify's own alarm, main thread only


@dataclass(frozen=True)
class Extraction:
    """What ``extract_final_answer`` found: the answer to grade, or why there is none."""

    answer: str | None  # content of the last box; None when nothing was boxed
    candidates: tuple[str, ...] = ()  # distinct box contents, in order of appearance
    region: str = ""  # the graded text (after </think>)
    error: str | None = None  # set when the completion is malformed


# -- extraction -------------------------------------------------------------------------------------
def answer_region(completion: str) -> str | None:
    """The text after the last ``</think>``; None when a ``<think>`` was opened but never closed."""
    if THINK_CLOSE in completion:
        return completion.rsplit(THINK_CLOSE, 1)[1]
    if THINK_OPEN in completion:
        return None
    return completion


def _match_braces(text: str, open_index: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_index``; escaped braces do not count."""
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # skip the escaped character: \{ and \} are literal braces in LaTeX
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def braces_balanced(text: str) -> bool:
    """True when every unescaped ``{`` has its ``}``."""
    depth, i = 0, 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return False
        i += 1
    return depth == 0


def find_boxed(text: str) -> tuple[list[str], bool]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in order, and whether one was unclosed."""
    pattern = "|".join(re.escape(macro) for macro in BOX_MACROS)
    contents: list[str] = []
    resume = 0  # a box nested inside the previous one is part of that answer, not another answer
    for match in re.finditer(rf"(?:{pattern})(?![A-Za-z])\s*", text):
        start = match.end()
        if match.start() < resume or start >= len(text) or text[start] != "{":
            continue  # nested, or "\boxed" used as a word rather than as a macro with an argument
        end = _match_braces(text, start)
        if end is None:
            return contents, True
        contents.append(text[start + 1:end].strip())
        resume = end
    return contents, False


def _canonical(answer: str) -> str:
    return re.sub(r"\s+", "", answer)


def extract_final_answer(completion: str, require_boxed: bool = True) -> Extraction:
    """Pick the answer to grade from a completion (see the module docstring for the rules)."""
    region = answer_region(completion)
    if region is None:
        return Extraction(None, error="reasoning was opened with <think> but never closed")
    boxes, unclosed = find_boxed(region)
    if unclosed:
        return Extraction(None, region=region, error="unbalanced braces in \\boxed{...}")
    filled = [box for box in boxes if box]
    if boxes and not filled:
        return Extraction(None, region=region, error="empty \\boxed{}")
    if not filled:
        if require_boxed:
            return Extraction(None, region=region, error="no \\boxed{} answer")
        return Extraction(None, region=region)  # the caller falls back to math-verify's search
    distinct: dict[str, str] = {}  # whitespace-free form -> first spelling seen
    for box in filled:
        distinct.setdefault(_canonical(box), box)
    return Extraction(filled[-1], candidates=tuple(distinct.values()), region=region)


# -- parsing and comparison -----------------------------------------------------------------------------
def _alarm_seconds(seconds: int) -> int | None:
    """math-verify's timeout, only where signal.alarm works (the main thread)."""
    return seconds if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, timeout_s: int | None, boxed_only: bool) -> tuple[Any, ...]:
    """math-verify's parse; TimeoutException propagates, other errors mean 'nothing parsed'."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    targets = [LatexExtractionConfig(boxed_match_priority=0)]
    if not boxed_only:
        targets.append(ExprExtractionConfig())
    start = time.monotonic()
    try:
        parsed = tuple(parse(text, extraction_config=targets, parsing_timeout=timeout_s, raise_on_error=True))
    except Exception:  # TimeoutException is a BaseException and is not caught here
        parsed = ()
    _raise_if_outlived(start, timeout_s)
    return parsed


def _raise_if_outlived(start: float, timeout_s: int | None) -> None:
    """A math-verify call that outlived its alarm was interrupted, even when it returned: the
    TimeoutException lands wherever the signal finds the parser, sometimes inside a handler that
    swallows it and lets a half-done result through."""
    from math_verify.errors import TimeoutException

    if timeout_s is not None and time.monotonic() - start >= timeout_s:
        raise TimeoutException(f"outlived its {timeout_s}s alarm")


def _boxed(answer: str) -> str:
    return "\\boxed{" + answer + "}"


@functools.lru_cache(maxsize=65536)
def parse_gold(gold: str, timeout_s: int | None = None) -> tuple[Any, ...]:
    """Parsed gold answer, cached per gold string (a step grades G completions per gold)."""
    text = gold.strip()
    if len(text) >= 2 and text[0] == text[-1] == "$":
        text = text.strip("$")
    return _parse(text if "\\boxed" in text else _boxed(text), timeout_s, boxed_only=False)


def answers_match(gold: tuple[Any, ...], pred: tuple[Any, ...], timeout_s: int | None) -> bool:
    """True if any parsed form of the prediction equals any parsed form of the gold.

    Pairs are compared one by one so that an exception in one comparison (math-verify's default
    would swallow it and return False for every pair) still lets the others decide.
    """
    from math_verify import verify

    for g in gold:
        for p in pred:
            start = time.monotonic()
            try:
                equal = verify(g, p, timeout_seconds=timeout_s, raise_on_error=True)
            except Exception:
                equal = False
            _raise_if_outlived(start, timeout_s)
            if equal:
                return True
    return False


_FRACTION = re.compile(r"^[-+]?(?:\\[dt]?frac\{[-+]?(\d+)\}\{[-+]?(\d+)\}|\(?[-+]?(\d+)\)?/\(?[-+]?(\d+)\)?)$")


def _fraction_reduced(answer: str) -> bool:
    match = _FRACTION.match(_canonical(answer))
    if match is None:
        return True  # not a written fraction: nothing to reduce
    try:
        num, den = (int(x) for x in (match.group(1) or match.group(3), match.group(2) or match.group(4)))
    except ValueError:  # more digits than Python converts (only without max_answer_chars)
        return True
    return den > 1 and math.gcd(num, den) == 1


def _first_expr(parsed: tuple[Any, ...]) -> Any:
    """The first sympy object of a parse, with an assignment ``x = 3`` reduced to its value."""
    from sympy import Basic, Eq, Symbol

    expr = next((p for p in parsed if isinstance(p, Basic)), None)
    if isinstance(expr, Eq) and isinstance(expr.lhs, Symbol):
        return expr.rhs
    return expr


def is_simplified(answer: str, pred: tuple[Any, ...], gold: tuple[Any, ...]) -> bool:
    """Heuristic: a reduced written fraction with no more sympy operations than the gold."""
    from sympy import count_ops

    if not _fraction_reduced(answer.rpartition("=")[2]):
        return False
    pred_expr, gold_expr = _first_expr(pred), _first_expr(gold)
    if pred_expr is None or gold_expr is None:
        return True  # string answers: nothing to simplify
    try:
        return count_ops(pred_expr) <= count_ops(gold_expr)
    except Exception:  # an expression sympy cannot count: do not punish what we cannot judge
        return True


# -- grading ----------------------------------------------------------------------------------------------
def _result(correct: bool, **details: Any) -> VerifyResult:
    status = Status.OK if correct else Status.WRONG
    return VerifyResult(reward=1.0 if correct else 0.0, correct=correct, status=status, details=details)


def _is_hedge(found: Extraction, final: tuple[Any, ...], timeout_s: int | None) -> bool:
    """Several different boxes are a hedge unless every one of them equals the final answer."""
    if len(found.candidates) <= 1:
        return False
    if len(found.candidates) > MAX_HEDGE_CANDIDATES:
        return True
    final_key = _canonical(found.answer or "")
    for other in found.candidates:
        if _canonical(other) == final_key:
            continue
        parsed = _parse(_boxed(other), timeout_s, boxed_only=True)
        if not parsed or not answers_match(final, parsed, timeout_s):
            return True
    return False


def grade_answer(completion: str, gold: str, config: MathConfig | None = None) -> VerifyResult:
    """Score one completion against a gold answer string. Never raises on model output."""
    from math_verify.errors import TimeoutException

    config = config or MathConfig()
    timeout_s = _alarm_seconds(config.sympy_timeout_s)
    found = extract_final_answer(completion, config.require_boxed)
    if found.error:
        return VerifyResult.failure(Status.FORMAT_ERROR, found.error)
    if found.answer is not None and config.max_answer_chars is not None and len(found.answer) > config.max_answer_chars:
        return VerifyResult.failure(Status.FORMAT_ERROR, f"answer longer than {config.max_answer_chars} characters")
    try:
        return _grade_extracted(found, gold, config, timeout_s)
    except TimeoutException:
        return VerifyResult.failure(Status.TIMEOUT, f"math-verify gave up after {config.sympy_timeout_s}s")


def _grade_extracted(found: Extraction, gold: str, config: MathConfig, timeout_s: int | None) -> VerifyResult:
    gold_parsed = parse_gold(gold, timeout_s) if braces_balanced(gold) else ()
    if not gold_parsed:  # the data is broken, not the model: an error, counted apart from wrong
        return VerifyResult.no_verdict(f"gold answer {gold[:DETAIL_CHARS]!r} could not be parsed")
    if found.answer is None:  # require_boxed=False and no box: math-verify's own extraction
        pred = _parse(found.region, timeout_s, boxed_only=False)
        answer_text = str(pred[-1]) if pred else ""
    else:
        pred = _parse(_boxed(found.answer), timeout_s, boxed_only=True)
        answer_text = found.answer
    if not pred:
        return VerifyResult.failure(Status.FORMAT_ERROR, "answer could not be parsed")
    details: dict[str, Any] = {"answer": answer_text[:DETAIL_CHARS]}
    if _is_hedge(found, pred, timeout_s):
        return _result(False, **details, hedged=True, boxes=len(found.candidates))
    if not answers_match(gold_parsed, pred, timeout_s):
        return _result(False, **details)
    if config.require_simplified and not is_simplified(answer_text, pred, gold_parsed):
        return _result(False, **details, unsimplified=True)
    return _result(True, **details)


class MathAnswerDomain(Domain):
    """Base for domains whose tasks carry a gold answer string in ``payload['answer']``."""

    Config = MathConfig

    def verify(self, task: Task, completion: str) -> VerifyResult:
        return grade_answer(completion, str(task.payload["answer"]), self.config)  # type: ignore[arg-type]

    def reference(self, task: Task) -> str | None:
        """The task's worked solution when it has one (``meta['solution']``), else the boxed answer."""
        return task.meta.get("solution") or _boxed(str(task.payload["answer"]))

    def canaries(self) -> dict[str, Canary]:
        return math_canaries(self.config.require_boxed)  # type: ignore[attr-defined]

    def warm_up(self) -> None:
        # importing math-verify pulls in sympy and its LaTeX grammar: seconds on a busy machine,
        # which a first verification would otherwise pay out of its deadline
        _parse(r"\boxed{1}", _alarm_seconds(self.config.sympy_timeout_s), boxed_only=True)
