"""The async pipeline (trainer.system.pipeline=async): rollouts of step t+1 sampled during step t's
update by the policy from before it, corrected in the loss by the behaviour log-probs."""
import json
import math
import os
import signal

import pytest
import torch

from curriculum.store import StatsStore
from trainer.config import ConfigError, TrainerConfig, validate_config
from trainer.recipe.grpo import GRPORecipe
from trainer.recipe.health import HealthConfig, HealthMonitor
from trainer.sampling.rollout import generate
from trainer.update.logprobs import sequence_logprobs
from trainer.update.losses import behaviour_gap, grpo_loss
from quick_settings import quick
from test_end_to_end import plugin_package  # noqa: F401  # the digit_variety domain: varied rewards from step 1

TINY = {"type": "tiny", "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}}


def config(tmp_path, pipeline: str, **trainer):
    raw = {
        "name": "async", "seed": 5, "output_dir": str(tmp_path / "run"), "model": TINY,
        "domains": ["digit_variety", "tool_calculator"], "policy": {"type": "learnability"},
        "difficulty": {"type": "threshold"},
        "trainer": {"steps": 3, "prompts_per_step": 4, "group_size": 4, "optim": {"lr": 1e-2, "micro_batch_size": 16},
                    "sampling": {"max_new_tokens": 8, "max_episode_tokens": 60, "rollout_batch_size": 16},
                    "system": {"table_every": 1, "pipeline": pipeline}, **trainer},
        "verifier": {"workers": 1}, "sft": {"steps": 0}, "eval": {"tasks_per_level": 1},
    }
    return validate_config(quick(raw))


def train(cfg) -> tuple[list[dict], list[dict], list[dict]]:
    """Run ``cfg``'s steps; the per-step metrics returned, those stored, and every stored result."""
    recipe = GRPORecipe(cfg)
    try:
        recipe.setup()
        returned = [recipe.train_step(step) for step in range(1, cfg.trainer.steps + 1)]
    finally:
        recipe.cleanup()
    with StatsStore(f"sqlite:///{cfg.output_dir}/palestra.db") as store:
        [run] = store.runs()
        return returned, store.metrics(run["id"]), store.results(run["id"])


def test_async_trains_end_to_end_and_plans_each_step_before_the_last_one_is_recorded(tmp_path, plugin_package):
    returned, stored, results = train(config(tmp_path / "async", "async"))
    # every step recorded once, with all of its P x G completions
    assert [m["step"] for m in stored] == [1, 2, 3]
    assert sorted({r["step"] for r in results}) == [1, 2, 3]
    assert all(sum(r["step"] == s for r in results) == 4 * 4 for s in (1, 2, 3))
    # the plan of step t+1 was made before step t was recorded: it saw step t-1's statistics at most
    assert [m["plan/seen_step"] for m in stored] == [0, 0, 1]
    # the first step is sampled by the policy itself; the later ones one update behind
    assert [m["async/staleness"] for m in returned] == [0.0, 1.0, 1.0]
    for m in returned:
        assert m["async/log_ratio_std"] >= 0 and 0 <= m["async/clip_frac"] <= 1
    # with no update between sampling and training, pi_old is the behaviour policy up to float error
    assert returned[0]["async/log_ratio_max"] < 1e-4
    assert all(m["grad_norm"] > 0 for m in returned)  # digit_variety's rewards vary: every update moves the policy
    # a stale sampler (lr 1e-2 moves the tiny model) shows a gap the on-policy first step does not
    assert max(m["async/log_ratio_max"] for m in returned[1:]) > 10 * returned[0]["async/log_ratio_max"]
    logged = [json.loads(line) for line in open(tmp_path / "async" / "run" / "metrics.jsonl")]
    assert [r["step"] for r in logged if r["phase"] == "train"] == [1, 2, 3]


def test_sync_plans_after_the_last_step_is_recorded_and_reports_no_async_metrics(tmp_path, plugin_package):
    returned, stored, _ = train(config(tmp_path / "sync", "sync", steps=2))
    assert [m["plan/seen_step"] for m in stored] == [0, 1]
    assert not any(key.startswith("async/") for m in returned for key in m)


def test_the_sampler_records_the_log_probs_the_update_computes_for_the_same_policy():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, pad_token_id=0)).eval()
    prompts = [[3, 4, 5], [3, 4, 5], [7, 8]]
    out = generate(model, prompts, max_new_tokens=6, eos_id=1, pad_id=0, temperature=0.7,
                   generator=torch.Generator().manual_seed(1), with_logprobs=True)
    assert out.logprobs is not None and out.logprobs.shape == out.completion_mask.shape
    with torch.no_grad():
        recomputed, _ = sequence_logprobs(model, out.sequences, out.attention_mask, out.prompt_width, temperature=0.7)
    counted = out.completion_mask.bool()
    assert torch.allclose(out.logprobs[counted], recomputed[counted], atol=1e-5)
    assert (out.logprobs[~counted] == 0).all()
    # asking for them leaves the sampled tokens alone
    plain = generate(model, prompts, max_new_tokens=6, eos_id=1, pad_id=0, temperature=0.7,
                     generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain.sequences, out.sequences) and plain.logprobs is None


