"""Hints for domains that rarely succeed: each built-in domain's hint, the hinted task, how many
of a training draw carry one, and that held-out evaluation never does."""
from __future__ import annotations

import json
import random
import re
from collections import Counter

import numpy as np
import pytest

from curriculum.config import ColdStartConfig, parse_difficulty, parse_policy
from curriculum.curriculum import Curriculum
from curriculum.replay import as_drawn
from curriculum.scheduler import Scheduler
from curriculum.steps import Group, outcomes, plan_metrics
from curriculum.types import Outcome
from domains.api import HINT_LABEL, Domain, Status, Task, VerifyResult, with_hint
from domains.code.generated import CODE_FUNCTIONS, CODE_LISTS, expression_head
from domains.math.generated import ARITHMETIC, FRACTIONS, LINEAR_EQUATIONS, literal_value
from domains.tools.builtin import TOOL_CALCULATOR, TOOL_KV_STORE, TOOL_LOOKUP
from domains.tools.calls import parse_turn
from domains.verify.pool import Verdict
from trainer.config import EvalConfig, SamplingConfig
from trainer.recipe.evaluate import HeldoutEvaluation

MATH = [ARITHMETIC, LINEAR_EQUATIONS, FRACTIONS]
TOOLS = [TOOL_CALCULATOR, TOOL_KV_STORE, TOOL_LOOKUP]
CODE = [CODE_FUNCTIONS, CODE_LISTS]
STYLES = ["compact", "chat"]


def styled(domain: Domain, style: str) -> Domain:
    return domain.configure({"prompt_style": style})


def tasks_of(domain: Domain, n: int = 12) -> list[Task]:
    return [t for level in domain.levels for t in domain.sample(level, n, random.Random(f"hints/{level}"))]


def user_text(task: Task) -> str:
    return [m for m in task.prompt if m["role"] == "user"][-1]["content"]


# -- the helper ---------------------------------------------------------------------------------------
def test_with_hint_adds_to_the_last_user_message_and_keeps_the_payload() -> None:
    chat = styled(LINEAR_EQUATIONS, "chat")
    task = chat.sample(1, 1, random.Random(0))[0]
    hinted = with_hint(task, "x=7-3", separator="\n\n")
    assert hinted.prompt[:-1] == task.prompt[:-1]  # the worked example before the question is untouched
    assert hinted.prompt[-1]["content"] == f"{task.prompt[-1]['content']}\n\n{HINT_LABEL} x=7-3"
    assert task.prompt[-1]["content"].endswith("\\boxed{}.")  # the task itself is not changed
    assert hinted.payload == task.payload and hinted.id != task.id
    assert hinted.meta == {**task.meta, "hint": "x=7-3", "unhinted_id": task.id}
    assert (hinted.domain, hinted.level) == (task.domain, task.level)
    with pytest.raises(ValueError, match="already"):
        with_hint(hinted, "again")
    with pytest.raises(ValueError, match="empty"):
        with_hint(task, "  ")


def test_a_domain_without_hints_gives_none() -> None:
    class Plain(Domain):
        name = "plain"

    task = Task("plain", 1, [{"role": "user", "content": "2+2="}], {"answer": "4"})
    assert Plain().hint(task) is None and Plain().hinted(task) is None


# -- the built-in domains' hints ----------------------------------------------------------------------
def _sides(hint: str) -> list[str]:
    return [side for piece in re.split(r"[,\s]", hint) for side in piece.split("=") if side]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("base", MATH, ids=lambda d: d.name)
def test_math_hint_is_a_first_step_and_never_the_answer(base, style) -> None:
    domain = styled(base, style)
    given = 0
    for task in tasks_of(domain):
        hint = domain.hint(task)
        if hint is None:
            continue
        given += 1
        answer = literal_value(task.payload["answer"])
        assert hint.strip() and "boxed" not in hint
        assert all(literal_value(side) != answer for side in _sides(hint)), (user_text(task), hint)
        step = hint.removeprefix("begin with ") if style == "chat" else hint
        assert task.meta["solution"].split(",")[0].startswith(step)  # the first step, or its left side
    assert given >= len(domain.levels) * 12 * 0.5  # one-step problems (level-1 sums, ax=c) have none


