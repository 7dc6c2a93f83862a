"""The SFT warm start's micro-batches: examples of similar length together, padding that changes nothing."""
import random
from types import SimpleNamespace

import pytest
import torch

from domains.registry import load_all
from trainer.models.loading import load_model, load_tokenizer
from trainer.models.tiny_model import build_tiny_model
from trainer.recipe.sft import _accumulate, warm_start_counts
from trainer.update.supervised import length_buckets, reference_pairs, supervised_loss


def fake_example(prompt: int, completion: int):
    return [7] * prompt, [8] * completion, [1] * completion


def test_length_buckets_keep_every_example_within_the_token_budget():
    rng = random.Random(0)
    examples = [fake_example(rng.randint(5, 40), rng.randint(1, 200)) for _ in range(64)]
    buckets = length_buckets(examples, max_tokens=512)

    flat = [e for bucket in buckets for e in bucket]
    assert sorted(map(id, flat)) == sorted(map(id, examples))  # each example once, none lost
    lengths = [len(p) + len(c) for p, c, _ in flat]
    assert lengths == sorted(lengths)  # shortest first, so each bucket pads to similar rows
    for bucket in buckets:
        assert len(bucket) * max(len(p) + len(c) for p, c, _ in bucket) <= 512
    assert len(buckets) < len(examples) // 2  # short rows do share micro-batches


def test_an_example_longer_than_the_budget_gets_a_bucket_of_its_own():
    long, short = fake_example(10, 600), fake_example(3, 3)
    assert length_buckets([long, short, short], max_tokens=100) == [[short, short], [long]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    torch.manual_seed(0)
    domains = load_all(["arithmetic", "tool_calculator"])
    rng = random.Random(3)
    tasks = [domains[name].sample(level, 1, rng)[0] for name in domains for level in (1, 3, 5)]
    return load_tokenizer(path, tiny=True), load_model(path, torch.device("cpu")), domains, tasks


def test_padding_a_short_example_next_to_a_long_one_changes_neither_loss(setup):
    tok, model, domains, tasks = setup
    examples = reference_pairs(tok, tasks, domains)
    with torch.no_grad():
        alone = [supervised_loss(model, [e], tok.pad_token_id) for e in examples]
        together = supervised_loss(model, examples, tok.pad_token_id)
    # the joint loss is the token-weighted mean of the separate ones, whatever the padding
    tokens = torch.tensor([sum(mask) for *_, mask in examples], dtype=torch.float32)
    expected = (torch.stack(alone) * tokens).sum() / tokens.sum()
    assert together.item() == pytest.approx(expected.item(), rel=1e-5)


def test_the_warm_start_loss_and_gradient_do_not_depend_on_the_buckets(setup):
    tok, model, domains, tasks = setup
    examples = reference_pairs(tok, tasks, domains)

    def loss_and_grad(max_tokens):
        model.zero_grad(set_to_none=True)
        loss = _accumulate(model, tok, tasks, domains, max_tokens)
        return loss, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    assert len(length_buckets(examples, 256)) > 2 and len(length_buckets(examples, 10**6)) == 1
    one_loss, one_grad = loss_and_grad(10**6)
    many_loss, many_grad = loss_and_grad(256)
    # every example counts alike: the mean of each one's own token-mean loss, computed one at a time
    with torch.no_grad():
        by_hand = sum(supervised_loss(model, [e], tok.pad_token_id).item() for e in examples) / len(examples)
    assert one_loss == pytest.approx(by_hand, rel=1e-5) and many_loss == pytest.approx(by_hand, rel=1e-5)
    assert many_grad.abs().sum() > 0
    assert torch.allclose(one_grad, many_grad, rtol=1e-4, atol=1e-6)


def test_the_warm_start_draw_is_pinned():
    """A run's warm-start batches follow from its seed alone. A change in how they are drawn would
    silently change every run's numbers, so the draw is pinned (the values of the inline loop that
    warm_start_counts replaced): domains alike, level i+1 half as likely as level i here."""
    domains = {"b": SimpleNamespace(levels=(1, 2, 3)), "a": SimpleNamespace(levels=(1, 2))}
    rng = random.Random("sft/0")
    assert warm_start_counts(domains, 0.5, 12, rng) == {("a", 1): 4, ("a", 2): 2, ("b", 1): 3, ("b", 2): 3}
    assert warm_start_counts(domains, 0.5, 12, rng) == {("a", 1): 4, ("a", 2): 2, ("b", 1): 5, ("b", 2): 1}