def _loss_and_grad(behaviour: torch.Tensor | None, is_cap: float = 2.0):
    logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_(True)
    out = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 2), aggregation="token_mean",
                    behaviour_logp=behaviour, is_cap=is_cap)
    out.loss.backward()
    return out, logp.grad


def test_the_importance_weight_is_pi_old_over_the_behaviour_policy_truncated_at_the_cap():
    on_policy, grad = _loss_and_grad(None)
    same, same_grad = _loss_and_grad(torch.log(torch.tensor([[0.5, 0.5]])))
    assert torch.allclose(same_grad, grad) and same.is_truncated_frac == 0.0
    # the sampler gave the first token 0.25 and the second 0.4: weights 2 and 1.25
    gapped, gapped_grad = _loss_and_grad(torch.log(torch.tensor([[0.25, 0.4]])))
    assert torch.allclose(gapped_grad, grad * torch.tensor([[2.0, 1.25]]))
    assert gapped.policy_loss == pytest.approx(on_policy.policy_loss * (2.0 + 1.25) / 2)
    # 0.1 would weigh 5: truncated at the cap of 2
    capped, capped_grad = _loss_and_grad(torch.log(torch.tensor([[0.1, 0.5]])), is_cap=2.0)
    assert torch.allclose(capped_grad, grad * torch.tensor([[2.0, 1.0]]))
    assert capped.is_truncated_frac == pytest.approx(0.5)


def test_behaviour_gap_sums_the_log_ratio_over_counted_tokens_only():
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    behaviour = torch.tensor([[-1.5, -1.0, 0.0]])
    total, squares, largest, n = behaviour_gap(old, behaviour, torch.tensor([[1, 1, 0]]))
    assert (total, squares, largest, n) == (pytest.approx(-0.5), pytest.approx(1.25), pytest.approx(1.0), 2)


def test_a_written_token_with_no_behaviour_log_prob_weighs_one_and_does_not_count_as_lag():
    # a lead the trainer wrote has NaN for its behaviour log-prob: the first token here
    _, grad = _loss_and_grad(None)
    written, written_grad = _loss_and_grad(torch.tensor([[float("nan"), math.log(0.25)]]))
    assert torch.allclose(written_grad, grad * torch.tensor([[1.0, 2.0]]))
    assert written.is_truncated_frac == 0.0 and not torch.isnan(written.loss)
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    total, squares, largest, n = behaviour_gap(old, torch.tensor([[float("nan"), -1.0, float("nan")]]),
                                               torch.tensor([[1, 1, 1]]))
    assert (total, squares, largest, n) == (pytest.approx(-1.0), pytest.approx(1.0), pytest.approx(1.0), 1)


def test_a_drifted_behaviour_policy_raises_an_alarm():
    monitor = HealthMonitor(HealthConfig(behaviour_drift_max=0.3))
    assert monitor.after_step({"loss": 0.1, "async/log_ratio_std": 0.1}) == []
    [alarm] = monitor.after_step({"loss": 0.1, "async/log_ratio_std": 0.6})
    assert "behaviour policy drift" in alarm and "0.6" in alarm


