"""Held-out evaluation, its summaries and the paired confidence interval of the GRPO gain."""
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch

from domains.api import Status, VerifyResult
from domains.registry import load_all
from trainer.config import EvalConfig
from trainer.models.loading import load_model, load_tokenizer
from trainer.models.tiny_model import build_tiny_model
from trainer.recipe.evaluate import evaluate, heldout_tasks, paired_gain_interval, summarise


def test_summarise_pools_levels_per_domain_and_averages_domains():
    hits = {("a", 1): [1.0, 0.0], ("a", 2): [1.0, 1.0], ("b", 1): [0.0, 0.0, 0.0, 1.0]}
    metrics = summarise(hits)
    assert metrics["eval/a/level1"] == 0.5 and metrics["eval/a/level2"] == 1.0
    assert metrics["eval/a"] == 0.75  # 3 of a's 4 tasks, not the mean of its level rates by accident
    assert metrics["eval/b"] == 0.25
    assert metrics["eval/macro"] == 0.5  # (0.75 + 0.25) / 2


def test_no_change_has_a_zero_width_interval():
    hits = {("a", 1): [1.0, 0.0, 1.0], ("b", 1): [0.0, 0.0]}
    assert paired_gain_interval(hits, hits) == (0.0, 0.0)


def test_every_task_of_one_domain_flipping_is_a_certain_gain():
    before = {("a", 1): [0.0] * 10, ("b", 1): [1.0] * 10}
    after = {("a", 1): [1.0] * 10, ("b", 1): [1.0] * 10}
    # domain a gains 1.0, b gains 0, so the macro gains 0.5 in every resample
    assert paired_gain_interval(before, after) == pytest.approx((0.5, 0.5))


def test_pairing_detects_a_small_gain():
    # 10 of 100 tasks go from wrong to right and none the other way: gain 0.1. Paired, the
    # resampled gain is 0.1 +- about 0.03, so the interval excludes zero; two independent 95%
    # intervals around 0.40 and 0.50 (each +- about 0.1) would overlap.
    before = {("a", 1): [1.0] * 40 + [0.0] * 60}
    after = {("a", 1): [1.0] * 50 + [0.0] * 50}
    low, high = paired_gain_interval(before, after)
    assert 0.0 < low < 0.1 < high < 0.2


def test_flips_both_ways_straddle_zero():
    before = {("a", 1): [1.0] * 10 + [0.0] * 10 + [1.0] * 30}
    after = {("a", 1): [0.0] * 10 + [1.0] * 10 + [1.0] * 30}
    low, high = paired_gain_interval(before, after)
    assert low < 0.0 < high


def test_the_interval_is_reproducible_for_a_seed():
    before = {("a", 1): [0.0, 1.0, 0.0, 1.0], ("b", 2): [1.0, 0.0, 0.0]}
    after = {("a", 1): [1.0, 1.0, 0.0, 0.0], ("b", 2): [1.0, 1.0, 0.0]}
    assert paired_gain_interval(before, after, seed=3) == paired_gain_interval(before, after, seed=3)


def test_domains_count_equally_however_many_tasks_they_have():
    # a: 10 tasks all flip (gain 1.0); b: 30 unchanged (gain 0). The macro gain is 0.5; an average
    # over all 40 tasks would say 0.25.
    before = {("a", 1): [0.0] * 10, ("b", 1): [1.0] * 30}
    after = {("a", 1): [1.0] * 10, ("b", 1): [1.0] * 30}
    assert paired_gain_interval(before, after) == pytest.approx((0.5, 0.5))


def test_a_domain_pools_its_levels_by_task():
    # a's level 1 (4 tasks) all flip, its level 2 (12 tasks) stays: a gains 4/16 = 0.25, not the
    # mean of its level gains (0.5); b is unchanged; the macro gain is 0.125 in every resample
    # because resampling within each cell keeps 4 flips out of 16.
    before = {("a", 1): [0.0] * 4, ("a", 2): [1.0] * 12, ("b", 1): [0.0] * 5}
    after = {("a", 1): [1.0] * 4, ("a", 2): [1.0] * 12, ("b", 1): [0.0] * 5}
    assert paired_gain_interval(before, after) == pytest.approx((0.125, 0.125))
    assert summarise(after)["eval/macro"] - summarise(before)["eval/macro"] == pytest.approx(0.125)


