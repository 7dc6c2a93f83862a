"""Hidden, rotated tests for code: a pool larger than what scores at once, a seeded subset that
rotates as a task comes back, prompt examples that never score, the whole pool held out, and
`palestra replay` scoring exactly the tests that scored each stored result."""
from __future__ import annotations

import json
import logging
import random

import pytest

from curriculum.config import FixedDifficultyConfig, UniformConfig
from curriculum.curriculum import Curriculum
from curriculum.replay import replay
from curriculum.steps import Group
from curriculum.store import StatsStore
from curriculum.tasks import TaskSource
from domains import registry
from domains.code.hidden import SCORED_KEY, TOO_FEW, shown_in_prompt
from domains.verify.pool import VerifierPool
from test_code_domain import FAST

ROTATING = {"tests": 12, "examples": 2, "hidden_tests": {"score": 4}, **FAST}


def special_cased(task, subset) -> str:
    """A policy that hard-codes the answers of the tests in ``subset`` and nothing else."""
    table = {repr(task.payload["cases"][i]["args"][0]): task.payload["cases"][i]["expected"] for i in subset}
    return f"def f(x):\n return {table!r}.get(repr(x))"


@pytest.fixture(scope="module")
def lists():
    return registry.load("code_lists", ROTATING)


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    """Three function-call rows of ten tests each: a dataset small enough that its tasks come back."""
    rows = [{"fn_name": "f", "prompt": f"f(x) = x + {k}", "solution": f"def f(x):\n    return x + {k}\n",
             "tests": [{"input": [x], "output": x + k} for x in range(10)]} for k in range(3)]
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_the_subset_rotates_across_steps_and_never_holds_a_shown_example(lists):
    task = lists.sample(3, 1, random.Random(0))[0]
    assert len(task.payload["cases"]) == 12 and len(task.payload["examples"]) == 2
    shown = [json.dumps(e["args"]) for e in task.payload["examples"]]
    assert all(s in task.prompt[-1]["content"] for s in [repr(e["args"][0]) for e in task.payload["examples"]])
    assert not set(shown) & {json.dumps(c["args"]) for c in task.payload["cases"]}  # shown apart from the pool
    subsets = [tuple(lists.drawn(task, step, 0).payload[SCORED_KEY]) for step in range(1, 9)]
    assert all(len(s) == 4 and set(s) <= set(range(12)) for s in subsets)
    assert len(set(subsets)) >= 4  # it rotates
    assert subsets == [tuple(lists.drawn(task, step, 0).payload[SCORED_KEY]) for step in range(1, 9)]  # seeded
    assert lists.drawn(task, 3, 0).id == task.id  # the same task, scored on other tests
    [held] = lists.heldout(3, 1, seed=0)
    assert SCORED_KEY not in held.payload  # held-out evaluation scores the whole pool


@pytest.mark.sandbox
def test_a_policy_that_hard_codes_one_subset_scores_one_there_and_zero_elsewhere(lists):
    task = lists.sample(2, 1, random.Random(5))[0]
    first = lists.drawn(task, 1, 0)
    other = next(lists.drawn(task, step, 0) for step in range(2, 50)
                 if not set(lists.drawn(task, step, 0).payload[SCORED_KEY]) <= set(first.payload[SCORED_KEY]))
    cheat = special_cased(task, first.payload[SCORED_KEY])
    on_its_subset = lists.verify(first, cheat)
    assert on_its_subset.reward == 1.0 and on_its_subset.details[SCORED_KEY] == first.payload[SCORED_KEY]
    assert on_its_subset.details["total"] == 4
    assert lists.verify(other, cheat).reward == 0.0
    assert lists.verify(lists.heldout(2, 1, seed=0)[0], cheat).reward == 0.0
    assert lists.verify(other, lists.reference(task)).reward == 1.0  # the real answer passes every subset


def test_defaults_leave_tasks_and_scoring_as_they_were():
    plain, wider = registry.load("code_functions"), registry.load("code_functions", {"tests": 12})
    assert not plain.rotates
    for level in plain.levels:
        a, b = plain.sample(level, 3, random.Random(level)), wider.sample(level, 3, random.Random(level))
        assert [t.prompt for t in a] == [t.prompt for t in b]  # the task stream does not depend on the pool size
        assert [t.payload["cases"] for t in a] == [t.payload["cases"][:6] for t in b]
        assert all(len(t.payload["cases"]) == 6 and "examples" not in t.payload for t in a)
        assert all(plain.drawn(t, 7, 3) is t for t in a)


