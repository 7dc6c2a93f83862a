"""The math answer verifier: extraction rules, equivalent forms, malformed output, hedging, and
pathological answers that must come back through the verifier pool instead of hanging."""
from __future__ import annotations

import random
import threading
import time

import pytest

from domains.api import Status, Task, user_prompt
from domains.math.answer import MathConfig, extract_final_answer, find_boxed, grade_answer, parse_gold
from domains.math.generated import ARITHMETIC
from domains.verify.pool import VerifierPool

OK, WRONG, FORMAT = Status.OK, Status.WRONG, Status.FORMAT_ERROR

# (completion, gold, expected status) under the default options.
CASES = [
    # plain correct answers and equivalent forms
    (r"\boxed{19}", "19", OK),
    (r"The sum is \boxed{19}.", "19", OK),
    (r"\boxed{ 19 }", "19", OK),
    (r"\boxed{0.5}", "1/2", OK),
    (r"\boxed{1/2}", "0.5", OK),
    (r"\boxed{\frac{1}{2}}", "1/2", OK),
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", OK),
    (r"\boxed{0.5}", r"\frac{1}{2}", OK),
    (r"\boxed{2.0}", "2", OK),
    (r"\boxed{2}", "2.0", OK),
    (r"\boxed{-3/4}", "-3/4", OK),
    (r"\boxed{-\frac{3}{4}}", "-3/4", OK),
    (r"\boxed{-0.75}", "-3/4", OK),
    (r"\boxed{2/4}", "1/2", OK),  # equal value; only require_simplified rejects it
    (r"\boxed{1+1}", "2", OK),  # a restated expression is correct by default
    (r"\boxed{x=3}", "3", OK),  # an assignment counts as its value
    (r"\boxed{\{1,2\}}", r"\{1,2\}", OK),
    (r"\boxed{\{2,1\}}", r"\{1,2\}", OK),  # sets ignore order
    (r"\boxed{1, 2}", r"\{1,2\}", OK),  # a comma list in one box reads as a set
    (r"\boxed{[1,2)}", "[1,2)", OK),
    (r"\boxed{2\sqrt{2}}", r"2\sqrt{2}", OK),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", OK),
    (r"\boxed{\text{Monday}}", r"\text{Monday}", OK),
    (r"\fbox{7}", "7", OK),
    (r"The answer: $\boxed{12}$.", "12", OK),
    (r"\boxed{\boxed{3}}", "3", OK),  # a nested box is one answer, not a hedge
    (r"\boxed{4} and so again \boxed{4}", "4", OK),  # repeating the same answer is not hedging
    (r"\boxed{1/2}, that is \boxed{0.5}", "1/2", OK),  # equal values in two spellings
    # only the text after </think> is graded
    (r"<think>maybe \boxed{3}</think>\boxed{4}", "4", OK),
    (r"<think>it is \boxed{4}</think>\boxed{3}", "4", WRONG),
    (r"<think>so 4</think> The answer is \boxed{4}.", "4", OK),
    (r"<think>\boxed{4}</think> no answer given", "4", FORMAT),
    (r"<think>\boxed{4} and then I ran out of tokens", "4", FORMAT),  # never closed
    # wrong answers
    (r"\boxed{20}", "19", WRONG),
    (r"\boxed{-19}", "19", WRONG),
    (r"\boxed{3/4}", "-3/4", WRONG),
    (r"\boxed{0.33}", "1/3", WRONG),
    (r"\boxed{(1,2)}", "[1,2)", WRONG),  # open interval is not half-open
    (r"\boxed{\{1,2,3\}}", r"\{1,2\}", WRONG),
    (r"\boxed{x}", "5", WRONG),
    # hedging: several different boxed answers score 0 even if one is right
    (r"\boxed{3} or \boxed{4}", "4", WRONG),
    (r"\boxed{4} or \boxed{3}", "4", WRONG),
    (r"\boxed{5}, \boxed{3}, \boxed{5}", "5", WRONG),
    # malformed output
    ("", "4", FORMAT),
    ("   \n ", "4", FORMAT),
    ("4", "4", FORMAT),  # no box
    ("The answer is 4.", "4", FORMAT),
    (r"\boxed{4", "4", FORMAT),  # unbalanced braces
    (r"\boxed{\frac{1}{2}", "1/2", FORMAT),
    (r"\boxed{}", "4", FORMAT),
    (r"\boxed{   }", "4", FORMAT),
    ("☃️\x00\ufffd\U0001f600 \u202e", "4", FORMAT),  # garbage unicode
    (r"\boxed{☃\ufffd}", "4", WRONG),  # boxed garbage is an answer, just not this one
    (r"\boxed{\frac{", "1/2", FORMAT),
]


