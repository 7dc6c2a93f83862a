"""Hand-computed checks of advantages, the clipped loss and each aggregation."""
import math

import pytest
import torch
from torch.testing import assert_close

from trainer.update.logprobs import pick
from trainer.update.losses import aggregate, grpo_loss, group_advantages, kl_k3


def test_group_advantages_group_std():
    # group [1, 0, 0, 1]: mean 0.5, population std 0.5 -> (r - 0.5) / 0.5 = [1, -1, -1, 1]
    # group [1, 1, 1, 1]: all agree -> centred rewards are 0 -> advantages 0 (no signal)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    adv = group_advantages(rewards, "group", eps=0.0 + 1e-12)
    assert_close(adv, torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))


def test_group_advantages_batch_std_and_none():
    # rewards [[1, 0], [1, 1]]: centred by group -> [[0.5, -0.5], [0, 0]]
    # batch std of {1, 0, 1, 1}: mean 0.75, var = (3 * 0.0625 + 0.5625) / 4 = 0.1875, std = 0.43301
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    batch = group_advantages(rewards, "batch", eps=0.0)
    assert_close(batch, torch.tensor([[0.5 / 0.4330127, -0.5 / 0.4330127], [0.0, 0.0]]))
    # Dr. GRPO: no std at all, only the group mean is removed
    assert_close(group_advantages(rewards, "none"), torch.tensor([[0.5, -0.5], [0.0, 0.0]]))


def test_mean_abs_advantage_identity():
    # With 0/1 rewards and k of G correct (p = k/G), mean |A| = 2 sqrt(p(1-p)).
    # k=2, G=8 (p=.25): centred values 0.75 and -0.25, std sqrt(.1875) = .4330 -> |A| = 1.732, 0.577;
    # mean |A| = (2 * 1.732 + 6 * 0.577) / 8 = 0.866 = 2 sqrt(p(1-p)).
    rewards = torch.tensor([[1.0, 1.0, 0, 0, 0, 0, 0, 0]])
    adv = group_advantages(rewards, "group", eps=0.0)
    assert math.isclose(adv.abs().mean().item(), 2 * math.sqrt(0.25 * 0.75), rel_tol=1e-5)


def _two_sequences():
    # ratios per token: seq0 [1.0, 1.5, 0.5] with A=+1; seq1 [1.0, 1.5, 0.5] with A=-1
    # seq1's last token is padding (mask 0)
    old = torch.log(torch.full((2, 3), 0.2))
    ratios = torch.tensor([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]])
    logp = (old + torch.log(ratios)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logp, old, adv, mask


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        # per-token losses, eps = 0.2:
        #   seq0 (A=+1): -min(r, clip(r)) = [-1.0, -1.2, -0.5] -> sum -2.7, mean -0.9
        #   seq1 (A=-1): max(r, clip(r)) = [1.0, 1.5, (masked)] -> sum 2.5, mean 1.25
        ("seq_mean", (-0.9 + 1.25) / 2),  # 0.175
        ("token_mean", (-2.7 + 2.5) / 5),  # -0.04
        ("constant", (-2.7 + 2.5) / (2 * 4)),  # -0.025 with max_tokens = 4
    ],
)
def test_clipped_loss_aggregations(aggregation, expected):
    logp, old, adv, mask = _two_sequences()
    out = grpo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, aggregation=aggregation, max_tokens=4)
    assert_close(out.loss, torch.tensor(expected))
    # only seq0's token 1 (ratio 1.5 > 1.2 with A > 0) is clipped high: 1 of 5 counted tokens
    assert out.clip_high_frac == pytest.approx(0.2)
    assert out.clip_low_frac == pytest.approx(0.0)


def test_clipped_token_has_no_gradient():
    logp, old, adv, mask = _two_sequences()
    grpo_loss(logp, old, adv, mask, aggregation="token_mean").loss.backward()
    # d/dlogp of -r*A at r=1 with A=+1 over 5 tokens: -1/5; the clipped token: 0; masked token: 0
    assert_close(logp.grad[0, 0], torch.tensor(-0.2))
    assert_close(logp.grad[0, 1], torch.tensor(0.0))
    assert_close(logp.grad[1, 2], torch.tensor(0.0))
    # seq1 token 1: ratio 1.5 with A=-1 is not clipped (pessimistic branch): d(r)/dlogp = r = 1.5
    assert_close(logp.grad[1, 1], torch.tensor(1.5 / 5))


