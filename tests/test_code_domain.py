"""Code domains: completion extraction, test formats, comparison rules, dataset loading, the
procedural families, registration and parallel verification through the pool."""
from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys

import pytest

from domains import registry
from domains.api import Status
from domains.code.dataset import CodeDatasetDomain, detect_format
from domains.code.generated import INT_TEMPLATES, LIST_TEMPLATES, IntFunctionsDomain, ListFunctionsDomain
from domains.code.program import CALL_PREAMBLE, assemble, extract_code, stdout_matches, typing_preamble, values_match
from domains.verify.pool import VerifierPool

FAST = {"sandbox": {"wall_timeout_s": 2.0, "cpu_s": 1}}

# Rows in HumanEval's published shape (written for these tests). The second needs a helper that
# only the prompt defines, as HumanEval/38 does; the third returns a tuple.
HUMANEVAL_ROWS = [
    {
        "task_id": "Test/0",
        "prompt": "from typing import List\n\n\ndef has_close(numbers: List[float], threshold: float) -> bool:\n"
                  '    """True if two numbers are closer than threshold."""\n',
        "canonical_solution": "    for i, a in enumerate(numbers):\n        for b in numbers[i + 1:]:\n"
                              "            if abs(a - b) < threshold:\n                return True\n    return False\n",
        "test": "\n\nMETADATA = {'author': 'x'}\n\n\ndef check(candidate):\n"
                "    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3) == True\n"
                "    assert candidate([1.0, 2.0, 3.0], 0.5) == False\n    assert not candidate([], 1.0)\n",
        "entry_point": "has_close",
    },
    {
        "task_id": "Test/1",
        "prompt": "def encode_shift(s: str):\n    return ''.join(chr((ord(c) - 97 + 5) % 26 + 97) for c in s)\n\n\n"
                  'def decode_shift(s: str):\n    """Inverse of encode_shift."""\n',
        "canonical_solution": "    return ''.join(chr((ord(c) - 97 - 5) % 26 + 97) for c in s)\n",
        "test": "def check(candidate):\n    import random, string\n    rng = random.Random(3)\n"
                "    for _ in range(20):\n        s = ''.join(rng.choice(string.ascii_lowercase) for _ in range(12))\n"
                "        assert candidate(encode_shift(s)) == s\n",
        "entry_point": "decode_shift",
    },
    {
        "task_id": "Test/2",
        "prompt": 'def sum_product(numbers):\n    """(sum, product) of a list of ints."""\n',
        "canonical_solution": "    s, p = 0, 1\n    for n in numbers:\n        s += n\n        p *= n\n    return s, p\n",
        "test": "def check(candidate):\n    assert candidate([]) == (0, 1)\n    assert candidate([1, 2, 4]) == (7, 8)\n"
                "    assert abs(candidate([2])[0] - 2.0) < 1e-9\n",
        "entry_point": "sum_product",
    },
]

STDIO_ROW = {  # APPS style: input_output and solutions are JSON strings
    "problem_id": 7, "difficulty": "interview", "question": "Print the sum of two numbers and their mean.",
    "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n1.5\n", "7\n3.5\n"]}),
    "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a + b)\nprint((a + b) / 2)\n"]),
}
CALL_ROW = {  # APPS call-based: outputs wrapped in one-element lists
    "problem_id": 8, "difficulty": "introductory", "question": "Return the list doubled.",
    "input_output": {"fn_name": "double", "inputs": [[[1, 2]], [[]]], "outputs": [[[2, 4]], [[]]]},
    "solutions": ["def double(a):\n    return [2 * x for x in a]\n"],
}
TESTS_ROW = {"fn_name": "add", "tests": [{"input": [1, 2], "output": 3}, {"input": [5, 5], "output": 10}],
             "prompt": "def add(a, b): add them", "solution": "def add(a, b):\n    return a + b\n", "level": 2}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> CodeDatasetDomain:
    path = tmp_path_factory.mktemp("code") / "tasks.jsonl"
    rows = HUMANEVAL_ROWS + [STDIO_ROW, CALL_ROW, TESTS_ROW]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return registry.load("code_dataset", {"path": str(path), **FAST})


# -- completions → programs -----------------------------------------------------------------------
@pytest.mark.parametrize("completion, code", [
    ("Here:\n```python\ndef f(x):\n    return 1\n```\nDone.", "def f(x):\n    return 1"),
    ("```\nprint(1)\n```", "print(1)"),
    ("```js\nx\n```\n```py\nprint(2)\n```", "print(2)"),
    ("def f(x):\n return 1\n", "def f(x):\n return 1"),
    ("```python\ndef f(x):\n    return 3\n", "def f(x):\n    return 3"),  # unterminated fence
])
def test_extract_code(completion, code):
    assert extract_code(completion) == code


