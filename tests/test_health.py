"""Health alarms fire on the conditions they name, and only then."""
import torch

from trainer.recipe.health import HealthConfig, HealthMonitor


def test_kl_and_entropy_bounds():
    monitor = HealthMonitor(HealthConfig(kl_max=0.1, entropy_min=0.5, entropy_max=3.0))
    assert monitor.after_step({"loss": 0.1, "kl": 0.05, "entropy": 1.0, "reward/mean": 0.2}) == []
    alarms = monitor.after_step({"loss": 0.1, "kl": 0.5, "entropy": 0.1, "reward/mean": 0.2})
    assert any("KL" in a for a in alarms) and any("below" in a for a in alarms)
    assert any("above 3.0" in a for a in monitor.after_step({"loss": 0.1, "entropy": 4.0}))


def test_non_finite_loss_alarm():
    assert HealthMonitor(HealthConfig()).after_step({"loss": float("nan")})


def test_reward_up_while_heldout_down_is_flagged():
    monitor = HealthMonitor(HealthConfig(reward_window=5, heldout_drop_max=None))  # this alarm alone
    assert monitor.after_eval(0.9) == []  # before any training step there is no reward to compare
    for _ in range(5):
        monitor.after_step({"loss": 0.0, "reward/mean": 0.2})
    assert monitor.after_eval(0.5) == []  # the first evaluation only sets the baseline
    for _ in range(10):
        monitor.after_step({"loss": 0.0, "reward/mean": 0.8})
    [alarm] = monitor.after_eval(0.3)
    assert "reward hacking" in alarm
    # both rising is healthy
    for _ in range(10):
        monitor.after_step({"loss": 0.0, "reward/mean": 0.95})
    assert monitor.after_eval(0.6) == []


def test_a_large_fall_below_the_best_evaluation_is_flagged_whatever_the_reward():
    # the numbers of a measured run (lr 2e-4, code domains): 0.700, 0.688, 0.731, then 0.544
    monitor = HealthMonitor(HealthConfig(heldout_drop_max=0.1))
    assert monitor.after_eval(0.700) == []
    for _ in range(5):
        monitor.after_step({"loss": 0.0, "reward/mean": 0.5})
    assert monitor.after_eval(0.688) == []  # within 0.1 of the best
    assert monitor.after_eval(0.731) == []
    for _ in range(5):
        monitor.after_step({"loss": 0.0, "reward/mean": 0.4})  # reward fell too: no hacking alarm
    [alarm] = monitor.after_eval(0.544)
    assert "0.187 below its best (0.731)" in alarm and "forgetting" in alarm
    assert HealthMonitor(HealthConfig(heldout_drop_max=None)).after_eval(0.1) == []


def test_the_alarms_survive_a_checkpoint_round_trip():
    before = HealthMonitor(HealthConfig(heldout_drop_max=0.1))
    for _ in range(5):
        before.after_step({"loss": 0.0, "reward/mean": 0.3})
    before.after_eval(0.731)
    saved = torch.load(_saved(before.state_dict()), weights_only=False)  # as checkpoints store it
    resumed = HealthMonitor(HealthConfig(heldout_drop_max=0.1))
    resumed.load_state_dict(saved)
    for _ in range(5):
        resumed.after_step({"loss": 0.0, "reward/mean": 0.5})
    alarms = resumed.after_eval(0.544)
    assert len(alarms) == 2  # forgetting (0.187 below 0.731) and reward 0.3 -> 0.4 up while held-out fell
    assert "below its best (0.731)" in alarms[1] and "0.300 -> 0.400" in alarms[0]
    resumed.forget_evaluations()  # other held-out tasks: no yardstick left
    assert resumed.after_eval(0.1) == []


def _saved(state: dict):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_console_tables_fit_long_domain_names():
    from trainer.recipe.evaluate import format_eval
    from trainer.recipe.metrics import domain_table

    long = "rg_palindrome_generation"
    table = domain_table({"step": 3, f"domain/{long}/reward": 0.5, "domain/x/tool_calls": 1.0})
    header, row = table.splitlines()[1], table.splitlines()[2]
    assert header.split() == ["domain", "weight", "level", "prompts", "reward", "zero_var", "errors", "tool_calls"]
    assert row.split()[0] == long and row.split()[4] == "0.500"
    text = format_eval({f"eval/{long}": 0.25, "eval/macro": 0.25}, "held-out")
    assert text.splitlines()[1].split() == [long, "0.250"]


def test_an_update_that_trained_no_row_raises_no_kl_or_entropy_alarm():
    monitor = HealthMonitor(HealthConfig(kl_max=0.1, entropy_min=0.5))
    assert monitor.after_step({"loss": 0.0, "grad_norm": 0.0, "reward/mean": 1.0}) == []


def test_a_domain_whose_verifier_cannot_judge_is_named_once():
    monitor = HealthMonitor(HealthConfig())
    step = {"step": 3, "domain/code_lists/unscored": 16, "domain/arithmetic/unscored": 0, "domain/code_lists/errors": 16}
    assert monitor.after_step(step) == [
        "the verifier of code_lists could not judge 16 completions of step 3; they count as failures "
        "(palestra verify says why)"]
    assert monitor.after_step({**step, "step": 4}) == []  # once per domain: a missing sandbox fails every step
    resumed = HealthMonitor(HealthConfig())
    resumed.load_state_dict(torch.load(_saved(monitor.state_dict()), weights_only=False))
    assert resumed.after_step({**step, "step": 5}) == []  # said before the checkpoint: not again after a resume
    assert monitor.after_step({"step": 5, "domain/arithmetic/unscored": 1}) != []


def _formats(domain: str, errors: int, completions: int) -> dict:
    return {"loss": 0.0, f"domain/{domain}/completions": completions, f"domain/{domain}/format_errors": errors}


def test_a_domain_whose_completions_are_nearly_all_format_errors_is_named_once_with_a_quote():
    monitor = HealthMonitor(HealthConfig(format_window=4))
    chat = {"arithmetic": "The Fibonacci sequence is a series of numbers in which each number is the sum"}
    assert monitor.after_step({**_formats("arithmetic", 19, 20), **_formats("fractions", 10, 20)}, chat) == [
        "19 of the 20 completions of arithmetic over its last 1 steps were format errors (the verifier found no "
        "answer where it reads one), e.g. 'The Fibonacci sequence is a series of numbers in which each number is "
        "the sum': does the prompt ask for the format its verifier reads?"]
    assert monitor.after_step(_formats("arithmetic", 20, 20), chat) == []  # said once
    for _ in range(3):  # fractions: half of them, then all, but the window still holds the half
        assert monitor.after_step(_formats("fractions", 20, 20)) == []
    state = monitor.state_dict()
    resumed = HealthMonitor(HealthConfig(format_window=4))
    resumed.load_state_dict(state)
    [alarm] = resumed.after_step(_formats("fractions", 20, 20))  # the half left the window of 4
    assert alarm.startswith("80 of the 80 completions of fractions over its last 4 steps")
    assert resumed.after_step(_formats("arithmetic", 20, 20)) == []  # said before the resume
    assert HealthMonitor(HealthConfig(format_error_share=None)).after_step(_formats("arithmetic", 20, 20)) == []
