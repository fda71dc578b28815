"""Policy losses for RL on LLMs: PPO clip, clip-higher, CISPO and GPPO, behind one function.

Per token, with importance ratio δ = exp(logp − old_logp) and advantage Ã (paper notation):

  ppo_clip     −min(δÃ, clip(δ, 1−ε_l, 1+ε_l)Ã)                       symmetric clip
  clip_higher  −min(δÃ, clip(δ, 1−ε_l, 1+ε_h)Ã)                       DAPO's decoupled bounds
  cispo        −sg(clip(δ, 1−ε_l, 1+ε_h))·Ã·logp                      paper App. A.1 (Eq. 16)
  gppo         −min(δÃ, clip(δ, β1(1−ε_l)δ/sg(δ), β2(1+ε_h)δ/sg(δ))Ã)  paper Eq. 11 / Eq. 17

The two clipped branches that PPO cuts off (δ < 1−ε_l with Ã < 0, δ > 1+ε_h with Ã > 0)
keep a gradient under GPPO: d loss / d logp = −β1(1−ε_l)Ã resp. −β2(1+ε_h)Ã (Eq. 12 / 18),
while its forward value (β = 1) equals clip-higher's. Everywhere else every kind's gradient is
−δÃ (CISPO: −clip(δ)Ã). Gradients then flow to the policy through logp only.
"""

from __future__ import annotations

from typing import get_args

import torch

from klear.gppo.config import Aggregation, LossKind

KINDS: tuple[str, ...] = get_args(LossKind)
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: Aggregation = "token-mean") -> torch.Tensor:
    """Reduce a (batch, tokens) loss over the masked tokens.

    token-mean: over all response tokens of the batch (the paper's choice: long responses weigh
    by their length); micro-token-mean: the same within one micro-batch (how micro-batches combine is
    `micro_batch_share`'s); seq-mean-token-mean: per response, then over responses (GRPO's original);
    seq-mean-token-sum: token sums per response, averaged over responses (Dr. GRPO-like).
    """
    mask = mask.to(per_token.dtype)
    summed = per_token * mask
    if agg in ("token-mean", "micro-token-mean"):
        return summed.sum() / mask.sum().clamp(min=1.0)
    seq_tokens = mask.sum(dim=-1)
    has_tokens = seq_tokens > 0
    if not bool(has_tokens.any()):
        return summed.sum() * 0.0
    if agg == "seq-mean-token-mean":
        return (summed.sum(dim=-1)[has_tokens] / seq_tokens[has_tokens]).mean()
    if agg == "seq-mean-token-sum":
        return summed.sum(dim=-1)[has_tokens].mean()
    raise ValueError(f"unknown aggregation {agg!r}; expected one of {AGGREGATIONS}")


def micro_batch_share(agg: Aggregation, mask: torch.Tensor, batch_tokens: torch.Tensor | float,
                      batch_seqs: torch.Tensor | float) -> torch.Tensor:
    """The weight of one micro-batch's aggregated loss in its mini-batch's: summed over the micro-batches, the
    weighted losses give the mini-batch loss under `agg`. `batch_tokens` / `batch_seqs`: the kept tokens / responses
    of the whole mini-batch.

    token-mean weighs a micro-batch by its kept tokens, so the mini-batch loss is the mean over all its tokens
    whatever the split. The others by its responses: for micro-token-mean that is the release's verl (dp_actor:
    each micro-batch's token-mean x len(micro-batch) / ppo_mini_batch_size), where a micro-batch of few long
    responses weighs its tokens more than one of many short ones.
    """
    if agg == "token-mean":
        local, total = mask.sum(), batch_tokens
    else:
        local, total = (mask.sum(-1) > 0).sum(), batch_seqs
    dtype = mask.dtype if mask.is_floating_point() else torch.float32  # masks may be integer tensors
    return local.to(dtype) / torch.as_tensor(total, dtype=dtype, device=mask.device).clamp(min=1.0)


def policy_loss(
    kind: LossKind,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta1: float = 1.0,
    beta2: float = 1.0,
    dual_clip: float | None = None,
    agg: Aggregation = "token-mean",
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of `kind` and its statistics.

    logp, old_logp, mask: (batch, tokens); advantages: (batch,) or (batch, tokens).
    `dual_clip` = c caps the loss of negative-advantage tokens at −c·Ã where δ > c (the official
    Klear script sets c = 10, which its code applies from 2025-08-13, c = 1 before; off in the
    paper). Stats: fractions of masked tokens clipped at the lower and upper bound, mean and max
    ratio, approximate KL to the old policy (k3 estimator).
    `token_weights` (batch, tokens) multiply each token's objective without gradient: the truncated
    importance weight π_trainer/π_sampler that corrects for vLLM's log-probs differing from the trainer's.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown policy loss {kind!r}; expected one of {KINDS}")
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask {tuple(mask.shape)} differ")
    adv = advantages.unsqueeze(-1).expand_as(logp) if advantages.dim() == 1 else advantages
    old_logp = old_logp.detach()
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    low_bound = 1.0 - eps_low
    high_bound = 1.0 + (eps_low if kind == "ppo_clip" else eps_high)
    lower = (ratio < low_bound) & (adv < 0)  # PPO zeroes the gradient of these tokens...
    upper = (ratio > high_bound) & (adv > 0)  # ...and of these.

    if kind == "cispo":
        weight = ratio.detach().clamp(low_bound, high_bound)
        objective = weight * adv * logp
    elif kind == "gppo":
        # δ·w with w = bound/sg(δ) on the two clipped branches: forward value bound·Ã, gradient
        # bound·Ã·∇logp (not zero). w carries no graph, so this costs what PPO's clip costs.
        with torch.no_grad():
            weight = torch.where(lower, beta1 * low_bound / ratio, 1.0)
            weight = torch.where(upper, beta2 * high_bound / ratio, weight)
        objective = ratio * weight * adv
    else:
        with torch.no_grad():
            clipped_value = torch.where(lower, low_bound, high_bound) * adv
        objective = torch.where(lower | upper, clipped_value, ratio * adv)
    if dual_clip is not None:
        if dual_clip < 1.0:  # 1 is the release's code before 2025-08-13 (-Ã whatever clip_ratio_c said)
            raise ValueError(f"dual_clip must be >= 1, got {dual_clip}")
        capped = (adv < 0) & (ratio.detach() > dual_clip)
        objective = torch.where(capped, dual_clip * adv, objective)

    if token_weights is not None:
        objective = objective * token_weights.detach()
    loss = aggregate(-objective, mask, agg)
    with torch.no_grad():
        m = mask.bool()
        tokens = max(int(m.sum()), 1)
        masked_ratio = ratio[m] if bool(m.any()) else ratio.new_ones(1)
        stats = {
            "clip_frac_low": float((lower & m).sum()) / tokens,
            "clip_frac_high": float((upper & m).sum()) / tokens,
            "ratio_mean": float(masked_ratio.mean()),
            "ratio_max": float(masked_ratio.max()),
            "approx_kl": float(((ratio - 1.0) - log_ratio)[m].mean()) if bool(m.any()) else 0.0,
        }
    return loss, stats


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Token-level NLL of the correct responses of the rollout (paper Eq. 13–14); 0 if none is correct."""
    keep = mask.to(logp.dtype) * correct.to(logp.dtype).unsqueeze(-1)
    return -(logp * keep).sum() / keep.sum().clamp(min=1.0)