def test_asymmetric_clip_higher():
    logp, old, adv, mask = _two_sequences()
    # eps_high = 0.6 lets ratio 1.5 through unclipped: seq0 becomes [-1, -1.5, -0.5]
    out = grpo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.6, aggregation="token_mean")
    assert_close(out.loss, torch.tensor((-3.0 + 2.5) / 5))
    assert out.clip_high_frac == 0.0


def test_kl_k3_values_and_penalty():
    # logp = log .5, ref = log .25: log ratio = log .5 -> .5 + .693147 - 1 = 0.193147
    assert_close(kl_k3(torch.log(torch.tensor(0.5)), torch.log(torch.tensor(0.25))), torch.tensor(0.193147))
    assert kl_k3(torch.tensor(-1.0), torch.tensor(-1.0)).item() == 0.0
    logp, old, adv, mask = _two_sequences()
    ref = old.clone()  # ratio to reference equals the ratio to old
    plain = grpo_loss(logp, old, adv, mask, aggregation="token_mean")
    with_kl = grpo_loss(logp, old, adv, mask, aggregation="token_mean", ref_logp=ref, beta=0.1)
    expected_kl = kl_k3(logp.detach(), ref)[mask.bool()].mean()
    assert with_kl.kl == pytest.approx(expected_kl.item(), rel=1e-5)
    assert_close(with_kl.loss, plain.loss + 0.1 * expected_kl)


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "median", 1)


def test_token_logprobs_matches_log_softmax():
    logits = torch.tensor([[[2.0, 0.0, 0.0]]])
    # log softmax of [2, 0, 0] at index 0: 2 - log(e^2 + 2) = -0.2395
    assert_close(pick(logits, torch.tensor([[0]]))[0], torch.tensor([[2 - math.log(math.e**2 + 2)]]))


def test_the_lr_schedule_warms_up_then_holds_or_decays_towards_zero():
    from trainer.update.schedule import lr_factor

    # 10 updates, 2 of warm-up: factors after 0..9 earlier updates
    assert [lr_factor(s, 2, 10, "constant") for s in range(10)] == [0.5] + [1.0] * 9
    # linear: 1 from the end of warm-up, then down by 1/8 an update, 1/8 left for the last one
    assert [lr_factor(s, 2, 10, "linear") for s in range(10)] == pytest.approx([0.5, 1.0] + [1 - k / 8 for k in range(8)])
    cosine = [lr_factor(s, 2, 10, "cosine") for s in range(10)]
    assert cosine[1] == cosine[2] == 1.0 and cosine[6] == pytest.approx(0.5)  # halfway through the decay: half
    assert all(a > b > 0 for a, b in zip(cosine[2:], cosine[3:]))
    assert lr_factor(0, 0, 10, "linear") == 1.0 and lr_factor(3, 5, 5, "cosine") == 0.8  # still warming up
    assert lr_factor(5, 5, 5, "linear") == lr_factor(7, 5, 3, "cosine") == 1.0  # no steps left to decay over


def test_a_resumed_schedule_takes_the_configured_rate_and_keeps_its_place():
    from trainer.update.schedule import apply_settings, lr_factor

    def optimizer_and_schedule(lr):
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr, weight_decay=0.0)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, 2, 10, "linear"))

    optimizer, schedule = optimizer_and_schedule(1e-4)
    for _ in range(4):  # four updates: the next one's factor is 1 - 2/8 = 0.75
        optimizer.step()
        schedule.step()
    saved = optimizer.state_dict(), schedule.state_dict()

    def loaded():  # loading alone brings back the old rate and weight decay ...
        fresh, fresh_schedule = optimizer_and_schedule(1e-4)
        fresh.load_state_dict(saved[0])
        fresh_schedule.load_state_dict(saved[1])
        return fresh, fresh_schedule

    same, same_schedule = loaded()
    apply_settings(same, same_schedule, 1e-4, 0.0)
    assert same.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]  # unchanged settings: the very same rate
    other, other_schedule = loaded()
    apply_settings(other, other_schedule, 3e-4, 0.01)  # ... a resume with new ones applies them
    assert other.param_groups[0]["lr"] == pytest.approx(3e-4 * 0.75)
    assert other.param_groups[0]["weight_decay"] == 0.01 and other_schedule.get_last_lr() == [other.param_groups[0]["lr"]]
    other.step()
    other_schedule.step()  # and the decay goes on from there: 1 - 3/8
    assert other.param_groups[0]["lr"] == pytest.approx(3e-4 * 0.625)