@pytest.mark.parametrize("completion,gold,status", CASES)
def test_default_grading(completion: str, gold: str, status: Status) -> None:
    result = grade_answer(completion, gold)
    assert result.status == status, result.details
    assert result.correct == (status == OK)
    assert result.reward == (1.0 if status == OK else 0.0)


def test_hedging_is_marked_in_details() -> None:
    result = grade_answer(r"\boxed{3} or \boxed{4}", "4")
    assert result.details["hedged"] is True and result.details["boxes"] == 2


def test_many_distinct_boxes_are_a_hedge_without_parsing() -> None:
    completion = " ".join(f"\\boxed{{{k}}}" for k in range(20)) + r" \boxed{19}"
    assert grade_answer(completion, "19").details.get("hedged") is True


@pytest.mark.parametrize("completion,gold,expected", [
    (r"\boxed{1+1}", "2", WRONG),
    (r"\boxed{2/4}", "1/2", WRONG),
    (r"\boxed{\frac{2}{4}}", "1/2", WRONG),
    (r"\boxed{4/2}", "2", WRONG),
    (r"\boxed{x+2x}", "3x", WRONG),
    (r"\boxed{2}", "2", OK),
    (r"\boxed{x=2}", "2", OK),
    (r"\boxed{2.0}", "2", OK),
    (r"\boxed{1/2}", "1/2", OK),
])
def test_require_simplified(completion: str, gold: str, expected: Status) -> None:
    result = grade_answer(completion, gold, MathConfig(require_simplified=True))
    assert result.status == expected, result.details
    if expected == WRONG:
        assert result.details["unsimplified"] is True
    assert grade_answer(completion, gold).status == OK  # the default accepts every one of them


def test_require_simplified_fraction_with_reduced_form() -> None:
    config = MathConfig(require_simplified=True)
    assert grade_answer(r"\boxed{-3/4}", "-3/4", config).correct
    assert grade_answer(r"\boxed{\frac{3}{4}}", "3/4", config).correct


def test_require_boxed_false_falls_back_to_math_verify_extraction() -> None:
    config = MathConfig(require_boxed=False)
    assert grade_answer("The final answer is 7", "7", config).status == OK
    assert grade_answer("The final answer is 8", "7", config).status == WRONG
    assert grade_answer(r"\boxed{7}", "7", config).status == OK  # boxes still win
    assert grade_answer("no digits here", "7", config).status == FORMAT
    long_reasoning = "Let me think. " * 200 + "The final answer is 7"  # the length cap is for boxes only
    assert grade_answer(long_reasoning, "7", config).status == OK


def test_answer_length_cap_is_a_format_error() -> None:
    long_answer = r"\boxed{" + "1+" * 600 + "1}"
    result = grade_answer(long_answer, "601")
    assert result.status == FORMAT and "longer than" in result.details["message"]


def test_unparseable_gold_is_an_error_not_a_wrong_answer() -> None:
    result = grade_answer(r"\boxed{4}", r"\frac{")
    assert result.status == Status.ERROR


def test_gold_is_parsed_once() -> None:
    parse_gold.cache_clear()
    for answer in ("1", "2", "3"):
        grade_answer(rf"\boxed{{{answer}}}", "123456789")
    info = parse_gold.cache_info()
    assert info.misses == 1 and info.hits == 2


def test_extraction_rules() -> None:
    assert extract_final_answer(r"a \boxed{1} b \boxed{\frac{1}{2}}").answer == r"\frac{1}{2}"
    assert extract_final_answer(r"\boxed{\{1,2\}}").answer == r"\{1,2\}"  # escaped braces
    assert extract_final_answer(r"<think>\boxed{9}</think>").error == "no \\boxed{} answer"
    assert find_boxed(r"\boxed {3} \boxedx{4} \boxed{5")[1] is True
    assert find_boxed(r"\boxed {3} \boxed 4")[0] == ["3"]
    assert find_boxed(r"\boxed{\boxed{3}} \fbox{4}")[0] == [r"\boxed{3}", "4"]  # nested is one answer


