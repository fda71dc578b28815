"""Group-relative advantages (paper Eq. 4) and the filtering of groups that carry no signal."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r − mean(group)) / (std(group) + eps) for consecutive groups of `group_size` rollouts.

    std is the sample standard deviation, as TRL computes it, so losses compare with TRL's.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of {group_size} entries, got {tuple(rewards.shape)}")
    groups = rewards.view(-1, group_size).to(torch.float32)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    return ((groups - mean) / (std + eps)).view(-1)


def informative_groups(advantages: torch.Tensor, group_size: int, atol: float = 0.0) -> torch.Tensor:
    """Per rollout: does its group have any non-zero advantage? Groups whose rollouts all got the
    same reward teach nothing; the paper removes them from the loss and its token normaliser."""
    groups = advantages.view(-1, group_size).abs() > atol
    return groups.any(dim=1).repeat_interleave(group_size)