def test_math_hints_of_each_kind() -> None:
    def hint(domain, text, answer, solution):
        task = Task(domain.name, 2, [{"role": "user", "content": text}], {"answer": answer}, {"solution": solution})
        return domain.hint(task)

    assert hint(ARITHMETIC, "47+38=", "85", "7+8=15,4+3+1=8,\\boxed{85}") == "7+8=15"  # a first partial result
    assert hint(ARITHMETIC, "3+4=", "7", "3+4=7,\\boxed{7}") is None  # nothing between question and answer
    assert hint(ARITHMETIC, "20-15=", "5", "10-5=5,2-1-1=0,\\boxed{5}") == "10-5"  # its value is the answer
    assert hint(LINEAR_EQUATIONS, "x+3=7, x=", "4", "x=7-3,7-3=4,\\boxed{4}") == "x=7-3"  # the first rearrangement
    assert hint(LINEAR_EQUATIONS, "2x-3=x+40, x=", "43", "x=40-(-3)=43,\\boxed{43}") == "x=40-(-3)"
    assert hint(LINEAR_EQUATIONS, "3x+5=x+91, x=", "43", "2x=91-5=86,x=86/2,\\boxed{43}") == "2x=91-5=86"
    assert hint(LINEAR_EQUATIONS, "8x=56, x=", "7", "x=56/8,\\boxed{7}") is None  # 56/8 is the answer
    assert hint(FRACTIONS, "1/2+1/3=", "5/6", "3/6+2/6=5/6,\\boxed{5/6}") == "3/6+2/6"  # the common denominator
    assert hint(FRACTIONS, "1/5+2/5=", "3/5", "1/5+2/5=3/5,\\boxed{3/5}") is None


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("base", TOOLS, ids=lambda d: d.name)
def test_tool_hint_is_the_first_call_as_the_reference_writes_it(base, style) -> None:
    domain = styled(base, style)
    for task in tasks_of(domain, 4):
        hint = domain.hint(task)
        first = task.payload["reference_turns"][0]
        assert hint == (first if style == "compact" else f"make this call first: {first}")
        assert len(parse_turn(hint).calls) == 1  # a well-formed call
        answer = task.payload.get("answer")
        assert answer is None or f"\\boxed{{{answer}}}" not in hint


@pytest.mark.parametrize("completion", ["function", "expression"])
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("base", CODE, ids=lambda d: d.name)
def test_code_hint_is_the_signature_and_the_head_of_its_line(base, style, completion) -> None:
    domain = base.configure({"prompt_style": style, "completion": completion})
    for task in tasks_of(domain, 4):
        hint = domain.hint(task)
        assert hint
        expression = task.payload["reference"].removeprefix(f"def f({domain.arg}):\n return ")
        start = expression_head(expression)
        assert start and expression.startswith(start) and start != expression  # never the whole answer
        if completion == "function":
            assert f"def f({domain.arg}):\n return {start}" in hint
        else:
            assert start in hint and "def f" not in hint


def test_expression_head() -> None:
    assert expression_head("max(x,3)") == "max(x"
    assert expression_head("x*3+5") == "x*3"
    assert expression_head("[x+2 for x in a]") == "[x+2 for"
    assert expression_head("x") is None


def _verdict(domain: Domain, task: Task, completion: str) -> VerifyResult:
    return domain.verify(task, completion)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("base", MATH + TOOLS, ids=lambda d: d.name)
def test_the_hinted_task_verifies_the_reference_as_the_plain_one(base, style) -> None:
    domain = styled(base, style)
    for task in [t for level in domain.levels for t in domain.sample(level, 2, random.Random(level))]:
        hinted = domain.hinted(task)
        if hinted is None:
            continue
        assert user_text(hinted).endswith(f"{HINT_LABEL} {domain.hint(task)}")
        reference = domain.reference(task)
        assert domain.reference(hinted) == reference
        plain, with_it = _verdict(domain, task, reference), _verdict(domain, hinted, reference)
        assert (with_it.reward, with_it.correct, with_it.status) == (plain.reward, plain.correct, Status.OK)
        wrong = _verdict(domain, hinted, "\\boxed{nonsense}")
        assert not wrong.correct