def test_works_outside_the_main_thread() -> None:
    """math-verify's signal.alarm only works in the main thread; there we must switch it off."""
    results = []
    thread = threading.Thread(target=lambda: results.append(grade_answer(r"\boxed{0.5}", "1/2")))
    thread.start()
    thread.join(timeout=60)
    assert results and results[0].status == OK


@pytest.mark.parametrize("completion", [r"\boxed{9^{9^{9^{9}}}}", r"\boxed{" + "+".join(["1"] * 25_000) + "}"],
                         ids=["9^9^9^9", "50k-chars"])
def test_math_verify_timeout_becomes_timeout_status(completion: str) -> None:
    """In the main thread math-verify's alarm stops a huge parse or comparison: status timeout
    (the library itself would log a warning and answer False)."""
    start = time.thread_time()  # this thread's CPU time: what the alarm bounds, however busy the machine
    result = grade_answer(completion, "7", MathConfig(sympy_timeout_s=1, max_answer_chars=None))
    assert result.status == Status.TIMEOUT
    assert time.thread_time() - start < 20


def test_a_parse_that_outlives_its_alarm_is_a_timeout_even_if_it_returns(monkeypatch) -> None:
    """Where math-verify's alarm lands is a matter of timing; a handler inside the parser can
    swallow it and return a half-done parse. A call that outlived its alarm counts as timed out."""
    import math_verify

    real_parse = math_verify.parse

    def slow_parse(text, **kwargs):
        time.sleep(1.2)  # the alarm fired (and was swallowed) in here
        return real_parse(text, **kwargs)

    monkeypatch.setattr(math_verify, "parse", slow_parse)
    assert grade_answer(r"\boxed{8}", "7", MathConfig(sympy_timeout_s=1)).status == Status.TIMEOUT
    assert grade_answer(r"\boxed{8}", "7", MathConfig(sympy_timeout_s=5)).status == WRONG


def _task(answer: str) -> Task:
    return Task(domain="arithmetic", level=1, prompt=user_prompt("huge="), payload={"answer": answer})


HUGE_POWER = r"\boxed{9^{9^{9^{9}}}}"
LONG_EXPRESSION = r"\boxed{" + "+".join(["1"] * 25_000) + "}"  # 50,000 characters


@pytest.mark.parametrize("completion", [HUGE_POWER, LONG_EXPRESSION], ids=["9^9^9^9", "50k-chars"])
def test_huge_answers_time_out_through_the_pool(completion: str) -> None:
    """Only the pool's hard deadline stops these (math-verify's alarm is set far beyond it)."""
    domain = ARITHMETIC.configure({"verify_timeout_s": 5, "sympy_timeout_s": 600, "max_answer_chars": None})
    with VerifierPool({"arithmetic": domain}, workers=1) as pool:
        warm = pool.verify_many([(_task("19"), r"\boxed{19}")])[0]  # imports sympy before the clock matters
        assert warm.result.status == OK
        start = time.monotonic()
        verdict = pool.submit(_task("7"), completion).result(timeout=60)
        elapsed = time.monotonic() - start
        assert verdict.result.status in (Status.TIMEOUT, WRONG)
        assert elapsed < 5 + 10  # the deadline plus a generous margin for killing the worker
        after = pool.submit(_task("19"), r"\boxed{19}").result(timeout=60)  # a fresh worker took over
        assert after.result.status == OK
        assert pool.timeouts + (verdict.result.status == WRONG) >= 1


def test_long_expression_hits_the_length_cap_in_the_pool() -> None:
    with VerifierPool({"arithmetic": ARITHMETIC}, workers=1) as pool:
        verdict = pool.submit(_task("25000"), LONG_EXPRESSION).result(timeout=60)
    assert verdict.result.status == FORMAT


def test_generated_tasks_verify_in_the_pool() -> None:
    tasks = ARITHMETIC.sample(2, 6, random.Random(0))
    items = [(t, ARITHMETIC.reference(t)) for t in tasks] + [(t, r"\boxed{-1}") for t in tasks]
    with VerifierPool({"arithmetic": ARITHMETIC}, workers=2) as pool:
        verdicts = pool.verify_many(items)
    assert [v.result.status for v in verdicts] == [OK] * 6 + [WRONG] * 6
