"""The procedural math families: determinism, stable ids, correct gold answers, short texts."""
from __future__ import annotations

import pickle
import random
import re
import subprocess
import sys
from fractions import Fraction

import pytest

from domains import registry
from domains.api import Status, Task, stable_hash
from domains.math import generated as math_gen
from domains.math.generated import ARITHMETIC, FRACTIONS, LINEAR_EQUATIONS, ProceduralMath
from domains.math.work import solution
from trainer.config import TrainerConfig

FAMILIES = [ARITHMETIC, LINEAR_EQUATIONS, FRACTIONS]
LEVELS = [(domain, level) for domain in FAMILIES for level in domain.levels]
IDS = [f"{domain.name}-L{level}" for domain, level in LEVELS]
MAX_PROMPT_CHARS = 40


def _text(task: Task) -> str:
    return task.prompt[-1]["content"]


def _wrong(answer: str) -> str:
    return f"\\boxed{{{_fraction_text(Fraction(answer) + 1)}}}"


def _fraction_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def test_families_and_levels() -> None:
    assert [d.name for d in FAMILIES] == ["arithmetic", "linear_equations", "fractions"]
    assert all(d.levels == (1, 2, 3, 4, 5) for d in FAMILIES)


@pytest.mark.parametrize("domain,level", LEVELS, ids=IDS)
def test_sample_is_deterministic_per_seed(domain: ProceduralMath, level: int) -> None:
    first = domain.sample(level, 20, random.Random(7))
    again = domain.sample(level, 20, random.Random(7))
    other = domain.sample(level, 20, random.Random(8))
    assert [t.to_json() for t in first] == [t.to_json() for t in again]
    assert [t.id for t in first] != [t.id for t in other]
    assert all(t.domain == domain.name and t.level == level for t in first)


@pytest.mark.parametrize("domain,level", LEVELS, ids=IDS)
def test_ids_are_content_hashes(domain: ProceduralMath, level: int) -> None:
    for task in domain.sample(level, 10, random.Random(1)):
        assert task.id == stable_hash(domain.name, task.prompt, task.payload)
        assert Task.from_json(task.to_json()).id == task.id


def test_ids_and_tasks_are_stable_across_versions() -> None:
    """Golden values: a change here silently changes every seeded run and every stored task id."""
    first = {d.name: d.sample(1, 1, random.Random(0))[0] for d in FAMILIES}
    golden = {name: (_text(t), t.payload["answer"], t.id) for name, t in first.items()}
    assert golden == {
        "arithmetic": ("6+6=", "12", "390e18e245f72f82"),
        "linear_equations": ("x+7=13, x=", "6", "183ced213ab67820"),
        "fractions": ("7/8+4/8=", "11/8", "5a866d7cf9276362"),
    }


@pytest.mark.parametrize("domain,level", LEVELS, ids=IDS)
def test_reference_verifies_and_wrong_answer_does_not(domain: ProceduralMath, level: int) -> None:
    for task in domain.sample(level, 15, random.Random(level)):
        reference = domain.reference(task)
        good = domain.verify(task, reference)
        assert good.status == Status.OK and good.reward == 1.0, (_text(task), reference, good.details)
        bad = domain.verify(task, _wrong(task.payload["answer"]))
        assert bad.status == Status.WRONG and bad.reward == 0.0, (_text(task), bad.details)
        assert domain.verify(task, task.payload["answer"]).status == Status.FORMAT_ERROR  # not boxed


@pytest.mark.parametrize("domain,level", LEVELS, ids=IDS)
def test_prompts_and_references_stay_short(domain: ProceduralMath, level: int) -> None:
    """References and their end token fit the trainer's default generation budget (a token a
    character for the tiny model). Level 5's longest, ``-50+(-50)=-100,...``, is drawn rarely, so
    it is checked by name."""
    budget = TrainerConfig().sampling.max_new_tokens
    for task in domain.sample(level, 500, random.Random(level)):
        assert len(_text(task)) < MAX_PROMPT_CHARS, _text(task)
        assert len(domain.reference(task)) + 1 <= budget, domain.reference(task)
    _, answer, steps = math_gen._parenthesised(_Draws([-50, -50, 11, -99]))
    assert len(solution(steps, answer)) + 1 <= budget, solution(steps, answer)


def test_subtractions_are_worked_as_subtractions() -> None:
    """``70-0=`` too: subtracting zero is still a column subtraction, not ``0+0=0,7+0=7``."""
    for level in (2, 3):
        for task in ARITHMETIC.sample(level, 500, random.Random(level)):
            if re.fullmatch(r"\d+-\d+=", _text(task)):
                assert "+" not in ARITHMETIC.reference(task), (_text(task), ARITHMETIC.reference(task))
    _, _, steps = math_gen._mul_or_negative(_Draws([70, 0]))  # random() 0.75: the difference branch
    assert steps == ["0-0=0", "7-0=7"]


class _Draws(random.Random):
    """A random source that returns the given integers in order, to build one chosen problem."""

    def __init__(self, values: list[int]) -> None:
        super().__init__(0)
        self.values = iter(values)

    def randint(self, a: int, b: int) -> int:
        return next(self.values)

    def random(self) -> float:
        return 0.75  # the second branch of a 50/50 choice


