"""Code domains: hidden-test verification of model-written Python (the JSONL-backed domain is
``domains.code.dataset``).

Three test formats, detected from the fields of each dataset row and normalised into the payload:

* ``humaneval`` — HumanEval as published: ``task_id, prompt, canonical_solution, test, entry_point``.
  The trusted ``check(candidate)`` runs here, in the verifier process, never in the sandbox. Its
  ``candidate`` is a stand-in that forwards each call to the sandboxed program and gets back only
  plain data, wrapped so that ``True == 1`` does not hold (see ``_strict``). The program never sees
  the expected values and cannot hand ``check`` an object whose ``==`` always says yes.
* ``call`` — ``fn_name`` plus input/output pairs (APPS call-based rows, or ``tests: [{input,
  output}]``): each input is an argument list, the return value comes back as plain data and is
  compared here (integers exactly, floats with a tolerance). A LeetCode-style row's entry is a
  method of ``class Solution``; ``typing`` names are imported for code that uses them, as that
  judge does.
* ``stdio`` — ``input_output: {inputs, outputs}`` without ``fn_name`` (APPS / CodeContests): one
  fresh sandbox per case, stdout compared here line by line after stripping trailing space,
  integer tokens exactly and other numbers with a tolerance.

Statuses: ``format_error`` (no code, syntax error, entry point never defined), ``timeout`` (wall clock or CPU), ``error`` (the
program failed to load or its process died), ``sandbox_violation`` (output cap exceeded, or garbage
on the result channel), ``wrong`` (ran, failed a test), ``ok``.

Limits (``sandbox:`` options) apply per sandboxed process: to a whole task for ``call`` and
``humaneval`` (one process answers every call), to each case for ``stdio``. Sandboxed code sees the
standard library only (the interpreter runs with ``-S -I``: no site-packages).

How a completion becomes a program and how outputs are compared: ``domains.code.program``.

Departures from the published harnesses: every ``assert`` that HumanEval's ``check`` reaches counts as
one test (so passed/total and the pass fraction are meaningful; in all-pass mode check stops at the
first failure); a HumanEval check that tests a result with ``is True`` or ``isinstance(..., bool)`` fails,
the price of keeping ``True`` distinct from ``1``.
"""
from __future__ import annotations

import ast
import logging
import time
from typing import Any, Literal

from pydantic import Field, model_validator

from domains.api import FAILURE_STATUSES, Canary, Domain, DomainConfig, Status, Task, VerifyResult
from domains.code.hidden import (SCORED_KEY, TOO_FEW, HiddenTestsConfig, heldout_version, scored_cases, scoring_subset,
                                 with_subset)
from domains.code.canaries import CANARIES
from domains.code.program import assemble, call_output_matches, futures_first, stdout_matches, typing_preamble
from domains.verify.sandbox import SandboxConfig, SandboxProcess, SandboxUnavailable, run_script, self_test
from domains.verify.sandbox_harness import decode_value

log = logging.getLogger("palestra.code")


class CodeConfig(DomainConfig):
    """Options shared by every code domain."""

    verify_timeout_s: float = 60.0  # the pool's hard deadline; the sandbox's own limits act first
    max_new_tokens: int | None = Field(48, gt=0)  # the procedural references are at most 42 characters
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: Literal["all_pass", "fraction"] = "all_pass"
    max_tests: int | None = Field(None, ge=1)  # run at most this many cases per task
    # a rotating subset of the hidden tests scores each training draw (off by default: domains.code.hidden)
    hidden_tests: HiddenTestsConfig = Field(default_factory=HiddenTestsConfig)
    unsafe_no_sandbox: bool = False  # run code WITHOUT isolation (warned about on every call)

    @model_validator(mode="after")
    def _sandbox_ends_first(self) -> "CodeConfig":
        # The pool kills a worker at verify_timeout_s; the sandbox's own clock must act well before,
        # so that every sandbox is killed and reaped by us rather than orphaned.
        if self.sandbox.wall_timeout_s + 1.0 >= self.verify_timeout_s:
            raise ValueError(f"sandbox.wall_timeout_s ({self.sandbox.wall_timeout_s:g}) must be at least 1 s "
                             f"below verify_timeout_s ({self.verify_timeout_s:g})")
        return self