@pytest.mark.sandbox
@pytest.mark.parametrize("base", CODE, ids=lambda d: d.name)
def test_the_hinted_code_task_verifies_the_reference_as_the_plain_one(base) -> None:
    for task in [base.sample(level, 1, random.Random(level))[0] for level in (1, 5)]:
        hinted = base.hinted(task)
        reference = base.reference(task)
        plain, with_it = base.verify(task, reference), base.verify(hinted, reference)
        assert (with_it.reward, with_it.correct, with_it.status) == (plain.reward, plain.correct, Status.OK)


@pytest.mark.parametrize("base", TOOLS, ids=lambda d: d.name)
def test_a_tool_task_led_by_its_first_call_keeps_its_prompt_and_verifies_as_before(base) -> None:
    domain = styled(base, "chat")
    led_any = False
    for task in tasks_of(domain, 2):
        reference = domain.reference(task)
        first = json.loads(reference)[0]["content"]
        led = domain.hinted(task, "lead")
        if not first.startswith("<tool_call>"):
            assert led is None  # a task solved without a call has neither a lead nor a hint
            continue
        led_any = True
        assert led.meta["lead"] == first == domain.lead(task)
        assert led.meta["hint"] == first and led.meta["unhinted_id"] == task.id != led.id
        assert (led.prompt, led.payload) == (task.prompt, task.payload)  # nothing is said: the trainer writes it
        plain, with_it = domain.verify(task, reference), domain.verify(led, reference)
        assert (with_it.reward, with_it.correct) == (plain.reward, plain.correct) == (1.0, True)
    assert led_any


def test_a_domain_without_a_lead_shows_its_hint_in_words_and_an_unknown_form_fails() -> None:
    task = ARITHMETIC.sample(2, 1, random.Random(3))[0]
    assert ARITHMETIC.lead(task) is None
    assert ARITHMETIC.hinted(task, "lead") == ARITHMETIC.hinted(task) is not None
    with pytest.raises(ValueError, match="unknown hint form 'prefix'"):
        ARITHMETIC.hinted(task, "prefix")


# -- the curriculum's draw -------------------------------------------------------------------------
DOMAINS = {d.name: d for d in (TOOL_CALCULATOR, CODE_FUNCTIONS, LINEAR_EQUATIONS)}  # a hint for every level-1 task


def curriculum(hint_share: float, hint_below: float = 0.3, prompts: int = 24, seed: int = 0,
               heldout_ids=(), hint_form: str = "words") -> Curriculum:
    return Curriculum(DOMAINS, policy=parse_policy({"type": "uniform"}),
                      difficulty=parse_difficulty({"type": "fixed"}), prompts_per_step=prompts, seed=seed,
                      heldout_ids=heldout_ids,
                      cold_start=ColdStartConfig(hint_below=hint_below, hint_share=hint_share, hint_form=hint_form))


def hinted_by_domain(tasks: list[Task]) -> Counter:
    return Counter(t.domain for t in tasks if t.meta.get("hint"))


@pytest.mark.parametrize("share, expected", [(1.0, 8), (0.5, 4), (0.0, 0)])
def test_a_draw_hints_its_share_of_each_domain(share, expected) -> None:
    cur = curriculum(share)
    plan = cur.plan(1)
    assert {d: sum(n for (name, _), n in plan.counts.items() if name == d) for d in DOMAINS} == dict.fromkeys(DOMAINS, 8)
    tasks = cur.draw(plan.counts, step=1)
    assert hinted_by_domain(tasks) == Counter(dict.fromkeys(DOMAINS, expected)) - Counter()
    for task in tasks:
        if task.meta.get("hint"):
            assert user_text(task).endswith(f"{HINT_LABEL} {task.meta['hint']}")
            assert task.id != task.meta["unhinted_id"]
    # a refill at the same step follows the same rule; a draw without a step (evaluation) has none
    refill = cur.draw({("tool_calculator", 1): 2, ("code_functions", 1): 4}, step=1)
    assert hinted_by_domain(refill) == Counter({"tool_calculator": round(2 * share), "code_functions": round(4 * share)}) - Counter()
    assert not hinted_by_domain(cur.draw(plan.counts))


