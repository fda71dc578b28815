"""Every policy loss's per-token gradient against the paper's formulas, region by region."""

import math

import pytest
import torch

from klear.gppo.losses import KINDS, aggregate, policy_loss, sft_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28
RATIOS = (0.5, 1.0, 1.5)  # below, inside and above the clip range (for every kind's bounds)
ADVANTAGES = (1.5, -1.5)


def expected_factor(kind: str, ratio: float, adv: float, beta1: float = 1.0, beta2: float = 1.0) -> float:
    """F in d loss / d logp = −F·Ã/N: Eq. 12 (GPPO), Eq. 18 (β1, β2), Eq. 16 (CISPO), PPO's zeros."""
    low = 1 - EPS_LOW
    high = 1 + (EPS_LOW if kind == "ppo_clip" else EPS_HIGH)
    lower, upper = ratio < low and adv < 0, ratio > high and adv > 0
    if kind == "cispo":
        return min(max(ratio, low), high)
    if kind == "gppo":
        return beta1 * low if lower else beta2 * high if upper else ratio
    return 0.0 if lower or upper else ratio


def _region_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[float, float]]]:
    regions = [(r, a) for r in RATIOS for a in ADVANTAGES]
    old = torch.tensor([[-2.0 - 0.1 * i for i in range(len(regions))]])
    logp = (old + torch.tensor([[math.log(r) for r, _ in regions]])).clone().requires_grad_(True)
    adv = torch.tensor([[a for _, a in regions]])
    return logp, old, adv, regions


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("betas", [(1.0, 1.0), (0.5, 2.0)])
def test_gradient_per_region_matches_the_paper(kind: str, betas: tuple[float, float]) -> None:
    logp, old, adv, regions = _region_batch()
    loss, _ = policy_loss(kind, logp, old, adv, torch.ones_like(logp), eps_low=EPS_LOW, eps_high=EPS_HIGH,
                          beta1=betas[0], beta2=betas[1])
    loss.backward()
    n = len(regions)
    for i, (ratio, a) in enumerate(regions):
        want = -expected_factor(kind, ratio, a, *betas) * a / n
        assert logp.grad[0, i].item() == pytest.approx(want, rel=1e-5, abs=1e-7), (kind, ratio, a)


def test_gppo_keeps_gradients_ppo_cuts() -> None:
    logp, old, adv, regions = _region_batch()
    grads = {}
    for kind in ("clip_higher", "gppo"):
        x = logp.detach().clone().requires_grad_(True)
        policy_loss(kind, x, old, adv, torch.ones_like(x))[0].backward()
        grads[kind] = x.grad[0]
    cut = [i for i, (r, a) in enumerate(regions) if (r < 0.8 and a < 0) or (r > 1.28 and a > 0)]
    assert len(cut) == 2
    assert all(grads["clip_higher"][i] == 0 for i in cut)
    assert all(grads["gppo"][i] != 0 for i in cut)


def test_gppo_forward_equals_clip_higher() -> None:
    torch.manual_seed(0)
    logp, old = torch.randn(8, 50) * 0.3 - 2, torch.randn(8, 50) * 0.3 - 2
    adv, mask = torch.randn(8), (torch.rand(8, 50) > 0.2).float()
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        a, _ = policy_loss("gppo", logp, old, adv, mask, agg=agg)
        b, _ = policy_loss("clip_higher", logp, old, adv, mask, agg=agg)
        assert torch.allclose(a, b, atol=1e-6)


def test_ppo_clip_is_symmetric_and_uses_eps_low() -> None:
    logp = torch.log(torch.tensor([[1.25]])).requires_grad_(True)
    loss, stats = policy_loss("ppo_clip", logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1),
                              eps_low=0.2, eps_high=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and logp.grad.item() == 0.0 and stats["clip_frac_high"] == 1.0


def test_dual_clip_caps_negative_advantage_losses() -> None:
    logp = torch.log(torch.tensor([[20.0, 3.0]])).requires_grad_(True)
    adv = torch.tensor([[-1.0, -1.0]])
    loss, _ = policy_loss("gppo", logp, torch.zeros(1, 2), adv, torch.ones(1, 2), dual_clip=10.0)
    loss.backward()
    assert loss.item() == pytest.approx((10.0 + 3.0) / 2)
    assert logp.grad[0, 0].item() == 0.0  # beyond c: capped, no gradient
    assert logp.grad[0, 1].item() == pytest.approx(3.0 / 2)
    with pytest.raises(ValueError, match="dual_clip must be >= 1"):
        policy_loss("gppo", logp, torch.zeros(1, 2), adv, torch.ones(1, 2), dual_clip=0.5)