def test_a_complete_prompt_runs_before_the_completion_and_an_incomplete_starter_only_when_continued():
    payload = {"entry_point": "g", "prompt_code": "import math\n\n\ndef g(x):\n    '''doc'''\n"}
    assert assemble("    return x\n", payload) == "import math\n\n\ndef g(x):\n    '''doc'''\n    return x"
    # a whole function still gets the prompt's imports; its definition replaces the prompt's
    assert assemble("```python\ndef g(x):\n    return 2\n```", payload) == (
        "import math\n\n\ndef g(x):\n    '''doc'''\n\n\ndef g(x):\n    return 2")
    starter = {"entry_point": "f", "prompt_code": "class Solution:\n    def f(self, a):\n        "}
    assert assemble("return a\n", starter) == "class Solution:\n    def f(self, a):\n        return a"
    whole = "class Solution:\n    def f(self, a):\n        return a"
    assert assemble(whole, starter) == whole  # the stub alone would not compile


@pytest.mark.sandbox
def test_humaneval_full_function_may_use_the_prompts_imports(dataset):
    task = dataset.tasks[0]  # its signature uses List, imported by the prompt only
    full = ("```python\ndef has_close(numbers: List[float], threshold: float) -> bool:\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")
    assert dataset.verify(task, full).status is Status.OK


def test_only_programs_that_name_a_typing_export_get_the_typing_import():
    assert typing_preamble("def f(a: List[int]) -> Optional[int]:\n    return None\n") == CALL_PREAMBLE
    assert typing_preamble("def f(x):\n    return Counter(x)\n") == CALL_PREAMBLE  # typing exports it too
    assert typing_preamble("def f(x):\n    return 'List' + x.Dict\n") == ""  # a string and an attribute


@pytest.mark.sandbox
def test_leetcode_style_rows_call_the_method_of_solution(tmp_path):
    starter = "class Solution:\n    def twoSum(self, nums: List[int], t: int) -> List[int]:\n        "
    row = {"question": "two sum", "starter_code": starter,
           "input_output": {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9], [[3, 3], 6]],
                            "outputs": [[0, 1], [0, 1]]}}
    path = tmp_path / "leetcode.jsonl"
    path.write_text(json.dumps(row) + "\n")
    domain = registry.load("code_dataset", {"path": str(path), **FAST})
    [task] = domain.tasks
    body = ("seen = {}\n        for i, x in enumerate(nums):\n            if t - x in seen:\n"
            "                return [seen[t - x], i]\n            seen[x] = i\n")
    assert domain.verify(task, body).status is Status.OK  # continues the starter
    assert domain.verify(task, "```python\n" + starter + body + "```").status is Status.OK  # repeats it
    wrong = "```python\nclass Solution:\n    def twoSum(self, nums, t):\n        return [1, 0]\n```"
    assert domain.verify(task, wrong).status is Status.WRONG


# -- comparisons ----------------------------------------------------------------------------------
@pytest.mark.parametrize("got, expected, same", [
    (1, 1, True), (True, 1, False), (1, True, False), (False, False, True), (0.1 + 0.2, 0.3, True),
    (2, 2.0, True), ((1, 2), [1, 2], True), ([1, [2]], [1, (2,)], True), (float("nan"), 1.0, False),
    ({1: "a"}, {"1": "a"}, True), ({"a": 1}, {"a": True}, False), ("1", 1, False), (None, 0, False),
    (10**9 + 8, 10**9 + 7, False), (2**70 + 1, 2**70, False), (2**70, 2**70, True),  # integers are exact
])
def test_values_match(got, expected, same):
    assert values_match(got, expected) is same


@pytest.mark.parametrize("got, want, same", [
    ("3\n1.5\n", "3\n1.5", True), ("3  \n1.5000000001\n\n", "3\n1.5\n", True), ("3\n", "3\n1.5\n", False),
    ("1 2", "1  2", True), ("yes", "Yes", False), ("", "", True), ("0.3001", "0.3", False), ("1e-9", "0", True),
    ("999999000 5", "999999999 5", False), ("1000000008", "1000000007", False), ("007", "7", True),
    ("1" * 5000, "2" * 5000, False), ("-0", "0", True),  # past int()'s 4300 digits, still exact
])
def test_stdout_matches(got, want, same):
    assert stdout_matches(got, want) is same