def test_a_share_below_one_task_is_hinted_that_often_on_average() -> None:
    # one calculator task a step at a share of 0.37: rounding would never hint it
    cur = curriculum(0.5)
    counts = {("tool_calculator", 1): 1}
    hinted = [hinted_by_domain(cur.tasks.draw(counts, step=step, hints={"tool_calculator": 0.37}))["tool_calculator"]
              for step in range(1, 401)]
    assert set(hinted) == {0, 1}
    assert abs(sum(hinted) / len(hinted) - 0.37) < 0.07  # binomial sd over 400 steps: 0.024
    again = [hinted_by_domain(cur.tasks.draw(counts, step=step, hints={"tool_calculator": 0.37}))["tool_calculator"]
             for step in range(1, 401)]
    assert again == hinted  # seeded by (seed, step, domain): a rebuilt run hints the same steps


def test_a_draw_in_the_lead_form_leads_the_tool_tasks_and_hints_the_others_in_words() -> None:
    words, leads = curriculum(1.0), curriculum(1.0, hint_form="lead")
    counts = words.plan(1).counts
    worded, led = words.draw(counts, step=1), leads.draw(counts, step=1)
    assert [t.meta["unhinted_id"] for t in worded] == [t.meta["unhinted_id"] for t in led]  # the same tasks
    for before, after in zip(worded, led):
        if after.domain == "tool_calculator":
            assert after.meta["lead"] == TOOL_CALCULATOR.lead(after) and after.prompt != before.prompt
        else:
            assert "lead" not in after.meta and after == before


def test_hints_off_draws_exactly_what_it_drew_before() -> None:
    off, zero_share = curriculum(0.5, hint_below=0.0), curriculum(0.0)
    counts = off.plan(1).counts
    assert [t.id for t in off.draw(counts, step=1)] == [t.id for t in zero_share.draw(counts, step=1)]


def test_the_hinted_tasks_of_a_step_are_the_same_every_time() -> None:
    first, again = curriculum(0.5), curriculum(0.5)
    ids = [t.id for t in first.draw(first.plan(1).counts, step=1)]
    assert ids == [t.id for t in again.draw(again.plan(1).counts, step=1)]
    later = first.draw(first.plan(2).counts, step=2)  # another step chooses afresh
    assert hinted_by_domain(later) == Counter(dict.fromkeys(DOMAINS, 4))


def test_held_out_tasks_never_carry_a_hint(monkeypatch) -> None:
    evaluation = HeldoutEvaluation(DOMAINS, EvalConfig(tasks_per_level=4), SamplingConfig())
    heldout_ids = {t.id for t in evaluation.tasks}
    cur = curriculum(1.0, heldout_ids=heldout_ids)
    drawn = cur.draw(cur.plan(1).counts, step=1)
    assert all(t.meta.get("hint") for t in drawn)  # training: every task hinted
    assert not {t.meta["unhinted_id"] for t in drawn} & heldout_ids  # and none of them held out

    def no_hints(self, task):
        raise AssertionError("held-out evaluation asked for a hint")
    monkeypatch.setattr(Domain, "hinted", no_hints)
    again = HeldoutEvaluation(DOMAINS, EvalConfig(tasks_per_level=4), SamplingConfig())
    assert [t.id for t in again.tasks] == [t.id for t in evaluation.tasks]
    assert not any(t.meta.get("hint") for t in again.tasks)


def test_the_step_metrics_count_hinted_groups() -> None:
    cur = curriculum(0.5)
    plan = cur.plan(1)
    tasks = cur.draw(plan.counts, step=1)
    ok = Verdict(VerifyResult(1.0, True, Status.OK), 0.0)
    groups = [Group(t, ["x", "y"], [ok, ok], [0.0, 0.0]) for t in tasks]
    metrics = plan_metrics(plan, groups)
    assert {d: metrics[f"domain/{d}/hinted"] for d in DOMAINS} == dict.fromkeys(DOMAINS, 4)
    quiet = curriculum(0.0)  # no hints planned, none drawn: no hinted metric at all
    quiet_plan = quiet.plan(1)
    assert not [k for k in plan_metrics(quiet_plan, groups[:0]) if k.endswith("/hinted")]


