"""The store rows a GRPO step writes: every generated completion, with the advantage it trained on."""
import numpy as np
import torch

from curriculum.steps import domain_metrics, outcomes
from curriculum.types import rewards_agree
from domains.api import Status, Task, VerifyResult, user_prompt
from domains.math.generated import ARITHMETIC
from domains.verify.pool import Verdict
from trainer.sampling.batch import StepBatch
from trainer.sampling.collect import StepRollouts
from trainer.update.losses import group_advantages

G = 2
TASK = Task("arithmetic", 1, user_prompt("2+2="), {"answer": "4"})


def _batch(rewards: list[list[float]]) -> StepBatch:
    """One task (the same one) per group; the rollout is not read when rows are written."""
    flat = [r for group in rewards for r in group]
    verdicts = [Verdict(VerifyResult(r, r == 1.0, Status.OK if r == 1.0 else Status.WRONG), 0.0) for r in flat]
    return StepBatch(tasks=[TASK] * len(rewards), group_size=G, rollout=None,
                     texts=[f"text{i}" for i in range(len(flat))], verdicts=verdicts)


def _rows(generated, kept, advantages):
    groups = StepRollouts(batch=None, generated=generated, kept=kept).groups(advantages)
    return outcomes(groups, {"arithmetic": ARITHMETIC})


def test_a_task_drawn_twice_keeps_each_groups_advantages():
    batch = _batch([[1.0, 0.0], [0.0, 0.0]])
    advantages = group_advantages(batch.rewards)  # [[+1, -1], [0, 0]] up to the eps in the std
    rows = _rows([batch], [(0, 0), (0, 1)], advantages)
    assert [r.group for r in rows] == [0, 0, 1, 1]
    assert [round(r.advantage, 3) for r in rows] == [1.0, -1.0, 0.0, 0.0]


def test_a_discarded_group_stores_zero_and_its_refill_the_trained_advantages():
    first = _batch([[1.0, 0.0], [0.0, 0.0]])  # group 1 has no variance: dynamic sampling drops it
    refill = _batch([[0.0, 1.0]])
    kept = [(0, 0), (1, 0)]
    advantages = group_advantages(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    rows = _rows([first, refill], kept, advantages)
    assert [r.group for r in rows] == [0, 0, 1, 1, 2, 2]
    assert [round(r.advantage, 3) for r in rows] == [1.0, -1.0, 0.0, 0.0, -1.0, 1.0]
    assert [r.completion for r in rows] == ["text0", "text1", "text2", "text3", "text0", "text1"]


def test_domain_metrics_count_what_the_verifier_could_not_judge_apart_from_wrong_answers():
    batch = _batch([[1.0, 0.0], [0.0, 0.0]])
    batch.verdicts[1] = Verdict(VerifyResult.no_verdict("verifier worker died"), 0.0)
    batch.verdicts[2] = Verdict(VerifyResult.failure(Status.ERROR, "program exited (code 3)"), 0.0)
    groups = StepRollouts(batch=None, generated=[batch], kept=[]).groups(torch.zeros(0, G))
    stats = domain_metrics(groups)["arithmetic"]
    assert (stats["errors"], stats["unscored"], stats["format_errors"]) == (2, 1, 0)
    assert stats["success"] == 0.25 and stats["zero_var"] == 0.5


def test_one_definition_of_a_group_whose_rewards_all_agree():
    rewards = np.array([[1.0, 1.0], [0.3, 0.3 + 1e-12], [0.0, 0.5]])  # float error is no variance
    assert rewards_agree(rewards).tolist() == [True, True, False]
    batch = _batch([[1.0, 1.0], [0.0, 1.0]])
    assert batch.zero_variance().tolist() == [True, False]


def test_the_first_format_error_of_each_domain_is_kept_to_quote():
    from curriculum.steps import format_error_examples

    batch = _batch([[1.0, 0.0], [0.0, 0.0]])
    batch.verdicts[1] = Verdict(VerifyResult.failure(Status.FORMAT_ERROR, "no boxed answer"), 0.0)
    batch.verdicts[3] = Verdict(VerifyResult.failure(Status.FORMAT_ERROR, "no boxed answer"), 0.0)
    groups = StepRollouts(batch=None, generated=[batch], kept=[]).groups(torch.zeros(0, G))
    assert format_error_examples(groups) == {"arithmetic": "text1"}
    stats = domain_metrics(groups)["arithmetic"]
    assert (stats["completions"], stats["format_errors"]) == (4, 2)


def test_per_domain_metric_values_are_read_by_domain_and_name_only():
    from curriculum.steps import domain_values

    metrics = {"domain/a/success": 0.5, "domain/a/level1/success": 1.0, "domain/b/success": 0.25, "success": 9}
    assert domain_values(metrics, "success") == {"a": 0.5, "b": 0.25}