# -- outcomes -------------------------------------------------------------------------------------
class _Outcome:
    """Tally of test cases; the first failure is kept with its input only."""

    def __init__(self, total: int) -> None:
        self.total, self.passed = total, 0
        self.status: Status | None = None  # set when the run itself failed (timeout, crash, ...)
        self.message = ""
        self.first_failure: dict[str, Any] | None = None
        self.judged = True  # False when the tests themselves could not be run (not the program's fault)

    def cannot_judge(self, case_input: Any, why: str) -> None:
        self.fail(case_input, why, Status.ERROR)
        self.judged = False

    def fail(self, case_input: Any, why: str, status: Status = Status.WRONG) -> None:
        if self.first_failure is None:
            self.first_failure = {"input": _short(case_input), "why": why[:300]}
        if status is not Status.WRONG and self.status is None:
            self.status, self.message = status, why

    def result(self, mode: str) -> VerifyResult:
        details = {"passed": self.passed, "total": self.total}
        if self.first_failure:
            details["first_failure"] = self.first_failure
        all_pass = self.total > 0 and self.passed == self.total
        reward = (1.0 if all_pass else 0.0) if mode == "all_pass" else self.passed / max(1, self.total)
        if all_pass:
            return VerifyResult(1.0, True, Status.OK, details)
        if not self.judged:
            return VerifyResult.no_verdict(self.message, **details)
        status = self.status or Status.WRONG
        return VerifyResult(reward, False, status, {**details, "message": self.message[:300]} if self.message else details)


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _process_failure(proc: SandboxProcess, outcome: _Outcome, case_input: Any) -> None:
    """The harness stopped answering: say why, from the process's fate."""
    result = proc.finish()
    if result.timed_out:
        outcome.fail(case_input, "time limit exceeded", Status.TIMEOUT)
    elif result.output_limited:
        outcome.fail(case_input, "output limit exceeded", Status.SANDBOX_VIOLATION)
    else:
        tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        outcome.fail(case_input, f"program exited (code {result.returncode}) {tail[0]}", Status.ERROR)


# -- function-call tests --------------------------------------------------------------------------
class _Caller:
    """One sandboxed module; ``call(args)`` runs the entry point there and returns plain data."""

    def __init__(self, config: CodeConfig, code: str, entry: str) -> None:
        self.proc = SandboxProcess(config.sandbox, {"mode": "call", "code": code, "entry": entry},
                                   unsafe=config.unsafe_no_sandbox)
        self.count = 0
        self.load_error: str | None = None
        hello = self.proc.recv()
        self.ready = self._genuine(hello) and "load" in hello
        if self.ready and hello["load"] is not None:
            self.ready, self.load_error = False, str(hello["load"])[:300]
        self.forged = hello is not None and not self._genuine(hello)

    def _genuine(self, message: dict[str, Any] | None) -> bool:
        return isinstance(message, dict) and message.get("n") == self.proc.nonce

    def call(self, args: list[Any]) -> tuple[str, Any]:
        """('value', v) | ('raised', message) | ('dead' | 'forged' | 'unsendable', None)."""
        index, self.count = self.count, self.count + 1
        try:
            sent = self.proc.send((index, tuple(args), {}))
        except ValueError:  # marshal: an argument that is not plain data (trusted check code's doing)
            return "unsendable", None
        if not sent:
            return "dead", None
        reply = self.proc.recv()
        if reply is None:
            return "dead", None
        if not self._genuine(reply) or reply.get("i") != index or not ({"v", "e"} & reply.keys()):
            return "forged", None
        if "e" in reply:
            return "raised", str(reply["e"])[:300]
        try:
            return "value", decode_value(reply["v"])
        except (ValueError, TypeError, KeyError, RecursionError):
            return "forged", None


def _start(config: CodeConfig, code: str, entry: str, outcome: _Outcome) -> _Caller | None:
    caller = _Caller(config, code, entry)
    if caller.ready:
        return caller
    if caller.forged:
        caller.proc.release()
        outcome.fail(None, "garbage on the result channel", Status.SANDBOX_VIOLATION)
    elif caller.load_error is not None:
        caller.proc.release()  # e.g. lingering threads: reaped in the background, killed at the deadline
        outcome.fail(None, f"program failed to load: {caller.load_error}", Status.ERROR)
    else:
        _process_failure(caller.proc, outcome, None)
    return None


def run_call_tests(config: CodeConfig, code: str, payload: dict[str, Any]) -> _Outcome:
    cases = scored_cases(payload)[: config.max_tests]
    outcome = _Outcome(len(cases))
    program = futures_first(typing_preamble(code) + code)
    caller = _start(config, program, payload["entry_point"], outcome)
    if caller is None:
        return outcome
    for case in cases:
        kind, value = caller.call(case["args"])
        if kind == "dead":
            _process_failure(caller.proc, outcome, case["args"])
            return outcome
        if kind == "unsendable":
            outcome.cannot_judge(case["args"], "test arguments are not plain data")
            break
        if kind == "forged":
            outcome.fail(case["args"], "garbage on the result channel", Status.SANDBOX_VIOLATION)
            break
        if kind == "value" and call_output_matches(value, case["expected"]):
            outcome.passed += 1
            continue
        outcome.fail(case["args"], f"raised {value}" if kind == "raised" else f"returned {_short(value, 100)}")
        if config.reward == "all_pass":
            break
    caller.proc.release()
    return outcome