# -- formats --------------------------------------------------------------------------------------
def test_formats_are_detected_from_the_row_fields():
    assert [detect_format(r) for r in HUMANEVAL_ROWS] == ["humaneval"] * 3
    assert (detect_format(STDIO_ROW), detect_format(CALL_ROW), detect_format(TESTS_ROW)) == ("stdio", "call", "call")
    with pytest.raises(ValueError, match="unrecognised"):
        detect_format({"question": "?"})


def test_dataset_loads_rows_levels_and_references(dataset):
    assert len(dataset.tasks) == 6 and dataset.levels == (1, 2)
    formats = [t.payload["format"] for t in dataset.tasks]
    assert formats == ["humaneval"] * 3 + ["stdio", "call", "call"]
    for task in dataset.tasks:
        assert dataset.reference(task), task.meta
        assert "expected" not in json.dumps(task.prompt) and "check(" not in json.dumps(task.prompt)
    assert len({t.id for t in dataset.tasks}) == 6
    sample = dataset.sample(2, 3, random.Random(0))
    assert all(t.level == 2 for t in sample)


@pytest.mark.sandbox
def test_every_reference_passes_and_a_wrong_answer_fails(dataset):
    for task in dataset.tasks:
        good = dataset.verify(task, dataset.reference(task))
        assert (good.status, good.reward, good.correct) == (Status.OK, 1.0, True), (task.meta, good)
        bad = dataset.verify(task, "```python\nimport sys\nprint(0)\ndef has_close(*a): return None\n"
                                   "def decode_shift(s): return s\ndef sum_product(n): return (0, 0)\n"
                                   "def double(a): return a\ndef add(a, b): return a - b\n```")
        assert bad.reward == 0.0 and bad.status is Status.WRONG, (task.meta, bad)
        assert "first_failure" in bad.details and bad.details["passed"] < bad.details["total"]


@pytest.mark.sandbox
def test_humaneval_accepts_a_full_function_in_a_fence(dataset):
    task = dataset.tasks[2]
    full = "```python\ndef sum_product(numbers):\n    import math\n    return sum(numbers), math.prod(numbers)\n```"
    assert dataset.verify(task, full).reward == 1.0


@pytest.mark.sandbox
def test_humaneval_counts_every_assert_check_reaches(dataset):
    loop = dataset.verify(dataset.tasks[1], HUMANEVAL_ROWS[1]["canonical_solution"])
    assert (loop.reward, loop.details["passed"], loop.details["total"]) == (1.0, 20, 20)
    fraction = dataset.configure({"reward": "fraction"})
    # right for [] and [2] but not for [1, 2, 4] (product 1 instead of 8): 2 of 3 asserts
    result = fraction.verify(dataset.tasks[2], "    return sum(numbers), 1\n")
    assert (result.details["passed"], result.details["total"]) == (2, 3)
    assert result.reward == pytest.approx(2 / 3) and result.status is Status.WRONG
    assert result.details["first_failure"]["input"] == "([1, 2, 4],)"
    stop_early = dataset.verify(dataset.tasks[2], "    return sum(numbers), 1\n")  # all-pass mode
    assert (stop_early.reward, stop_early.details["passed"], stop_early.details["total"]) == (0.0, 1, 2)


@pytest.mark.sandbox
def test_first_failure_shows_the_input_but_never_the_expected_value(dataset):
    task = dataset.tasks[5]  # add(a, b) → a + b
    result = dataset.verify(task, "def add(a, b):\n    return 999")
    assert result.details["first_failure"]["input"] == "[1, 2]"
    assert "3" not in json.dumps(result.details)


@pytest.mark.sandbox
def test_pass_fraction_option(dataset):
    fraction = dataset.configure({"reward": "fraction"})
    task = dataset.tasks[5]
    result = fraction.verify(task, "def add(a, b):\n    return 3")  # right for (1, 2) only
    assert result.reward == pytest.approx(0.5) and not result.correct and result.details["passed"] == 1


@pytest.mark.sandbox
def test_format_errors(dataset):
    task = dataset.tasks[5]
    assert dataset.verify(task, "").status is Status.FORMAT_ERROR
    assert dataset.verify(task, "```python\ndef add(a, b)\n    return a+b\n```").status is Status.FORMAT_ERROR


@pytest.mark.sandbox
def test_missing_entry_point_is_a_format_error_found_without_running(dataset):
    result = dataset.verify(dataset.tasks[5], "def plus(a, b):\n    return a + b")
    assert result.status is Status.FORMAT_ERROR and "'add'" in result.details["message"]
    for defined in ("add = lambda a, b: a + b", "from operator import add", "if True:\n    def add(a, b): return a + b"):
        assert dataset.verify(dataset.tasks[5], defined).reward == 1.0, defined


