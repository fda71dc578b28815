"""Per-step RL metrics: every Trainer log row kept for the report, and the summary the KFP component logs.

The rows hold TRL's rollout figures (reward, reward_std, completions/mean_length, step_time), the
trainer's (accuracy, reward/<task>/mean, clip_frac_low/high, gradient_kept_frac, ratio_mean/max, approx_kl,
entropy, policy_loss, sft_nll, groups_filtered_frac, fill_ratio, refill_rounds, reward_timeouts,
rollout_tokens_per_second) and the optimiser's (grad_norm,
learning_rate). TensorBoard gets the same rows through its callback.
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

SUMMARY_KEYS = ("reward", "reward_std", "accuracy", "clip_frac_low", "clip_frac_high", "entropy", "completions/mean_length",
                "grad_norm", "groups_filtered_frac", "fill_ratio")


def gradient_kept_fraction(loss: str, clip_low: float, clip_high: float, beta1: float = 1.0, beta2: float = 1.0) -> float:
    """Fraction of the mini-batch's tokens whose gradient the loss keeps where PPO's clip would zero it: the clipped
    regions (δ < 1−ε_l with Ã < 0, δ > 1+ε_h with Ã > 0) for GPPO (a region scaled by β = 0 is dropped again) and
    CISPO; none for ppo_clip and clip_higher."""
    if loss == "gppo":
        return clip_low * (beta1 > 0) + clip_high * (beta2 > 0)
    if loss == "cispo":
        return clip_low + clip_high
    return 0.0


class HistoryLogger(TrainerCallback):
    """Keeps each training log row (numbers only) with its step. Rollout figures (reward, accuracy, ...) are
    in the rows of the steps that generated; every row has the update's figures (clip fractions, grad norm)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
            self.rows.append({"step": float(state.global_step), **numbers})


def summarize(rows: list[dict[str, float]], train_output: dict[str, float]) -> dict[str, float]:
    """First and last reward, means of the tracked figures over the run, the run's totals."""
    summary: dict[str, float] = {}
    rewards = [r["reward"] for r in rows if "reward" in r]
    if rewards:
        summary["first_reward"], summary["final_reward"] = rewards[0], rewards[-1]
    if rows:
        for key in SUMMARY_KEYS:
            values = [r[key] for r in rows if key in r]
            if values:
                summary[f"mean_{key.replace('/', '_')}"] = sum(values) / len(values)
    for key in ("train_loss", "train_runtime"):
        if key in train_output:
            summary[key] = float(train_output[key])
    return {k: v for k, v in summary.items() if math.isfinite(v)}