def test_evaluations_of_different_tasks_are_refused():
    with pytest.raises(ValueError, match="not of the same held-out tasks"):
        paired_gain_interval({("a", 1): [1.0]}, {("a", 1): [1.0, 0.0]})
    with pytest.raises(ValueError, match="not of the same held-out tasks"):
        paired_gain_interval({("a", 1): [1.0]}, {("b", 1): [1.0]})


# -- several samples per task, on a real tiny model ------------------------------------------------
class _LengthParityPool:
    """Verifies in the test process: success is the parity of the completion's length plus the
    task's prompt length, so it varies from task to task and, when sampling, between completions."""

    def __init__(self, domains):
        self.domains, self.submitted = domains, 0

    def submit(self, task, completion):
        self.submitted += 1
        future = Future()
        future.set_result(SimpleNamespace(result=VerifyResult(1.0, (len(completion) + len(str(task.prompt))) % 2 == 0, Status.OK, {})))
        return future

    def raise_if_broken(self):
        pass


def test_a_domain_with_few_levels_gets_enough_heldout_tasks_and_the_others_keep_theirs():
    domains = load_all(["arithmetic", "rg_course_schedule"], {"rg_*": {"max_level": 1}})
    plain = heldout_tasks(domains, 4, seed=1234)
    topped = heldout_tasks(domains, 4, seed=1234, min_per_domain=20)
    count = lambda tasks, name: sum(t.domain == name for t in tasks)  # noqa: E731
    assert (count(plain, "arithmetic"), count(plain, "rg_course_schedule")) == (20, 4)
    assert (count(topped, "arithmetic"), count(topped, "rg_course_schedule")) == (20, 20)
    assert [t.id for t in topped if t.domain == "arithmetic"] == [t.id for t in plain if t.domain == "arithmetic"]
    # the four tasks a one-level dataset drew at this seed all have one answer; twenty have both
    answers = lambda tasks: {t.payload["entry"]["answer"] for t in tasks if t.domain == "rg_course_schedule"}  # noqa: E731
    assert answers(plain) == {"False"} and answers(topped) == {"True", "False"}


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", hidden_size=32, layers=2, heads=2,
                                kv_heads=1, intermediate_size=64))
    domains = load_all(["arithmetic", "fractions", "tool_calculator"], {})  # two rollout kinds
    return load_model(path, torch.device("cpu")), load_tokenizer(path, tiny=True), domains


def _evaluate(setup, **kwargs):
    model, tokenizer, domains = setup
    pool = _LengthParityPool(domains)
    hits = evaluate(model, tokenizer, heldout_tasks(domains, 3, seed=0), pool, max_new_tokens=12, batch_size=8,
                    **kwargs)
    return hits, pool.submitted


def test_greedy_copies_of_a_task_score_what_one_greedy_completion_scores(tiny_setup):
    once, submitted_once = _evaluate(tiny_setup)
    thrice, submitted_thrice = _evaluate(tiny_setup, samples=3)
    assert submitted_thrice == 3 * submitted_once == 3 * 3 * 15  # 3 tasks at each of 3 x 5 levels
    assert {v for cell in once.values() for v in cell} == {0.0, 1.0}  # tasks differ, so a mix-up would show
    assert thrice == once  # each task's three identical completions averaged onto that task, not a neighbour


def test_sampled_tasks_score_their_share_of_successes(tiny_setup):
    hits, submitted = _evaluate(tiny_setup, samples=4, temperature=1.0)
    assert submitted == 4 * 45 and all(len(values) == 3 for values in hits.values())
    values = [v for cell in hits.values() for v in cell]
    assert all(v * 4 == int(v * 4) for v in values)
    assert any(0 < v < 1 for v in values)  # an untrained model's lengths vary between samples


def test_several_samples_need_a_temperature():
    with pytest.raises(ValueError, match="more than one sample per task needs temperature > 0"):
        EvalConfig(samples=4)
    assert EvalConfig(samples=4, temperature=0.7).samples == 4
