"""Tool-call parsing and the environment's step loop, including hostile assistant turns."""
import json
import time

import pytest

from domains.tools.builtin import CalculatorEnv, KVStoreEnv
from domains.tools.calls import CallFormatError, loads_strict, parse_turn, render_call
from domains.tools.environment import boxed_answers, parse_transcript

MUL = render_call("mul", a=123, b=456)


# -- parsing ---------------------------------------------------------------------------------------------
def test_render_and_parse_round_trip():
    assert MUL == '<tool_call>{"name":"mul","arguments":{"a":123,"b":456}}</tool_call>'
    parsed = parse_turn(f"let me see {MUL} then")
    assert [(c.name, c.arguments) for c in parsed.calls] == [("mul", {"a": 123, "b": 456})]
    assert parsed.text == "let me see  then"


def test_whitespace_and_several_calls_in_one_turn():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n' + MUL
    assert [c.name for c in parse_turn(text).calls] == ["add", "mul"]


def test_plain_text_has_no_calls():
    assert parse_turn("\\boxed{5}").calls == []


@pytest.mark.parametrize("text, reason", [
    ('<tool_call>{"name":"mul","arguments":{"a":1,"b":2}}', "never closed"),  # truncated generation
    ('<tool_call>{"name":"mul","arguments":{"a":1,', "never closed"),
    ('<tool_call>{"name":"mul","arguments":{"a":1,}}</tool_call>', "invalid JSON"),
    ("<tool_call>{'name':'mul','arguments':{}}</tool_call>", "invalid JSON"),  # Python, not JSON
    ('<tool_call>{"name":"mul","arguments":{"a":1,"a":2,"b":3}}</tool_call>', "duplicate key"),
    ('<tool_call>{"name":"mul","name":"add","arguments":{}}</tool_call>', "duplicate key"),
    ('<tool_call>{"name":"mul","arguments":{"a":NaN,"b":1}}</tool_call>', "not JSON"),
    ('<tool_call>{"name":"mul","arguments":{"a":1e999,"b":1}}</tool_call>', "out of range"),  # would be inf
    ('<tool_call>{"name":"mul","arguments":{"a":1}} trailing</tool_call>', "invalid JSON"),
    ('<tool_call>{"name":"mul"}</tool_call>', "exactly the keys"),
    ('<tool_call>{"name":"mul","arguments":{},"id":1}</tool_call>', "exactly the keys"),
    ('<tool_call>{"name":7,"arguments":{}}</tool_call>', "non-empty string"),
    ('<tool_call>{"name":"mul","arguments":[1,2]}</tool_call>', "JSON object"),
    ('<tool_call>["mul",1,2]</tool_call>', "JSON object"),
    ("<tool_call><tool_call>" + MUL[len("<tool_call>"):], "inside <tool_call>"),
    ('{"name":"mul","arguments":{}}</tool_call>', "without <tool_call>"),
    ('<tool_call>{"name":"mul","arguments":{"a":' + "1" * 200 + ',"b":1}}</tool_call>', "digits"),
    ('<tool_call>{"name":"f","arguments":{"a":' + "[" * 50 + "]" * 50 + "}}</tool_call>", "nested deeper"),
])
def test_malformed_calls_are_rejected(text, reason):
    with pytest.raises(CallFormatError, match=reason):
        parse_turn(text)


def test_enormous_call_is_rejected_before_parsing():
    huge = render_call("set", k="a" * 1_000_000, v=1)
    start = time.thread_time()  # CPU time, so a busy machine does not fail it
    with pytest.raises(CallFormatError, match="longer than"):
        parse_turn(huge)
    assert time.thread_time() - start < 1.0


def test_deeply_nested_json_does_not_blow_the_stack():
    with pytest.raises(CallFormatError):
        loads_strict("[" * 2000 + "]" * 2000)


def test_too_many_calls_in_one_turn():
    with pytest.raises(CallFormatError, match="more than 8"):
        parse_turn(MUL * 9)