# -- the scheduler's shares ----------------------------------------------------------------------------
def test_the_scheduler_hints_a_domain_at_zero_success_and_not_one_at_half() -> None:
    sched = Scheduler({"cold": (1,), "warm": (1,)}, parse_policy({"type": "uniform"}),
                      parse_difficulty({"type": "fixed"}), prompts_per_step=4,
                      cold_start=ColdStartConfig(hint_below=0.3), group_size=4)
    rows = [Outcome("cold", 1, f"c{g}", g, 0.0, False, "wrong") for g in range(2) for _ in range(4)]
    rows += [Outcome("warm", 1, f"w{g}", 2 + g, float(r), bool(r), "ok") for g in range(2) for r in (0, 1, 0, 1)]
    sched.plan(0)
    sched.record(0, rows)
    hints = dict(zip(sched.plan(1).domains, sched.plan(1).hints))
    assert hints["cold"] == pytest.approx(0.5) and hints["warm"] == 0.0
    assert np.all(Scheduler({"cold": (1,)}, parse_policy({"type": "uniform"}), parse_difficulty({"type": "fixed"}),
                            prompts_per_step=4).plan(0).hints == 0)  # off by default


def test_what_a_lead_wrote_is_stored_but_not_counted_so_the_hint_stays_until_the_domain_succeeds_unled() -> None:
    cur = curriculum(1.0, hint_form="lead")
    plan = cur.plan(1)
    tasks = cur.draw(plan.counts, step=1)
    right, wrong = Verdict(VerifyResult(1.0, True, Status.OK), 0.0), Verdict(VerifyResult(0.0, False, Status.WRONG), 0.0)
    # every led member right, every unled member (and every other domain) wrong
    groups = [Group(t, ["a", "b", "c", "d"], [right, right, wrong, wrong] if t.meta.get("lead") else [wrong] * 4,
                    [0.0] * 4) for t in tasks]
    rows = outcomes(groups, DOMAINS)
    led = [t for t in tasks if t.meta.get("lead")]
    assert led and sum(o.led for o in rows) == 2 * len(led)  # the first half of each led group
    assert [o.led for o in rows if o.task_id == led[0].id] == [True, True, False, False]
    metrics = plan_metrics(plan, groups)  # the step's metrics read as the statistics do
    assert metrics["domain/tool_calculator/success"] == 0.0 and metrics["domain/tool_calculator/led_success"] == 1.0
    assert metrics["domain/tool_calculator/completions"] == 4 * len(led)
    assert "domain/linear_equations/led_success" not in metrics
    cur.record(1, groups)
    hints = dict(zip(*[getattr(cur.scheduler.plan(2), key) for key in ("domains", "hints")]))
    assert hints["tool_calculator"] == pytest.approx(1.0)  # still at zero success unled: still led
    # the same successes from the unled members count, and the hints are withdrawn
    other = curriculum(1.0, hint_form="lead")
    other.plan(1)
    flipped = [Group(g.task, g.texts, [wrong, wrong, right, right] if g.task.meta.get("lead") else g.verdicts, g.advantages)
               for g in groups]
    other.record(1, flipped)
    hints = dict(zip(*[getattr(other.scheduler.plan(2), key) for key in ("domains", "hints")]))
    assert hints["tool_calculator"] == 0.0


def test_a_hinted_rotated_code_task_replays_as_it_was_drawn() -> None:
    code = CODE_FUNCTIONS.configure({"tests": 6, "hidden_tests": {"score": 2, "rotate": "epoch"}})
    cur = Curriculum({code.name: code}, policy=parse_policy({"type": "uniform"}),
                     difficulty=parse_difficulty({"type": "fixed"}), prompts_per_step=6,
                     cold_start=ColdStartConfig(hint_below=0.3, hint_share=0.5))
    tasks = cur.draw(cur.plan(1).counts, step=1)
    assert sum(bool(t.meta.get("hint")) for t in tasks) == 3
    rows = [{"step": 1, "group_index": g, "task_id": t.id, "domain": t.domain} for g, t in enumerate(tasks)]
    drawn = as_drawn(rows, {code.name: code})
    for row, task in zip(rows, tasks):  # the stored task (hinted or not) scores the same tests again
        assert "scored_tests" in task.payload
        assert drawn(row, task).payload == task.payload