@pytest.mark.sandbox
def test_entry_point_bound_only_at_run_time_fails_to_load(dataset):
    result = dataset.verify(dataset.tasks[5], "add = 1\ndel add")
    assert result.status is Status.ERROR and "add" in result.details["message"]


def test_task_from_json_takes_task_json_raw_rows_and_task_ids(dataset):
    humaneval = dataset.tasks[0]
    assert dataset.task_from_json(humaneval.to_json()) == humaneval
    assert dataset.task_from_json(HUMANEVAL_ROWS[0]).id == humaneval.id
    assert dataset.task_from_json({"task_id": "Test/1"}).id == dataset.tasks[1].id


@pytest.mark.sandbox
def test_palestra_verify_scores_humaneval_rows(tmp_path):
    """``palestra verify --domain code_dataset --input FILE.jsonl`` on HumanEval rows, no flags."""
    row = HUMANEVAL_ROWS[2]
    lines = [{"task": row, "completion": row["canonical_solution"]}, {"task": row, "completion": "    return 0\n"}]
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    out = subprocess.run([sys.executable, "-c", "import sys; from curriculum.cli import main; sys.exit(main())",
                          "verify", "--domain", "code_dataset", "--input", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["status"], r["reward"]) for r in results] == [("ok", 1.0), ("wrong", 0.0)]


@pytest.mark.sandbox
def test_stdio_cases_stop_at_the_time_budget(dataset):
    """Many slow cases must not run into the pool's hard deadline: stop early, call it a timeout."""
    slow = dataset.configure({"verify_timeout_s": 3.5})  # budget: 3.5 - 2 (wall) - 1 = 0.5 s
    row = {"input_output": {"inputs": ["1\n"] * 5, "outputs": ["1\n"] * 5}}
    result = slow.verify(slow.task_from_row(row), "import time\ntime.sleep(0.6)\nprint(input())")
    assert result.status is Status.TIMEOUT and result.details["passed"] == 1
    assert "budget" in result.details["message"]


@pytest.mark.sandbox
def test_check_code_with_unsendable_arguments_is_an_error(dataset):
    row = {**HUMANEVAL_ROWS[2], "test": "def check(candidate):\n    assert candidate(lambda: 1) == 1\n"}
    result = dataset.verify(dataset.task_from_row(row), HUMANEVAL_ROWS[2]["canonical_solution"])
    assert result.status is Status.ERROR and "not plain data" in result.details["message"]
    assert not result.scored  # the test could not be run: no verdict on the solution


@pytest.mark.sandbox
def test_check_code_may_pass_the_candidates_results_back_to_it(dataset):
    # what the candidate returns is wrapped (1 == True must not hold); passed back, it travels plain
    row = {"task_id": "Test/back", "prompt": "def step(x):\n", "canonical_solution": "    return x + 1\n",
           "test": "def check(candidate):\n    assert candidate(candidate(1)) == 3\n"
                   "    assert candidate([candidate(0)][0]) == 2\n",
           "entry_point": "step"}
    result = dataset.verify(dataset.task_from_row(row), row["canonical_solution"])
    assert (result.reward, result.status, result.details["passed"]) == (1.0, Status.OK, 2), result


def test_a_bad_row_names_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(TESTS_ROW) + "\n" + json.dumps({"question": "no tests"}) + "\n")
    with pytest.raises(Exception, match="bad.jsonl:2"):
        registry.load("code_dataset", {"path": str(path)})


# -- procedural families --------------------------------------------------------------------------
FAMILIES = [(IntFunctionsDomain, INT_TEMPLATES), (ListFunctionsDomain, LIST_TEMPLATES)]


@pytest.mark.parametrize("cls, templates", FAMILIES, ids=["code_functions", "code_lists"])
def test_procedural_family_has_five_levels_of_short_tasks(cls, templates):
    domain = cls().configure(FAST)
    assert domain.levels == (1, 2, 3, 4, 5) and set(templates) == set(domain.levels)
    rng = random.Random(1)
    for level in domain.levels:
        for task in domain.sample(level, 30, rng):
            assert len(task.prompt[0]["content"]) < 60
            assert len(domain.reference(task)) <= 42
            assert len(task.payload["cases"]) == 6
            assert "expected" not in task.prompt[0]["content"]