# -- HumanEval check(candidate) -------------------------------------------------------------------
class _Abort(BaseException):
    """Stops a check() run whatever it catches: the sandboxed program is gone or misbehaved."""


class _StrictInt(int):
    """An int from the sandbox that is not equal to a bool (so returning True for 1 fails)."""

    def __eq__(self, other: object) -> bool:
        return not isinstance(other, (bool, _StrictBool)) and int(self) == other

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = int.__hash__

    def __repr__(self) -> str:
        return int.__repr__(self)


class _StrictBool(int):
    """A bool from the sandbox: truthy like a bool, equal only to bools."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (bool, _StrictBool)) and int(self) == int(other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = int.__hash__

    def __repr__(self) -> str:
        return "True" if self else "False"


def _strict(value: Any) -> Any:
    if isinstance(value, bool):
        return _StrictBool(value)
    if isinstance(value, int):
        return _StrictInt(value)
    if isinstance(value, list):
        return [_strict(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_strict(v) for v in value)
    if isinstance(value, frozenset):
        return set(_strict(v) for v in value)
    if isinstance(value, dict):
        return {_strict(k): _strict(v) for k, v in value.items()}
    return value


def _plain(value: Any) -> Any:
    """``_strict`` undone, for a value check() passes back to the candidate: the channel takes plain data only."""
    if isinstance(value, _StrictBool):
        return bool(value)
    if isinstance(value, _StrictInt):
        return int(value)
    if isinstance(value, (list, tuple, set)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


class _StopCheck(BaseException):
    """First failed assert in all-pass mode: the rest of check() cannot change the reward."""


class _AssertsToRecords(ast.NodeTransformer):
    """``assert test, msg`` → ``__record__(lambda: test)``: every assert check() reaches is one test
    case, so passed/total (and the pass-fraction reward) mean something for HumanEval too."""

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        no_args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[],
                                kwarg=None, defaults=[])
        call = ast.Call(ast.Name("__record__", ast.Load()), [ast.Lambda(no_args, node.test)], [])
        return ast.copy_location(ast.Expr(call), node)


def _instrumented_check(test_code: str) -> Any:
    tree = ast.fix_missing_locations(_AssertsToRecords().visit(ast.parse(test_code)))
    return compile(tree, "<check>", "exec")


def run_humaneval(config: CodeConfig, code: str, payload: dict[str, Any]) -> _Outcome:
    outcome = _Outcome(1)
    caller = _start(config, code, payload["entry_point"], outcome)
    if caller is None:
        return outcome
    outcome.total = 0
    last_args: list[Any] = []

    def last_input() -> Any:
        return last_args[0] if last_args else None

    def candidate(*args: Any) -> Any:
        last_args[:] = [args]
        kind, value = caller.call([_plain(arg) for arg in args])  # check() may pass back what it got
        if kind == "value":
            return _strict(value)
        if kind == "raised":
            raise RuntimeError(f"candidate raised {value}")
        raise _Abort(kind)

    def record(test: Any) -> None:
        outcome.total += 1
        try:
            ok, why = bool(test()), "assertion failed"
        except Exception as exc:  # the candidate raised, or returned something check() chokes on
            ok, why = False, f"{type(exc).__name__}: {exc}"
        if ok:
            outcome.passed += 1
            return
        outcome.fail(last_input(), why)
        if config.reward == "all_pass":
            raise _StopCheck

    namespace: dict[str, Any] = {"__name__": "__check__", "__record__": record}
    try:
        _run_trusted(payload.get("prompt_code", ""), namespace)  # helpers check() may call
        exec(_instrumented_check(payload["test"]), namespace)
        namespace["check"](candidate)
    except _StopCheck:
        pass
    except _Abort as abort:
        outcome.total += 1
        if str(abort) == "dead":
            _process_failure(caller.proc, outcome, last_input())
            return outcome
        if str(abort) == "unsendable":
            outcome.cannot_judge(last_input(), "check() passed arguments that are not plain data")
        else:
            outcome.fail(last_input(), "garbage on the result channel", Status.SANDBOX_VIOLATION)
    except Exception as exc:  # outside any assert: e.g. ``solution = candidate(...)`` raised
        outcome.total += 1
        outcome.fail(last_input(), f"{type(exc).__name__}: {exc}")
    if outcome.total == 0:  # a check() without asserts that ran through: one passed test
        outcome.total = outcome.passed = 1
    caller.proc.release()
    return outcome


def _run_trusted(code: str, namespace: dict[str, Any]) -> None:
    try:
        exec(compile(code, "<prompt>", "exec"), namespace)
    except Exception:  # a prompt that is not runnable on its own only loses its helpers
        pass


# -- stdin/stdout tests ---------------------------------------------------------------------------
def run_stdio_tests(config: CodeConfig, code: str, payload: dict[str, Any]) -> _Outcome:
    cases = scored_cases(payload)[: config.max_tests]
    outcome = _Outcome(len(cases))
    # One sandbox per case: stop before the pool's hard deadline would kill this worker mid-run.
    budget_end = time.monotonic() + config.verify_timeout_s - config.sandbox.wall_timeout_s - 1.0
    for case in cases:
        if time.monotonic() > budget_end:
            outcome.fail(case["input"], "verification time budget used up", Status.TIMEOUT)
            break
        result = run_script(config.sandbox, code, case["input"].encode(), unsafe=config.unsafe_no_sandbox)
        if result.timed_out:
            outcome.fail(case["input"], "time limit exceeded", Status.TIMEOUT)
        elif result.output_limited:
            outcome.fail(case["input"], "output limit exceeded", Status.SANDBOX_VIOLATION)
        elif result.returncode != 0:
            tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            outcome.fail(case["input"], f"exit code {result.returncode}: {tail[0]}")
        elif stdout_matches(result.stdout.decode(errors="replace"), case["output"]):
            outcome.passed += 1
            continue
        else:
            outcome.fail(case["input"], "wrong output")
        if config.reward == "all_pass" or outcome.status in FAILURE_STATUSES:  # a limit was hit: stop
            break
    return outcome


# -- the verifier ---------------------------------------------------------------------------------
RUNNERS = {"call": run_call_tests, "humaneval": run_humaneval, "stdio": run_stdio_tests}


_REFUSALS_LOGGED: set[str] = set()


def verify_code(config: CodeConfig, payload: dict[str, Any], completion: str) -> VerifyResult:
    """Score one completion against the hidden tests in ``payload``; never raises for bad code."""
    if config.unsafe_no_sandbox:
        log.warning("unsafe_no_sandbox is set: running model-written code WITHOUT isolation")
    else:
        try:
            self_test(config.sandbox)
        except SandboxUnavailable as exc:
            if str(exc) not in _REFUSALS_LOGGED:  # every verdict says why; the log says it once per process
                _REFUSALS_LOGGED.add(str(exc))
                log.error("code sandbox unavailable, refusing to score code: %s", exc)
            return VerifyResult.no_verdict(
                f"refusing to score code: {exc} (set unsafe_no_sandbox: true to run it unisolated)"
            )
    code = assemble(completion, payload)
    if not code.strip():
        return VerifyResult.failure(Status.FORMAT_ERROR, "no code in the completion")
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return VerifyResult.failure(Status.FORMAT_ERROR, f"not valid Python: {type(exc).__name__}: {exc}")
    entry = payload.get("entry_point")
    if entry and not _binds(tree, entry):  # early-training junk: no sandbox start needed
        return VerifyResult.failure(Status.FORMAT_ERROR, f"the code does not define {entry!r}")
    result = RUNNERS[payload["format"]](config, code, payload).result(config.reward)
    if SCORED_KEY in payload:  # which tests scored it: `palestra replay` rebuilds the task from this
        result.details[SCORED_KEY] = list(payload[SCORED_KEY])
    if config.unsafe_no_sandbox:
        result.details["unsafe_no_sandbox"] = True
    return result


def _binds(tree: ast.AST, name: str) -> bool:
    """Whether ``name`` is defined anywhere in the module (def, class, assignment, import).

    Departure: a name created only through ``exec`` or ``globals()`` is not seen and the completion
    is called a format error without running it.
    """
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name:
            return True
    return False


class CodeDomain(Domain):
    """Base of the code domains: verification through the sandbox, reference from the payload."""

    Config = CodeConfig
    # 2: the typing import only for programs that name a typing export; 3: check() may pass the
    # candidate's results back to it, and tests that cannot be run give no verdict (not a pass share)
    version = "3"

    def verify(self, task: Task, completion: str) -> VerifyResult:
        return verify_code(self.config, task.payload, completion)

    def reference(self, task: Task) -> str | None:
        return task.payload.get("reference")

    @property
    def rotates(self) -> bool:
        return self.config.hidden_tests.score is not None

    @property
    def counts_draws(self) -> bool:
        return self.rotates and self.config.hidden_tests.rotate == "epoch"

    def drawn(self, task: Task, step: int, visit: int) -> Task:
        hidden = self.config.hidden_tests
        subset = scoring_subset(task, hidden, step if hidden.rotate == "step" else visit)
        TOO_FEW.note(task, hidden)
        return with_subset(task, subset)

    def heldout(self, level: int, n: int, seed: int) -> list[Task]:
        return [heldout_version(t, self.config.hidden_tests) for t in super().heldout(level, n, seed)]

    def canaries(self) -> dict[str, Canary]:
        return CANARIES
