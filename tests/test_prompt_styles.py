"""Prompts for chat models: every built-in domain can put its tasks in words, asking for the answer
format its verifier reads, and its references still score 1; the compact form the tiny model learns
stays what it was; the style comes from the model's config, a domain's own option winning."""
import json
import random

import pytest

from domains.api import DomainConfig, Task
from domains.code.dataset import CODE_DATASET
from domains.math.dataset import MATH_DATASET
from domains.registry import load, load_all
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from domains.tools.calls import offer_tools
from trainer.config import ModelConfig
from trainer.models.loading import encode_prompt, template_takes_tools

PROCEDURAL = ["arithmetic", "linear_equations", "fractions", "code_functions", "code_lists",
              "tool_calculator", "tool_kv_store", "tool_lookup"]
# what the chat prompt asks for: the thing each verifier reads
ASKS = {"arithmetic": "\\boxed{}", "linear_equations": "\\boxed{}", "fractions": "\\boxed{}",
        "code_functions": "```python", "code_lists": "```python", "tool_calculator": "\\boxed{}",
        "tool_kv_store": "reply done", "tool_lookup": "\\boxed{}"}


@pytest.mark.sandbox
@pytest.mark.parametrize("name", PROCEDURAL)
def test_a_chat_prompt_of_every_procedural_domain_asks_for_the_format_and_its_reference_scores(name):
    compact, chat = load(name), load(name).configure({"prompt_style": "chat", "system_prompt": "Be brief."})
    for level in compact.levels:
        plain = compact.sample(level, 3, random.Random(level))
        worded = chat.sample(level, 3, random.Random(level))
        for a, b in zip(plain, worded):
            assert a.payload == b.payload and a.prompt != b.prompt  # the same problem, put in words
            assert b.prompt[0]["role"] == "system" and b.prompt[0]["content"].startswith("Be brief.")
            assert ASKS[name] in b.prompt[-1]["content"]
            if name in ("arithmetic", "linear_equations", "fractions"):  # one worked exchange first
                assert [m["role"] for m in b.prompt] == ["system", "user", "assistant", "user"]
                assert "The final answer is \\boxed{" in b.prompt[2]["content"]
            if name.startswith("tool_"):  # the tools' schemas, for the chat template or in words; one solved exchange
                assert [t["name"] for t in b.prompt[0]["tools"]] == [t["name"] for t in chat.environment(b).tools()]
                assert [m["role"] for m in b.prompt] == ["system", "user", "assistant", "tool", "assistant", "user"]
            result = chat.verify(b, chat.reference(b))
            assert (result.reward, result.correct) == (1.0, True), (name, level, b.prompt, result)


@pytest.mark.parametrize("name", ["tool_calculator", "tool_kv_store", "tool_lookup"])
def test_a_tool_domains_solved_exchange_scores_and_is_no_task_it_could_draw(name):
    domain = load(name).configure({"prompt_style": "chat"})
    shown = domain.chat_example
    assert shown[0]["role"] == "user" and "<tool_call>" in shown[1]["content"] and shown[2]["role"] == "tool"
    solved = Task(domain=name, level=1, prompt=shown[:1], payload=domain.example[1])
    result = domain.verify(solved, json.dumps(shown[1:]))  # the tool's answers are the environment's own
    assert (result.reward, result.correct) == (1.0, True), result
    asked = {task.prompt[-1]["content"] for level in domain.levels
             for task in domain.sample(level, 200, random.Random(level))}
    assert shown[0]["content"] not in asked and len(asked) > 100


@pytest.mark.parametrize("name", PROCEDURAL)
def test_the_compact_form_is_what_it_was(name):
    domain = load(name)
    assert domain.config.prompt_style == "compact"
    [task] = domain.sample(1, 1, random.Random(0))
    assert len(task.prompt) == 1 and task.prompt[0]["role"] == "user"  # no system message, no words added
    assert domain.configure({"prompt_style": "compact"}).sample(1, 1, random.Random(0)) == [task]