@pytest.mark.sandbox
@pytest.mark.parametrize("cls, templates", FAMILIES, ids=["code_functions", "code_lists"])
def test_procedural_references_pass_and_constants_fail(cls, templates):
    domain = cls().configure(FAST)
    rng = random.Random(2)
    for level in domain.levels:
        for task in domain.sample(level, 4, rng):
            assert domain.verify(task, domain.reference(task)).reward == 1.0, task.prompt
            assert domain.verify(task, f"def f({domain.arg}):\n return 0").reward == 0.0, task.prompt


@pytest.mark.sandbox
@pytest.mark.parametrize("cls", [IntFunctionsDomain, ListFunctionsDomain], ids=["code_functions", "code_lists"])
def test_expression_completions_for_small_generation_budgets(cls):
    domain = cls().configure({**FAST, "completion": "expression"})
    rng = random.Random(3)
    for level in domain.levels:
        for task in domain.sample(level, 10, rng):
            reference = domain.reference(task)
            assert "def" not in reference and len(reference) <= 24
        assert domain.verify(task, reference).reward == 1.0, task.prompt
        full = f"def f({domain.arg}):\n return {reference}"  # a whole function still counts
        assert domain.verify(task, full).reward == 1.0


def test_procedural_sampling_is_deterministic_and_picklable():
    domain = IntFunctionsDomain().configure(FAST)
    a = [t.id for t in domain.sample(3, 5, random.Random(7))]
    b = [t.id for t in domain.sample(3, 5, random.Random(7))]
    assert a == b
    clone = pickle.loads(pickle.dumps(domain))
    assert [t.id for t in clone.sample(3, 5, random.Random(7))] == a


def test_code_domains_do_not_import_torch():
    code = "import sys, domains.code.verifier, domains.code.generated, domains.verify.sandbox; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_registered_through_entry_points():
    names = registry.available()
    assert {"code_dataset", "code_functions", "code_lists"} <= set(names)
    assert registry.load("code_lists", {"reward": "fraction"}).config.reward == "fraction"
    with pytest.raises(registry.DomainError, match="invalid options"):
        registry.load("code_functions", {"sandbox": {"wall_timeout": 1}})


# -- concurrency ----------------------------------------------------------------------------------
@pytest.mark.sandbox
def test_pool_verifies_in_parallel_and_every_reference_passes():
    domain = ListFunctionsDomain().configure(FAST)
    tasks = [t for level in domain.levels for t in domain.sample(level, 4, random.Random(level))]
    items = [(t, domain.reference(t)) for t in tasks] + [(t, "def f(a):\n return a") for t in tasks]
    with VerifierPool({domain.name: domain}, workers=2) as pool:
        verdicts = pool.verify_many(items)
        assert pool.restarts == 0
    rewards = [v.result.reward for v in verdicts]
    assert rewards[: len(tasks)] == [1.0] * len(tasks)
    assert sum(rewards[len(tasks):]) <= 2  # "a" itself is right only by accident (e.g. a sorted list)


def test_a_small_level_is_never_held_out_whole(tmp_path):
    from curriculum.tasks import TaskSource

    rows = [{**TESTS_ROW, "fn_name": "add", "prompt": f"def add(a, b): add them ({i})", "level": 1 + (i > 1)}
            for i in range(12)]  # level 1: two tasks; level 2: ten
    path = tmp_path / "small.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    domain = registry.load("code_dataset", {"path": str(path), **FAST})
    held = {t.id for level in (1, 2) for t in domain.heldout(level, 16, seed=0)}
    assert len(held) == 1 + 9  # distinct tasks, one of each level left to train on
    assert held == {t.id for level in (1, 2) for t in domain.heldout(level, 16, seed=0)}  # fixed by the seed
    drawn = TaskSource({domain.name: domain}, held, seed=0).draw({(domain.name, 1): 4, (domain.name, 2): 4})
    assert len(drawn) == 8 and not {t.id for t in drawn} & held


@pytest.mark.sandbox
def test_a_program_may_start_with_a_future_import_after_a_prompt_or_preamble(dataset, tmp_path):
    task = dataset.tasks[0]  # HumanEval-shaped: the prompt's code runs first
    full = ("```python\nfrom __future__ import annotations\n\n\ndef has_close(numbers: List[float], threshold):\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")
    assert dataset.verify(task, full).status is Status.OK
    call = next(t for t in dataset.tasks if t.payload["format"] == "call")  # after the typing preamble
    fn = call.payload["entry_point"]
    body = {"double": "return [2 * x for x in a]", "add": "return a + b"}[fn]
    args = {"double": "a: List[int]", "add": "a: int, b: Optional[int]"}[fn]  # names typing exports
    source = f"```python\nfrom __future__ import annotations\ndef {fn}({args}):\n    {body}\n```"
    assert dataset.verify(call, source).status is Status.OK