@pytest.mark.parametrize("pipeline, trainer, message", [
    ("async", {"max_staleness": 2}, "max_staleness=2 is not supported"),
    ("async", {"rollout_backend": "captured"}, "rollout_backend=hf"),
    ("async", {"sharding": "fsdp"}, "sharding=replicate"),
    ("sometimes", {}, "pipeline"),
])
def test_unsupported_async_settings_are_refused_in_one_line(tmp_path, pipeline, trainer, message):
    with pytest.raises(ConfigError, match=message) as info:
        config(tmp_path, pipeline, **trainer)
    assert "\n" not in str(info.value)


def test_async_samples_with_the_eager_sampler_on_any_device():
    assert TrainerConfig.model_validate({"system": {"pipeline": "async"}}).sampler_kind("cuda") == "hf"
    assert TrainerConfig().sampler_kind("cuda") == "captured"


def _rows(cfg) -> dict[int, list[tuple]]:
    with StatsStore(f"sqlite:///{cfg.output_dir}/palestra.db") as store:
        [run] = store.runs()
        rows = store.results(run["id"])
    return {s: sorted((r["task_id"], r["completion"], r["reward"]) for r in rows if r["step"] == s)
            for s in sorted({r["step"] for r in rows})}


def test_an_async_run_stopped_between_steps_resumes_as_the_uninterrupted_run_goes_on(tmp_path, plugin_package):
    straight = GRPORecipe(config(tmp_path / "straight", "async", steps=4))
    try:
        straight.setup()
        straight.train()
        straight_params = {k: v.detach().clone() for k, v in straight.model.named_parameters()}
    finally:
        straight.cleanup()

    stopped = GRPORecipe(config(tmp_path / "stopped", "async", steps=4))
    stepping = stopped.train_step

    def sigterm_after_step_2(step: int) -> dict:
        metrics = stepping(step)
        if step == 2:  # as a cluster's requeue would: the step finishes, a checkpoint is saved, the run stops
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    stopped.train_step = sigterm_after_step_2
    try:
        stopped.setup()
        with pytest.raises(KeyboardInterrupt):
            stopped.train()
    finally:
        stopped.cleanup("interrupted")
    state = torch.load(tmp_path / "stopped" / "run" / "checkpoints" / "step-0000002" / "trainer_state.pt",
                       weights_only=False)
    assert state["pipeline_ahead"].plan.step == 3  # step 3's rollouts, sampled during step 2's update

    resumed = GRPORecipe(config(tmp_path / "stopped", "async", steps=4).model_copy(update={"resume": "auto"}))
    try:
        resumed.setup()
        assert resumed.start_step == 2
        resumed.train()
        resumed_params = dict(resumed.model.named_parameters())
    finally:
        resumed.cleanup()
    straight_rows, resumed_rows = _rows(straight.cfg), _rows(resumed.cfg)
    assert sorted(resumed_rows) == [1, 2, 3, 4]
    assert resumed_rows == straight_rows  # the same completions and rewards at every step, the in-flight one too
    assert all(torch.equal(resumed_params[k], v) for k, v in straight_params.items())


def test_async_trains_lora_adapters_with_the_sampler_copy_taking_the_adapters_too(tmp_path, plugin_package):
    cfg = config(tmp_path, "async", steps=3)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={
        "lora": cfg.model.lora.model_copy(update={"enabled": True, "rank": 4, "alpha": 8})})})
    recipe = GRPORecipe(cfg)
    try:
        recipe.setup()
        initial = {k: v.detach().clone() for k, v in recipe.model.named_parameters()}
        recipe.train_step(1)
        after_first = {k: v.detach().clone() for k, v in recipe.model.named_parameters()}
        second = recipe.train_step(2)  # step 3 was sampled during it, by the weights after update 1
        sampler = dict(recipe.pipeline.model.named_parameters())
    finally:
        recipe.cleanup()
    adapters = [k for k in initial if "lora_" in k]
    assert adapters and any(not torch.equal(initial[k], after_first[k]) for k in adapters)  # update 1 moved them
    assert all(torch.equal(sampler[k], after_first[k]) for k in initial)
    assert second["async/staleness"] == 1.0 and second["async/log_ratio_max"] > 0
