"""No false negatives: every registered domain's references score 1 through the verifier pool.

A reference the verifier rejects teaches the policy that the right answer is wrong. Each domain is
walked level by level; a task whose ``reference`` is None (one any solving answer fits, such as a
Rubik's cube) says it has none and is the only kind skipped. The file-backed domains read small
files: real BFCL v4 rows (tests/data/bfcl) and the code and math rows of their own tests.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from domains.registry import available, load
from domains.verify.pool import VerifierPool
from test_code_domain import CALL_ROW, FAST, HUMANEVAL_ROWS, STDIO_ROW, TESTS_ROW

BFCL_DATA = Path(__file__).parent / "data" / "bfcl"
TASKS_PER_LEVEL = 2


@pytest.fixture(scope="module")
def file_options(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("rows")
    code, math = folder / "code.jsonl", folder / "math.jsonl"
    code.write_text("\n".join(json.dumps(r) for r in HUMANEVAL_ROWS + [STDIO_ROW, CALL_ROW, TESTS_ROW]) + "\n")
    math.write_text("\n".join(json.dumps({"prompt": f"{i}*3=", "answer": str(3 * i), "level": 1 + i % 2})
                              for i in range(12)) + "\n")
    return {"code_dataset": {"path": str(code), **FAST}, "math_dataset": {"path": str(math)},
            "bfcl": {"path": str(BFCL_DATA / "BFCL_v4_sample.json"),
                     "answers_path": str(BFCL_DATA / "possible_answer" / "BFCL_v4_sample.json")}}


def rejected_references(names: list[str], options: dict[str, dict]) -> tuple[list, dict[str, int]]:
    """(every reference that did not score 1, with its domain and verdict; references checked per domain)."""
    domains = {name: load(name, options.get(name)) for name in names}
    items, checked = [], dict.fromkeys(names, 0)
    for name, domain in domains.items():
        for level in domain.levels:
            for task in domain.sample(level, TASKS_PER_LEVEL, random.Random(f"references/{name}/{level}")):
                reference = domain.reference(task)
                if reference is not None:  # the task says it has no reference
                    items.append((task, reference))
                    checked[name] += 1
    with VerifierPool(domains, workers=2) as pool:
        verdicts = pool.verify_many(items)
        pool.raise_if_broken()
    rejected = [(task.domain, task.level, verdict.result.to_json())
                for (task, _), verdict in zip(items, verdicts) if verdict.result.reward != 1.0]
    return rejected, checked


@pytest.mark.sandbox
def test_every_built_in_domain_scores_its_references_one(file_options):
    names = [n for n in available() if not n.startswith("rg_")]
    assert {"arithmetic", "code_functions", "code_lists", "code_dataset", "bfcl", "tool_lookup"} <= set(names)
    rejected, checked = rejected_references(names, file_options)
    assert not rejected
    assert all(checked.values()), checked  # every built-in domain has references


@pytest.mark.slow
def test_every_reasoning_gym_domain_scores_its_references_one():
    names = [n for n in available() if n.startswith("rg_")]
    assert len(names) >= 50, "reasoning-gym is not installed"
    rejected, checked = rejected_references(names, {})
    assert not rejected
    assert sum(checked.values()) > len(names)
