"""Canaries: every built-in canary scores 0 through the real verifier pool (the code ones in the
real sandbox), a weakened verifier is caught, and ``palestra verify --canaries`` says so."""
import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from curriculum.cli import main as cli
from domains.canaries import canary_alarms, run_canaries
from domains.registry import load_all
from domains.verify.pool import VerifierPool

sys.path.insert(0, str(Path(__file__).parent))  # spawned verifier workers import weak_verifier from here

MATH_AND_TOOLS = ["arithmetic", "linear_equations", "fractions", "tool_calculator", "tool_kv_store", "tool_lookup"]
CODE = ["code_functions", "code_lists"]


def _check(names: list[str], per_level: int, **options) -> dict[str, set[str]]:
    """Run the domains' canaries; assert none earned reward, raised or went unjudged; return the
    canaries that applied to each domain's tasks."""
    domains = load_all(names, options or None)
    with VerifierPool(domains, workers=2) as pool:
        results = run_canaries(domains, pool, per_level, seed=1234)
    assert results and canary_alarms(results) == []
    assert [r for r in results if r.paid or r.status == "canary_error" or not r.scored] == []
    applied: dict[str, set[str]] = defaultdict(set)
    for result in results:
        applied[result.domain].add(result.canary)
    return applied


def test_every_math_and_tool_canary_scores_0_and_each_domain_has_at_least_five():
    applied = _check(MATH_AND_TOOLS, per_level=2)
    assert {name: len(found) >= 5 for name, found in applied.items()} == {name: True for name in MATH_AND_TOOLS}
    # a canary that keeps the right answer applies only where the state it leaves is wrong
    assert "answer_without_calls" in applied["tool_kv_store"] and "answer_without_calls" not in applied["tool_calculator"]


@pytest.mark.sandbox
def test_the_code_canaries_score_0_in_the_sandbox_at_the_first_level():
    domains = load_all(["code_functions"], {"code_functions": {}})
    first_level = {"code_functions": _only_level(domains["code_functions"], 1)}
    with VerifierPool(first_level, workers=2) as pool:
        results = run_canaries(first_level, pool, 1, seed=1234)
    assert len({r.canary for r in results}) >= 5 and not any(r.paid or not r.scored for r in results)
    # the harness's own verdicts: leaving early is an error and the busy loop a timeout, never a pass
    statuses = {r.canary: r.status for r in results}
    assert statuses["exit_at_import"] == statuses["exit_in_call"] == "error" and statuses["busy_loop"] == "timeout"


@pytest.mark.slow
def test_every_code_canary_scores_0_at_every_level():
    applied = _check(CODE, per_level=2)
    assert all(len(found) >= 5 for found in applied.values())


@pytest.mark.slow
def test_the_reasoning_gym_canaries_score_0_without_partial_credit():
    pytest.importorskip("reasoning_gym")
    _check(["rg_chain_sum", "rg_word_sorting", "rg_rubiks_cube"], per_level=1, **{"rg_*": {"partial_credit": False}})


def test_a_weakened_verifier_is_caught_by_name():
    domains = load_all(["weak_verifier:WEAK_ARITHMETIC"])
    with VerifierPool(domains, workers=1) as pool:
        alarms = canary_alarms(run_canaries(domains, pool, 1, seed=1234))
    named = {alarm.split("'")[1] for alarm in alarms}
    assert {"several_boxes", "unboxed_answer", "answer_in_thinking"} <= named
    assert all(" of weak_arithmetic earned reward 1.00 " in alarm for alarm in alarms)


def test_palestra_verify_canaries_exits_1_on_a_reward_and_0_when_none(capsys):
    assert cli(["verify", "--domain", "arithmetic", "--canaries", "--tasks-per-level", "1", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert len(lines) == 5 * 7 and not any(line["paid"] for line in lines)
    assert "arithmetic: 35 canary completions (7 canaries: " in captured.err and "0 earned reward" in captured.err
    assert cli(["verify", "--domain", "weak_verifier:WEAK_ARITHMETIC", "--canaries", "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert "error: canary 'unboxed_answer' of weak_arithmetic earned reward 1.00" in err


def test_palestra_verify_canaries_of_a_domain_without_any_is_a_one_line_error(capsys):
    assert cli(["verify", "--domain", "weak_verifier:NO_CANARIES", "--canaries"]) == 2
    assert capsys.readouterr().err == "error: domain 'plain_digits' names no canaries (Domain.canaries)\n"


def _only_level(domain, level):
    clone = domain.configure({})
    clone.levels = (level,)
    return clone


def test_a_canary_that_raises_is_reported_and_fails_the_check(capsys):
    assert cli(["verify", "--domain", "weak_verifier:BROKEN_CANARY", "--canaries", "--workers", "1"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {(r["canary"], r["status"], r["message"]) for r in lines} == {
        ("boom", "canary_error", "ZeroDivisionError: division by zero")}
    assert len(lines) == 2  # the two held-out tasks of its one level


@pytest.mark.sandbox
def test_the_code_canaries_score_0_on_humaneval_apps_and_stdio_rows(tmp_path):
    """Dataset rows as published: HumanEval's check() (where an always-equal object would pass a
    naive harness), APPS call-based and stdin/stdout rows."""
    from test_code_domain import CALL_ROW, FAST, HUMANEVAL_ROWS, STDIO_ROW, TESTS_ROW

    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in HUMANEVAL_ROWS + [STDIO_ROW, CALL_ROW, TESTS_ROW]) + "\n")
    domains = load_all(["code_dataset"], {"code_dataset": {"path": str(path), **FAST}})
    with VerifierPool(domains, workers=2) as pool:
        results = run_canaries(domains, pool, 5, seed=1234)
    assert len({r.task_id for r in results}) >= 3 and not any(r.paid or not r.scored for r in results)
    assert {r.canary for r in results} >= {"always_equal", "print_expected", "read_tests", "exit_in_call"}