@pytest.mark.sandbox
def test_dataset_domains_add_the_request_to_the_rows_own_question(tmp_path):
    math_file = tmp_path / "math.jsonl"
    math_file.write_text(json.dumps({"prompt": "How many legs have 3 cats?", "answer": "12"}) + "\n"
                         + json.dumps({"prompt": "Put your final answer in \\boxed{}. 2+2?", "answer": "4"}) + "\n")
    math = MATH_DATASET.configure({"path": str(math_file), "heldout_fraction": 0.0, "prompt_style": "chat"})
    asked = sorted(t.prompt[-1]["content"] for t in math.sample(1, 2, random.Random(0)))
    assert "How many legs have 3 cats?\n\nPut your final answer in \\boxed{}." in asked
    assert "Put your final answer in \\boxed{}. 2+2?" in asked  # already asked: left alone
    code_file = tmp_path / "code.jsonl"
    code_file.write_text(json.dumps({"question": "Print the sum of two integers read from one line.",
                                     "input_output": {"inputs": ["1 2\n"], "outputs": ["3\n"]},
                                     "solutions": ["a, b = map(int, input().split())\nprint(a + b)"]}) + "\n")
    code = CODE_DATASET.configure({"path": str(code_file), "prompt_style": "chat"})
    [task] = code.tasks
    assert task.prompt[-1]["content"].endswith("prints the answer, in a ```python code block.")
    assert code.verify(task, code.reference(task) or task.payload["reference"]).reward == 1.0


def test_the_style_comes_from_the_models_config_and_a_domains_own_option_wins():
    assert ModelConfig().domain_options() == {}  # the tiny model: compact, the domains' default
    assert ModelConfig(type="smollm2").domain_options() == {"prompt_style": "chat"}
    assert ModelConfig(type="smollm2", prompt_style="compact", system_prompt="Be brief.").domain_options() == {
        "system_prompt": "Be brief."}
    shared = ModelConfig(type="hf", name_or_path="m").domain_options()
    domains = load_all(["arithmetic", "fractions"], {"fractions": {"prompt_style": "compact"}}, shared=shared)
    assert (domains["arithmetic"].config.prompt_style, domains["fractions"].config.prompt_style) == ("chat", "compact")
    assert set(DomainConfig.model_fields) >= {"prompt_style", "system_prompt"}


def test_a_saved_copy_of_the_tiny_model_keeps_its_compact_prompts(tmp_path):
    # a warm start or checkpoint of the tiny model, loaded as model=hf, is asked in the form it
    # learned (its config.json says so), not in words: asked in words it fails every task
    from transformers import AutoModelForCausalLM

    from trainer.models.tiny_model import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny", hidden_size=16, layers=1, heads=2, kv_heads=1, intermediate_size=32)
    AutoModelForCausalLM.from_pretrained(tiny).save_pretrained(tmp_path / "warm-start")
    assert ModelConfig(type="hf", name_or_path=str(tmp_path / "warm-start")).domain_options() == {}
    assert ModelConfig(type="hf", name_or_path=str(tmp_path / "warm-start"),
                       prompt_style="chat").domain_options() == {"prompt_style": "chat"}
    config = json.loads((tmp_path / "warm-start" / "config.json").read_text())
    del config["palestra_prompt_style"]  # any other model folder: asked in words
    (tmp_path / "warm-start" / "config.json").write_text(json.dumps(config))
    assert ModelConfig(type="hf", name_or_path=str(tmp_path / "warm-start")).domain_options() == {"prompt_style": "chat"}


def _chatml(with_tools: bool) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with a ChatML template, which lists ``tools`` when asked to."""
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tools = "{% if tools %}TOOLS:{% for t in tools %} {{ t.name }}{% endfor %}\n{% endif %}" if with_tools else ""
    tokenizer.chat_template = (tools + "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return tokenizer


@pytest.mark.parametrize("with_tools", [True, False])
def test_tool_schemas_go_through_the_templates_tools_argument_where_it_takes_one(with_tools):
    domain = load("tool_calculator").configure({"prompt_style": "chat"})
    [task] = domain.sample(1, 1, random.Random(0))
    tokenizer = _chatml(with_tools)
    assert template_takes_tools(tokenizer) is with_tools
    messages, tools = offer_tools(task.prompt, template_takes_tools(tokenizer))
    rendered = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    names = [t["name"] for t in domain.environment(task).tools()]
    if with_tools:  # the template lists the tools; no system message is left with nothing to say
        assert rendered.startswith("TOOLS: " + " ".join(names)) and "<|system|>" not in rendered
        assert "<tools>" not in rendered
    else:  # the Hermes system message, as before the schemas travelled apart
        assert rendered.startswith("<|system|>You may call functions") and tools is None
        assert all(f'"name": "{n}"' in rendered for n in names)
    assert encode_prompt(tokenizer, task.prompt) == tokenizer(rendered, add_special_tokens=False)["input_ids"]