# -- environment step ------------------------------------------------------------------------------------
def test_call_then_answer():
    env = CalculatorEnv()
    turn = env.step(MUL)
    assert (turn.observation, turn.done, turn.calls, turn.invalid_calls) == ("56088", False, 1, 0)
    final = env.step("\\boxed{56088}")
    assert final.done and final.observation is None and final.format_error is None
    assert env.last_text == "\\boxed{56088}"
    assert env.step(MUL).format_error == "the episode is already over"


@pytest.mark.parametrize("call, message", [
    (render_call("pow", a=2, b=3), "unknown tool 'pow'"),
    (render_call("mul", a="123", b=456), "is not of type 'integer'"),  # wrong argument type
    (render_call("mul", a=True, b=456), "is not of type 'integer'"),  # bools are not integers
    (render_call("mul", a=1.5, b=456), "is not of type 'integer'"),
    (render_call("mul", a=1), "'b' is a required property"),
    (render_call("mul", a=1, b=2, c=3), "Additional properties"),
    (render_call("mul", a=10**20, b=2), "maximum"),  # big but within the parser's digit bound
])
def test_invalid_calls_get_an_error_observation(call, message):
    env = CalculatorEnv()
    turn = env.step(call)
    assert not turn.done and (turn.calls, turn.invalid_calls) == (1, 1)
    error = json.loads(turn.observation)["error"]
    assert message in error and len(error) <= 160


def test_a_googol_never_reaches_a_tool():
    env = CalculatorEnv()
    turn = env.step(MUL.replace("123", str(10**100)))
    assert turn.done and "digits" in turn.format_error


def test_malformed_turn_ends_the_episode():
    env = CalculatorEnv()
    turn = env.step('<tool_call>{"name":"mul","arguments":{"a":1,"a":2}}</tool_call>')
    assert turn.done and turn.observation is None and "duplicate key" in turn.format_error


def test_parallel_calls_answer_as_a_list_and_count_separately():
    env = KVStoreEnv({"a": 1})
    turn = env.step(render_call("set", k="b", v=2) + render_call("del", k="z") + render_call("dump"))
    assert json.loads(turn.observation) == ["ok", {"error": "del: no key z"}, {"a": 1, "b": 2}]
    assert (turn.calls, turn.invalid_calls) == (3, 1)
    assert env.state() == {"data": {"a": 1, "b": 2}, "writes": {"b": 1}}


def test_state_is_deterministic_and_hash_tracks_writes():
    first, second = KVStoreEnv({"a": 1}), KVStoreEnv({"a": 1})
    assert first.state_hash() == second.state_hash()
    first.step(render_call("set", k="a", v=1))  # same value, but a write all the same
    assert first.state()["data"] == second.state()["data"] and first.state_hash() != second.state_hash()


def test_tools_lists_json_schemas():
    schemas = {t["name"]: t for t in CalculatorEnv().tools()}
    assert set(schemas) == {"add", "sub", "mul"}
    assert schemas["mul"]["parameters"]["required"] == ["a", "b"]
    assert schemas["mul"]["parameters"]["additionalProperties"] is False


# -- transcripts and answers -----------------------------------------------------------------------------
def test_plain_text_is_one_assistant_turn():
    assert parse_transcript("\\boxed{3}") == [{"role": "assistant", "content": "\\boxed{3}"}]
    assert parse_transcript("[not json") == [{"role": "assistant", "content": "[not json"}]


@pytest.mark.parametrize("completion", [
    "[]", "[1, 2]", '[{"role": "user", "content": "hi"}]', '[{"role": "tool", "content": "1"}]',
    '[{"role": "assistant", "content": 5}]', '[{"role": "assistant"}]',
])
def test_malformed_transcripts(completion):
    with pytest.raises(CallFormatError):
        parse_transcript(completion)


def test_boxed_answers():
    assert boxed_answers("x \\boxed{12} and \\boxed{ {a}b }") == ["12", "{a}b"]
    assert boxed_answers("\\boxed{12") == []
