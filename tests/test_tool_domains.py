"""Built-in tool domains: references score 1 at every level, doctored transcripts score 0 with the
right status, the CLI round trip, and verification through the verifier pool."""
import json
import pickle
import random
import subprocess
import sys

import pytest

from curriculum.cli import main
from domains.api import Status
from domains.verify.pool import VerifierPool
from domains.registry import load
from domains.tools.builtin import TOOL_CALCULATOR, TOOL_KV_STORE, TOOL_LOOKUP
from domains.tools.calls import render_call
from domains.tools.environment import ToolDomain

DOMAINS = [TOOL_CALCULATOR, TOOL_KV_STORE, TOOL_LOOKUP]
NAMES = [d.name for d in DOMAINS]


def _task(domain, level=1, seed=0):
    return domain.sample(level, 1, random.Random(seed))[0]


def _messages(domain, task):
    return json.loads(domain.reference(task))


def _verify(domain, task, messages):
    return domain.verify(task, json.dumps(messages))


def _assistant(*texts):
    out = []
    for text in texts:
        out += [{"role": "assistant", "content": text}, {"role": "tool", "content": "whatever"}]
    return out[:-1]


# -- shape ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_registered_multi_turn_and_picklable(name):
    domain = load(name)
    assert isinstance(domain, ToolDomain) and domain.multi_turn and domain.levels == (1, 2, 3, 4, 5)
    assert pickle.loads(pickle.dumps(domain)).name == name


def test_domains_do_not_import_torch():
    code = "import sys, domains.tools.builtin, domains.tools.bfcl; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("domain", DOMAINS, ids=NAMES)
@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_reference_scores_one_within_budget(domain, level):
    for task in domain.sample(level, 20, random.Random(level)):
        messages = _messages(domain, task)
        turns = sum(m["role"] == "assistant" for m in messages)
        result = domain.verify(task, domain.reference(task))
        assert result.status == Status.OK and result.reward == 1.0, (task, result)
        assert result.details["turns"] == turns <= domain.config.max_turns
        assert result.details["invalid_calls"] == 0
        assert len(task.prompt[0]["content"]) <= 80
        assert all(len(m["content"]) <= 200 for m in messages if m["role"] == "assistant")
        # the trainer ends a turn at the first complete call: references make one call per turn
        assert all(m["content"].count("<tool_call>") <= 1 for m in messages)
        if level <= 2:
            assert turns == 2 and result.details["calls"] == 1


@pytest.mark.parametrize("domain", DOMAINS, ids=NAMES)
def test_sampling_is_seeded(domain):
    assert _task(domain, 3, seed=7) == _task(domain, 3, seed=7)
    assert _task(domain, 3, seed=7).id != _task(domain, 3, seed=8).id


# -- doctored transcripts ---------------------------------------------------------------------------------
def test_wrong_argument_scores_zero():
    task = _task(TOOL_CALCULATOR)
    messages = _messages(TOOL_CALCULATOR, task)
    call = json.loads(messages[0]["content"][len("<tool_call>"):-len("</tool_call>")])
    a, b = call["arguments"]["a"] + 1, call["arguments"]["b"]
    messages[0]["content"] = render_call("mul", a=a, b=b)
    messages[1:] = [{"role": "tool", "content": str(a * b)}, {"role": "assistant", "content": f"\\boxed{{{a * b}}}"}]
    result = _verify(TOOL_CALCULATOR, task, messages)
    assert result.status == Status.WRONG and result.reward == 0.0 and not result.details["answer_ok"]

    task = _task(TOOL_KV_STORE)
    messages = _messages(TOOL_KV_STORE, task)
    call = json.loads(messages[0]["content"][len("<tool_call>"):-len("</tool_call>")])
    k, v = call["arguments"]["k"], call["arguments"]["v"]
    messages[0]["content"] = render_call("set", k=k, v=(v + 1) % 10)
    result = _verify(TOOL_KV_STORE, task, messages)
    assert result.status == Status.WRONG and not result.details["state_ok"]


def test_made_up_tool_response_does_not_count():
    """The transcript's tool message lies and the answer follows the lie: replay catches it."""
    task = _task(TOOL_CALCULATOR)
    messages = _messages(TOOL_CALCULATOR, task)
    messages[1]["content"] = "7"
    messages[2]["content"] = "\\boxed{7}"
    assert _verify(TOOL_CALCULATOR, task, messages).status == Status.WRONG


def test_answer_without_the_call_still_scores_when_right():
    """Only the outcome is graded: a correct final answer needs no call (it is just very hard)."""
    task = _task(TOOL_CALCULATOR)
    assert TOOL_CALCULATOR.verify(task, f"\\boxed{{{task.payload['answer']}}}").correct


def test_extra_write_fails_even_when_it_changes_nothing():
    task = _task(TOOL_KV_STORE, level=2)
    messages = _messages(TOOL_KV_STORE, task)
    key, value = next(iter(task.payload["store"].items()))
    messages[0]["content"] += render_call("set", k=key, v=value)  # rewrite a value that was right
    result = _verify(TOOL_KV_STORE, task, messages)
    assert result.status == Status.WRONG and not result.details["state_ok"]


def test_kv_target_missed():
    task = _task(TOOL_KV_STORE, level=1)
    assert _verify(TOOL_KV_STORE, task, _assistant(render_call("dump"), "done")).status == Status.WRONG


