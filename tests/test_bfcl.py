"""The bfcl domain on hand-written rows in BFCL's published format (v3: question nested per turn;
ground truth as {func: {param: [acceptable values]}} with "" marking an optional parameter)."""
import json
import logging
import random
from pathlib import Path

import pytest

from curriculum.cli import main
from domains.api import Status
from domains.registry import load
from domains.tools.bfcl import BFCL, category, standardize_string
from domains.tools.calls import render_call

TRIANGLE = {
    "name": "calculate_triangle_area", "description": "Calculate the area of a triangle.",
    "parameters": {"type": "dict", "properties": {
        "base": {"type": "integer", "description": "The base."},
        "height": {"type": "integer", "description": "The height."},
        "unit": {"type": "string", "description": "Unit of measure (default 'units')."}},
        "required": ["base", "height"]},
}
SIMPLE = {
    "id": "simple_0",
    "question": [[{"role": "user", "content": "Find the area of a triangle with a base of 10 units and height of 5 units."}]],
    "function": [TRIANGLE],
    "ground_truth": [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}],
}
MULTIPLE = {
    "id": "multiple_0",
    "question": [[{"role": "user", "content": "Sides 5, 4 and 3: area of the triangle?"}]],
    "function": [
        {"name": "triangle_properties.get", "description": "Properties of a triangle.",
         "parameters": {"type": "dict", "properties": {
             "side1": {"type": "integer"}, "side2": {"type": "integer"}, "side3": {"type": "integer"},
             "get_area": {"type": "boolean"}}, "required": ["side1", "side2", "side3"]}},
        {"name": "circle_properties.get", "description": "Properties of a circle.",
         "parameters": {"type": "dict", "properties": {"radius": {"type": "float"}}, "required": ["radius"]}},
    ],
    "ground_truth": [{"triangle_properties.get": {"side1": [5], "side2": [4], "side3": [3], "get_area": ["", True]}}],
}
PARALLEL = {
    "id": "parallel_0",
    "question": [[{"role": "user", "content": "Play Taylor Swift for 20 minutes and Maroon 5 for 15 minutes."}]],
    "function": [{"name": "spotify.play", "description": "Play songs of an artist.",
                  "parameters": {"type": "dict", "properties": {
                      "artist": {"type": "string"}, "duration": {"type": "integer"}},
                      "required": ["artist", "duration"]}}],
    "ground_truth": [{"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
                     {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}}],
}
RICH = {  # float, array and dict parameters, and the v1 flat question shape
    "id": "live_simple_3-1-0",
    "question": [{"role": "user", "content": "Book a 2 night stay in Paris for Ann and Bo, budget 300."}],
    "function": [{"name": "book_hotel", "description": "Book a hotel.",
                  "parameters": {"type": "dict", "properties": {
                      "budget": {"type": "float"},
                      "guests": {"type": "array", "items": {"type": "string"}},
                      "stay": {"type": "dict", "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}}}},
                      "required": ["budget", "guests", "stay"]}}],
    "ground_truth": [{"book_hotel": {"budget": [300.0], "guests": [["Ann", "Bo"], ["Bo", "Ann"]],
                                     "stay": [{"city": ["Paris", "Paris, France"], "nights": [2]}]}}],
}
ROWS = [SIMPLE, MULTIPLE, PARALLEL, RICH]


def _verify(row, completion):
    return BFCL.verify(BFCL.task_from_json(row), completion)


def test_levels_come_from_the_category():
    assert [BFCL.task_from_json(r).level for r in ROWS] == [1, 2, 3, 1]
    assert category("live_parallel_multiple_3-1-0") == "parallel_multiple"
    with pytest.raises(ValueError, match="irrelevance"):
        BFCL.task_from_json({**SIMPLE, "id": "irrelevance_4"})


def test_prompt_holds_the_functions_and_the_question():
    task = BFCL.task_from_json(SIMPLE)
    assert task.prompt[0]["role"] == "system" and "calculate_triangle_area" in task.prompt[0]["content"]
    assert task.prompt[1] == SIMPLE["question"][0][0]
    assert BFCL.task_from_json(RICH).prompt[1]["content"].startswith("Book")


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_reference_scores_one(row):
    task = BFCL.task_from_json(row)
    assert BFCL.verify(task, BFCL.reference(task)).reward == 1.0


@pytest.mark.parametrize("completion", [
    render_call("calculate_triangle_area", base=10, height=5),  # optional unit left out
    render_call("calculate_triangle_area", base=10, height=5, unit=" Units."),  # normalised string
    'Sure. <tool_call>{"name": "calculate_triangle_area", "arguments": {"height": 5, "base": 10}}</tool_call>',
    '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}',  # bare JSON
    '[{"calculate_triangle_area": {"base": 10, "height": 5}}]',  # BFCL's own output shape
])
def test_simple_accepted(completion):
    assert _verify(SIMPLE, completion).correct


@pytest.mark.parametrize("completion, reason", [
    (render_call("calculate_triangle_area", base=10.0, height=5), "wrong type"),
    (render_call("calculate_triangle_area", base="10", height=5), "wrong type"),
    (render_call("calculate_triangle_area", base=True, height=5), "wrong type"),
    (render_call("calculate_triangle_area", base=11, height=5), "not acceptable"),
    (render_call("calculate_triangle_area", base=10), "missing required"),
    (render_call("calculate_triangle_area", base=10, height=5, color="red"), "unexpected parameter"),
    (render_call("calculate_triangle_area", base=10, height=5, unit="cm"), "not acceptable"),
    (render_call("triangle_area", base=10, height=5), "is not"),
    (render_call("calculate_triangle_area", base=10, height=5) * 2, "2 calls, expected 1"),
])
def test_simple_rejected(completion, reason):
    result = _verify(SIMPLE, completion)
    assert result.status == Status.WRONG and reason in result.details["message"]


@pytest.mark.parametrize("completion", [
    "The area is 25.",
    '<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 10, "base": 10, "height": 5}}</tool_call>',
    '<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}',
    '<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 1' + "0" * 100 + ', "height": 5}}</tool_call>',
    render_call("calculate_triangle_area", base=10, height=5, unit="x" * 1_000_000),
    "<tool_call>" + render_call("calculate_triangle_area", base=10, height=5) + "</tool_call>",
])
def test_malformed_answers_are_format_errors(completion):
    assert _verify(SIMPLE, completion).status == Status.FORMAT_ERROR


def test_multiple_picks_the_right_function():
    good = render_call("triangle_properties_get", side1=5, side2=4, side3=3)  # dots may become "_"
    assert _verify(MULTIPLE, good).correct
    assert _verify(MULTIPLE, good.replace("}}", ',"get_area":true}}')).correct
    assert not _verify(MULTIPLE, render_call("circle_properties.get", radius=3.0)).correct


def test_parallel_in_any_order_and_complete():
    taylor = render_call("spotify.play", artist="taylor swift", duration=20)
    maroon = render_call("spotify.play", artist="Maroon 5", duration=15)
    assert _verify(PARALLEL, taylor + maroon).correct
    assert _verify(PARALLEL, maroon + "\n" + taylor).correct
    assert "1 calls, expected 2" in _verify(PARALLEL, taylor).details["message"]
    assert not _verify(PARALLEL, taylor + taylor).correct


def test_floats_lists_and_dicts():
    def call(**overrides):
        arguments = {"budget": 300, "guests": ["ann", "Bo"], "stay": {"city": "paris, france", "nights": 2}}
        return render_call("book_hotel", **{**arguments, **overrides})
    assert _verify(RICH, call()).correct  # int for float, normalised list and dict strings
    assert _verify(RICH, call(guests=["Bo", "Ann"])).correct
    assert not _verify(RICH, call(guests=["Ann"])).correct
    assert not _verify(RICH, call(stay={"city": "Paris"})).correct  # nights is not optional
    assert not _verify(RICH, call(stay={"city": "Paris", "nights": 2, "pool": True})).correct
    assert not _verify(RICH, call(guests=[1, 2])).correct


def test_standardize_string_matches_bfcl():
    assert standardize_string("April 1, 2024") == standardize_string("april 1 2024") == "april12024"
    assert standardize_string("It's") == 'it"s'


def test_config_loads_rows_and_joins_answers(tmp_path):
    questions = tmp_path / "BFCL_v3_simple.json"
    answers = tmp_path / "possible_answer.json"
    questions.write_text("\n".join(json.dumps({k: v for k, v in r.items() if k != "ground_truth"}) for r in ROWS))
    answers.write_text("\n".join(json.dumps({"id": r["id"], "ground_truth": r["ground_truth"]}) for r in ROWS))
    domain = load("bfcl", {"path": str(questions), "answers_path": str(answers)})
    assert sorted(t.meta["bfcl_id"] for t in domain.tasks) == sorted(r["id"] for r in ROWS)
    [task] = domain.sample(3, 1, random.Random(0))
    assert task.meta["bfcl_id"] == "parallel_0" and domain.verify(task, domain.reference(task)).correct


def test_held_out_tasks_are_distinct_and_leave_every_level_one_to_train_on(tmp_path):
    path = tmp_path / "rows.json"
    rows = [{**ROWS[0], "id": f"simple_{i}"} for i in range(3)]  # a level of three tasks
    path.write_text("\n".join(json.dumps(r) for r in rows))
    domain = load("bfcl", {"path": str(path)})
    held = domain.heldout(1, 16, seed=0)  # asks for more than the level has
    assert len(held) == 2 and len({t.meta["bfcl_id"] for t in held}) == 2
    assert domain.heldout(1, 16, seed=0) == held  # fixed by the seed


def test_cli_verify_takes_raw_rows(tmp_path, capsys):
    lines = [{"task": SIMPLE, "completion": render_call("calculate_triangle_area", base=10, height=5)},
             {"task": PARALLEL, "completion": render_call("spotify.play", artist="Maroon 5", duration=15)},
             {"task": BFCL.task_from_json(MULTIPLE).to_json(), "completion": "no call"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    assert main(["verify", "--domain", "bfcl", "--input", str(path), "--workers", "1"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["reward"], r["status"]) for r in results] == [(1.0, "ok"), (0.0, "wrong"), (0.0, "format_error")]


def test_single_turn():
    assert not getattr(BFCL, "multi_turn", False)


def test_a_broken_file_is_named_with_its_line(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    no_answer = {k: v for k, v in SIMPLE.items() if k != "ground_truth"} | {"id": "simple_1"}
    for lines, says in (([json.dumps(SIMPLE), "{not json"], f"{rows}:2: not valid JSON"),
                        ([json.dumps(SIMPLE), json.dumps(no_answer)], f"{rows}:2: ValueError: BFCL row lacks")):
        rows.write_text("\n".join(lines) + "\n")
        assert main(["sample", "--domain", "bfcl", "--level", "1", "--option", f"path={json.dumps(str(rows))}"]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


# -- BFCL's published v4 files: real rows (tests/data/bfcl, copied from the bfcl-eval package) ------------
V4 = Path(__file__).parent / "data" / "bfcl"


def test_v4_published_rows_load_score_and_skip_other_categories_with_a_count(caplog):
    caplog.set_level(logging.INFO, logger="palestra.bfcl")
    domain = load("bfcl", {"path": str(V4 / "BFCL_v4_sample.json"),
                           "answers_path": str(V4 / "possible_answer" / "BFCL_v4_sample.json")})
    levels = {t.meta["bfcl_id"]: t.level for t in domain.tasks}
    assert levels == {"simple_python_0": 1, "simple_python_1": 1, "simple_python_2": 1, "multiple_0": 2,
                      "multiple_1": 2, "parallel_0": 3, "parallel_1": 3, "parallel_multiple_0": 4,
                      "parallel_multiple_1": 4, "live_simple_0-0-0": 1, "live_simple_1-1-0": 1,
                      "live_multiple_28-8-0": 2, "parallel_multiple_12": 4}
    assert domain.skipped == {"simple_java": 1, "simple_javascript": 1, "irrelevance": 1}
    assert "skipped 3 rows" in caplog.text and "simple_java 1" in caplog.text
    # its ground truth names a parameter its schema lacks as the only answer: no call can pass it
    assert domain.unanswerable == ["live_multiple_964-207-0"] and "live_multiple_964-207-0" in caplog.text
    for task in domain.tasks:  # no false negatives: every published answer scores
        assert domain.verify(task, domain.reference(task)).reward == 1.0, task.meta["bfcl_id"]
    assert domain.sample(1, 1, random.Random(0))[0].level == 1  # v4 files have level-1 tasks


def test_v4_and_v3_simple_names_are_one_category_and_other_languages_are_refused_by_name():
    assert category("simple_python_12") == category("simple_12") == "simple"
    assert category("live_simple_3-1-0") == "simple" and category("simple_java_4") == "simple_java"
    assert category("memory_12-customer-12") == "memory" and category("multi_turn_base_7") == "multi_turn_base"
    with pytest.raises(ValueError, match="'simple_javascript' .* not scored here"):
        BFCL.task_from_json({**SIMPLE, "id": "simple_javascript_0"})