def test_aggregations() -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(per_token, mask, "sum")  # type: ignore[arg-type]


def test_stats_count_clipped_tokens_and_kl() -> None:
    ratios = torch.tensor([[0.5, 1.0, 1.5, 1.0]])
    _, stats = policy_loss("gppo", ratios.log(), torch.zeros(1, 4), torch.tensor([[-1.0, 1.0, 1.0, 1.0]]),
                           torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    assert stats["clip_frac_low"] == pytest.approx(1 / 3) and stats["clip_frac_high"] == pytest.approx(1 / 3)
    assert stats["ratio_max"] == pytest.approx(1.5) and stats["ratio_mean"] == pytest.approx(1.0)
    k3 = [(r - 1) - math.log(r) for r in (0.5, 1.0, 1.5)]
    assert stats["approx_kl"] == pytest.approx(sum(k3) / 3, rel=1e-5)


def test_zero_advantage_groups_do_not_change_the_loss() -> None:
    """Masking the groups without signal out of the loss (what the trainer does) leaves it as if they were never
    there; leaving them in would dilute the token normaliser. Advantages of 3 groups of 4 rollouts: one group
    with signal (rewards 1, 0, 0, 1), two whose rewards are all equal (advantage 0)."""
    torch.manual_seed(1)
    adv = torch.tensor([0.866, -0.866, -0.866, 0.866] + [0.0] * 8)
    logp, old = torch.randn(12, 30) * 0.2 - 1.5, torch.randn(12, 30) * 0.2 - 1.5
    mask = torch.ones(12, 30)
    keep = torch.tensor([True] * 4 + [False] * 8)
    filtered, _ = policy_loss("gppo", logp, old, adv, mask * keep.unsqueeze(-1))
    alone, _ = policy_loss("gppo", logp[:4], old[:4], adv[:4], mask[:4])
    unfiltered, _ = policy_loss("gppo", logp, old, adv, mask)
    assert filtered.item() == pytest.approx(alone.item(), rel=1e-6)
    assert unfiltered.item() != pytest.approx(alone.item(), rel=1e-3)  # the normaliser would dilute it


def test_sft_term_sees_only_correct_responses() -> None:
    logp = (torch.randn(3, 5) - 1).requires_grad_(True)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 5])
    correct = torch.tensor([True, True, False])
    loss = sft_loss(logp, mask, correct)
    loss.backward()
    assert loss.item() == pytest.approx(-(logp[0].sum() + logp[1, :3].sum()).item() / 8, rel=1e-6)
    assert torch.all(logp.grad[2] == 0) and torch.all(logp.grad[1, 3:] == 0)
    assert sft_loss(logp, mask, torch.zeros(3, dtype=torch.bool)).item() == 0.0


def test_bad_arguments_are_named() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown policy loss 'grpo'"):
        policy_loss("grpo", x, x, torch.zeros(2), x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"logp \(2, 3\), old_logp \(2, 4\)"):
        policy_loss("gppo", x, torch.zeros(2, 4), torch.zeros(2), x)


@pytest.mark.parametrize("kind", KINDS)
def test_importance_weights_scale_each_tokens_gradient_without_their_own(kind: str) -> None:
    """vLLM's mismatch correction: a token's gradient is multiplied by its (detached) weight w."""
    logp, old, adv, regions = _region_batch()
    weights = torch.linspace(0.5, 3.0, logp.numel()).view_as(logp).requires_grad_(True)
    loss, _ = policy_loss(kind, logp, old, adv, torch.ones_like(logp), eps_low=EPS_LOW, eps_high=EPS_HIGH,
                          token_weights=weights)
    loss.backward()
    n = len(regions)
    for i, (ratio, a) in enumerate(regions):
        expected = -float(weights[0, i]) * expected_factor(kind, ratio, a) * a / n
        assert logp.grad[0, i].item() == pytest.approx(expected, rel=1e-5, abs=1e-7), (ratio, a)
    assert weights.grad is None