@pytest.mark.parametrize("domain,level", LEVELS, ids=IDS)
def test_every_step_of_a_worked_solution_is_true(domain: ProceduralMath, level: int) -> None:
    """Each comma-separated step is a chain of equal expressions; the parts without x must agree."""
    for task in domain.sample(level, 300, random.Random(level)):
        steps, box = domain.reference(task).rsplit(",", 1)
        assert box == f"\\boxed{{{task.payload['answer']}}}"
        for step in steps.split(","):
            values = {_evaluate(part) for part in step.split("=") if "x" not in part}
            assert len(values) == 1, (step, values)


def _evaluate(expression: str) -> Fraction:
    """Exact value of a generated prompt, independent of the generator's own arithmetic."""
    exact = re.sub(r"\d+", lambda m: f"Fraction({m.group()})", expression.replace("x", ""))
    return eval(exact, {"Fraction": Fraction})  # noqa: S307 - our own generated text


@pytest.mark.parametrize("level", ARITHMETIC.levels)
def test_arithmetic_gold_is_the_value_of_the_prompt(level: int) -> None:
    for task in ARITHMETIC.sample(level, 200, random.Random(level)):
        assert _evaluate(_text(task).rstrip("=")) == int(task.payload["answer"])


@pytest.mark.parametrize("level", FRACTIONS.levels)
def test_fraction_gold_is_the_reduced_value_of_the_prompt(level: int) -> None:
    for task in FRACTIONS.sample(level, 200, random.Random(level)):
        value = _evaluate(_text(task).rstrip("="))
        assert task.payload["answer"] == _fraction_text(value)  # reduced, integer when whole


def _side(expression: str, x: int) -> int:
    expression = re.sub(r"(\d)x", r"\1*x", expression)
    return eval(expression, {"x": x})  # noqa: S307 - our own generated text


@pytest.mark.parametrize("level", LINEAR_EQUATIONS.levels)
def test_linear_equation_gold_solves_the_equation(level: int) -> None:
    for task in LINEAR_EQUATIONS.sample(level, 200, random.Random(level)):
        equation = _text(task).removesuffix(", x=")
        left, right = equation.split("=")
        x = int(task.payload["answer"])
        assert _side(left, x) == _side(right, x), equation
        assert _side(left, x + 1) != _side(right, x + 1), "the solution must be unique"


def test_levels_get_harder() -> None:
    """Level 1 is single-digit addition; later levels bring multiplication, negatives, more terms."""
    def prompts(domain: ProceduralMath, level: int) -> list[str]:
        return [_text(t) for t in domain.sample(level, 300, random.Random(0))]

    assert all(re.fullmatch(r"\d\+\d=", p) for p in prompts(ARITHMETIC, 1))
    assert any("*" in p for p in prompts(ARITHMETIC, 3)) and not any("*" in p for p in prompts(ARITHMETIC, 2))
    assert all(p.startswith("(") for p in prompts(ARITHMETIC, 5))
    assert all(re.fullmatch(r"x\+\d=\d+, x=", p) for p in prompts(LINEAR_EQUATIONS, 1))
    assert all(p.count("x") == 3 for p in prompts(LINEAR_EQUATIONS, 5))  # x on both sides
    assert all(p.count("/") == 3 for p in prompts(FRACTIONS, 5))  # three fractions
    for domain in FAMILIES:
        assert sum(map(len, prompts(domain, 1))) < sum(map(len, prompts(domain, 5))), domain.name


def test_unknown_level_is_an_error() -> None:
    with pytest.raises(ValueError, match="no level 6"):
        ARITHMETIC.sample(6, 1, random.Random(0))


def test_domains_pickle_and_keep_sampling() -> None:
    for domain in FAMILIES:
        clone = pickle.loads(pickle.dumps(domain.configure({"require_simplified": True})))
        assert clone.config.require_simplified is True
        assert [t.id for t in clone.sample(3, 5, random.Random(2))] == [t.id for t in domain.sample(3, 5, random.Random(2))]


def test_require_simplified_option_for_fractions() -> None:
    strict = registry.load("fractions", {"require_simplified": True})
    task = next(t for t in FRACTIONS.sample(1, 50, random.Random(3)) if t.payload["answer"] == "1")
    assert FRACTIONS.verify(task, r"\boxed{2/2}").status == Status.OK
    assert strict.verify(task, r"\boxed{2/2}").status == Status.WRONG
    assert strict.verify(task, r"\boxed{1}").status == Status.OK


def test_registered_through_entry_points() -> None:
    for domain in FAMILIES:
        loaded = registry.load(domain.name)
        assert type(loaded) is type(domain) and loaded.name == domain.name
    with pytest.raises(registry.DomainError, match="invalid options"):
        registry.load("arithmetic", {"require_simplfied": True})


def test_domain_modules_do_not_import_torch() -> None:
    code = "import sys, domains.math.generated, domains.math.dataset; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