def test_a_stdio_sample_the_statement_shows_never_scores_and_too_few_tests_score_all(tmp_path, caplog):
    shown = {"question": "Print a+b.\n\nExample\nInput\n1 2\nOutput\n3\n",
             "input_output": {"inputs": ["1 2\n", "5 5\n", "2 2\n", "7 1\n", "0 0\n"],
                              "outputs": ["3\n", "10\n", "4\n", "8\n", "0\n"]},
             "solutions": ["a, b = map(int, input().split())\nprint(a + b)\n"]}
    few = {"fn_name": "add", "tests": [{"input": [1, 2], "output": 3}], "prompt": "add", "level": 1,
           "solution": "def add(a, b):\n    return a + b\n"}
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [shown] * 3 + [few]) + "\n")
    domain = registry.load("code_dataset", {"path": str(path), "hidden_tests": {"score": 2}, **FAST})
    task, small = domain.tasks[0], domain.tasks[3]
    assert shown_in_prompt(task) == {0}
    scored = {i for step in range(30) for i in domain.drawn(task, step, 0).payload[SCORED_KEY]}
    assert scored == {1, 2, 3, 4}  # every hidden test takes a turn; the shown sample never does
    assert [t.payload[SCORED_KEY] for t in domain.heldout(1, 5, seed=0) if t.payload["format"] == "stdio"][0] == [1, 2, 3, 4]
    caplog.set_level(logging.WARNING, logger="palestra.code")
    TOO_FEW.said.discard("code_dataset")  # said once per domain and process: another test may have
    assert SCORED_KEY not in domain.drawn(small, 1, 0).payload and SCORED_KEY not in domain.drawn(small, 2, 0).payload
    assert caplog.text.count("hidden tests") == 1  # said once


def test_by_epoch_the_subset_changes_each_time_the_task_is_drawn_and_survives_a_checkpoint(rows_file):
    domain = registry.load("code_dataset", {"path": rows_file, "hidden_tests": {"score": 3, "rotate": "epoch"}})
    source = TaskSource({"code_dataset": domain}, set(), seed=0)
    counts = {("code_dataset", 1): 6}
    first = source.draw(counts, step=1)
    state = json.loads(json.dumps(source.state_dict()))
    again = source.draw(counts, step=1)  # the same step: only the draw count moves the subset
    assert all(SCORED_KEY in t.payload for t in first + again)
    assert any(source.visits[t.id] > 1 for t in first)
    by_id = {t.id: t.payload[SCORED_KEY] for t in first}
    assert any(by_id.get(t.id) not in (None, t.payload[SCORED_KEY]) for t in again)
    resumed = TaskSource({"code_dataset": domain}, set(), seed=0)
    resumed.load_state_dict(state)
    assert [t.payload for t in resumed.draw(counts, step=1)] == [t.payload for t in again]
    by_step = TaskSource({"code_dataset": domain.configure({"hidden_tests": {"score": 3}})}, set(), seed=0)
    assert all(SCORED_KEY in t.payload for t in by_step.draw(counts, step=1)) and not by_step.visits  # no count kept


@pytest.mark.sandbox
def test_replay_scores_each_stored_result_on_the_tests_that_scored_it(tmp_path, rows_file):
    """A stored run whose completions hard-code the tests of a task's first draw: reward 1 then,
    mostly 0 on the draws after (by epoch: the draw count, which replay recounts from the stored
    groups). Replay must draw every subset again to agree with both."""
    options = {"code_dataset": {"path": rows_file, "hidden_tests": {"score": 3, "rotate": "epoch"}, **FAST}}
    domains = registry.load_all(["code_dataset"], options)
    with StatsStore(f"sqlite:///{tmp_path / 'run.db'}") as store:
        curriculum = Curriculum.start(store, "rotation", {"domains": ["code_dataset"], "domain_options": options},
                                      seed=3, domains=domains, policy=UniformConfig(),
                                      difficulty=FixedDifficultyConfig(level=1), prompts_per_step=6)
        cheats: dict[str, str] = {}
        with VerifierPool(domains, workers=1) as pool:
            for step in (1, 2, 3):
                tasks = curriculum.draw({("code_dataset", 1): 6}, step=step)
                texts = [cheats.setdefault(t.id, special_cased(t, t.payload[SCORED_KEY])) for t in tasks]
                verdicts = pool.verify_many(list(zip(tasks, texts)))
                groups = [Group(t, [c], [v], [0.0]) for t, c, v in zip(tasks, texts, verdicts)]
                curriculum.record(step, groups)
        curriculum.finish()
        rewards = [r["reward"] for r in store.results(curriculum.run_id)]
        assert 1.0 in rewards and 0.0 in rewards  # the check below can tell the subsets apart
        report = replay(store, curriculum.run_id, workers=1)
        assert report.checked == 18 and report.mismatches == []
        assert replay(store, curriculum.run_id, step=3, workers=1).mismatches == []
