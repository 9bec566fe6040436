"""The clipped surrogate with token-level aggregation and k3 KL, against hand-computed values."""

import math

import pytest
import torch
from vantage.trainer.loss import policy_loss


def test_on_policy_loss_is_minus_the_token_mean_advantage():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # ratio 1: per token −A; 2 tokens of A = 1 and 3 of A = −2 -> (−2 + 6) / 5 tokens = 0.8
    out = policy_loss(logp, logp.detach(), torch.tensor([1.0, -2.0]), mask, normalizer=5)
    assert out.loss.item() == pytest.approx(0.8)
    assert not out.clipped.any() and (out.kl == 0).all()
    out.loss.backward()
    # d/dlogp of −ρ·A at ρ = 1 is −A per unmasked token, / 5
    assert logp.grad.flatten().tolist() == pytest.approx([-0.2, -0.2, 0.0, 0.4, 0.4, 0.4])


@pytest.mark.parametrize(
    ("ratio", "advantage", "loss", "has_grad"),
    [
        (1.5, 1.0, -1.28, False),  # above 1 + ε_high with A > 0: clipped, no gradient
        (1.5, -1.0, 1.5, True),  # A < 0: the unclipped term is the smaller, it keeps its gradient
        (0.5, 1.0, -0.5, True),  # below 1 − ε_low with A > 0: unclipped is smaller
        (0.5, -1.0, 0.8, False),  # A < 0: clipped at 0.8, no gradient
    ],
)
def test_asymmetric_clip(ratio, advantage, loss, has_grad):
    logp = torch.full((1, 1), math.log(ratio), requires_grad=True)
    out = policy_loss(
        logp,
        torch.zeros(1, 1),
        torch.tensor([advantage]),
        torch.ones(1, 1),
        1.0,
        eps_low=0.2,
        eps_high=0.28,
    )
    assert out.loss.item() == pytest.approx(loss)
    out.loss.backward()
    assert (logp.grad.abs().item() > 0) == has_grad
    assert out.clipped.item() is True


def test_k3_kl():
    logp = torch.zeros(1, 2)
    ref = torch.tensor([[0.0, math.log(2.0)]])
    out = policy_loss(
        logp, logp, torch.tensor([0.0]), torch.ones(1, 2), 2.0, ref_logp=ref, kl_beta=0.5
    )
    # k3 = exp(r − l) − (r − l) − 1: 0 and 2 − ln 2 − 1 = 0.306853; loss = 0.5 · 0.306853 / 2
    assert out.kl.tolist()[0] == pytest.approx([0.0, 1 - math.log(2.0)])
    assert out.loss.item() == pytest.approx(0.5 * (1 - math.log(2.0)) / 2)