def test_too_many_turns():
    task = _task(TOOL_LOOKUP, level=1)
    messages = _messages(TOOL_LOOKUP, task)
    padded = messages[:2] * TOOL_LOOKUP.config.max_turns + messages[2:]
    result = _verify(TOOL_LOOKUP, task, padded)
    assert result.status == Status.WRONG and "max_turns" in result.details["message"]
    assert TOOL_LOOKUP.configure({"max_turns": 2}).verify(task, json.dumps(messages[:2] * 2 + messages[2:])).status \
        == Status.WRONG


def test_malformed_json_is_a_format_error():
    task = _task(TOOL_CALCULATOR)
    messages = _messages(TOOL_CALCULATOR, task)
    messages[0]["content"] = messages[0]["content"].replace('"b"', '"a"')  # duplicate key
    assert _verify(TOOL_CALCULATOR, task, messages).status == Status.FORMAT_ERROR
    messages[0]["content"] = messages[0]["content"][:-len("</tool_call>")]  # truncated
    assert _verify(TOOL_CALCULATOR, task, messages).status == Status.FORMAT_ERROR
    assert TOOL_CALCULATOR.verify(task, '[{"role": "assistant", "content": 3}]').status == Status.FORMAT_ERROR


def test_no_final_answer_turn():
    task = _task(TOOL_CALCULATOR)
    messages = _messages(TOOL_CALCULATOR, task)[:2]
    result = _verify(TOOL_CALCULATOR, task, messages)
    assert result.status == Status.WRONG and "no final answer" in result.details["message"]


def test_turns_after_the_final_answer_are_malformed():
    task = _task(TOOL_CALCULATOR)
    messages = _messages(TOOL_CALCULATOR, task)
    result = _verify(TOOL_CALCULATOR, task, [messages[2]] + messages)
    assert result.status == Status.FORMAT_ERROR


def test_calls_inside_tool_messages_are_ignored():
    task = _task(TOOL_KV_STORE, level=1)
    messages = _messages(TOOL_KV_STORE, task)
    messages[1]["content"] = render_call("set", k="z", v=9) + render_call("del", k="a")
    assert _verify(TOOL_KV_STORE, task, messages).correct


def test_hedged_answers_score_zero():
    task = _task(TOOL_LOOKUP, level=1)
    messages = _messages(TOOL_LOOKUP, task)
    messages[-1]["content"] = f"\\boxed{{{task.payload['answer']}}} or \\boxed{{nobody}}"
    assert _verify(TOOL_LOOKUP, task, messages).status == Status.WRONG


def test_hostile_turns_do_not_hang():
    task = _task(TOOL_CALCULATOR)
    huge = [render_call("mul", a=1, b=2).replace("2}", '2,"c":"' + "x" * 1_000_000 + '"}'), "\\boxed{2}"]
    googol = [render_call("mul", a=10**100, b=2), "\\boxed{2}"]
    for texts in (huge, googol):
        assert TOOL_CALCULATOR.verify(task, json.dumps(_assistant(*texts))).status == Status.FORMAT_ERROR
    nested = "<tool_call>" + render_call("mul", a=1, b=2) + "</tool_call>"
    assert TOOL_CALCULATOR.verify(task, json.dumps(_assistant(nested, "\\boxed{2}"))).status == Status.FORMAT_ERROR


def test_invalid_calls_are_counted_and_optionally_penalised():
    task = _task(TOOL_CALCULATOR)
    messages = _messages(TOOL_CALCULATOR, task)
    fumbled = _assistant(render_call("pow", a=1, b=2), messages[0]["content"], messages[2]["content"])
    plain = TOOL_CALCULATOR.verify(task, json.dumps(fumbled))
    assert plain.correct and plain.reward == 1.0 and plain.details["invalid_calls"] == 1
    strict = TOOL_CALCULATOR.configure({"invalid_call_penalty": 0.25}).verify(task, json.dumps(fumbled))
    assert strict.correct and strict.reward == 0.75


def test_lookup_unknown_person_is_an_invalid_call():
    task = _task(TOOL_LOOKUP, level=1)
    env = TOOL_LOOKUP.environment(task)
    turn = env.step(render_call("get", n="nobody"))
    assert turn.invalid_calls == 1 and "no person" in json.loads(turn.observation)["error"]


# -- CLI and pool ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_cli_sample_then_verify(name, tmp_path, capsys):
    lines = []
    for level in (1, 5):
        assert main(["sample", "--domain", name, "--level", str(level), "-n", "3", "--json"]) == 0
        lines += [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    rows = [{"task": r["task"], "completion": r["reference"]} for r in lines]
    bad = json.loads(rows[0]["completion"])
    bad[0]["content"] = bad[0]["content"][:-3]  # malformed
    rows.append({"task": rows[0]["task"], "completion": json.dumps(bad)})
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert main(["verify", "--domain", name, "--input", str(path), "--workers", "1"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["reward"] for r in results] == [1.0] * 6 + [0.0]
    assert results[-1]["status"] == "format_error"


def test_verifier_pool_runs_tool_domains():
    tasks = [t for level in (1, 3) for t in TOOL_KV_STORE.sample(level, 2, random.Random(level))]
    items = [(t, TOOL_KV_STORE.reference(t)) for t in tasks] + [(tasks[0], "done")]
    with VerifierPool({TOOL_KV_STORE.name: TOOL_KV_STORE}, workers=1) as pool:
        verdicts = pool.verify_many(items)
    assert [v.result.reward for v in verdicts] == [1.0] * 4 + [0.0]
    assert verdicts[-1].result.status == Status.WRONG
