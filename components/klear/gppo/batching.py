"""Assembling a training batch from generation rounds: which groups to keep, and the padded tensors.

Over-sampling as in the official runs: a round generates rollouts for more prompts than a step
trains on; groups whose rewards are all equal (zero advantage, no signal) are dropped and the
batch is filled with informative groups, from further rounds if needed. When the rounds run out
the batch is topped up with uninformative groups that are masked out of the loss (and of its
token normaliser), so tensor shapes stay fixed; the fill ratio reports how often that happens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def varied_groups(keys: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per group: do its rollouts' filter keys (rewards) differ? Compared exactly, not through the advantage,
    whose float rounding can leave a tiny non-zero value in a group of equal rewards."""
    if keys.dim() != 1 or keys.numel() % group_size:
        raise ValueError(f"keys must be 1-D with a multiple of {group_size} entries, got {tuple(keys.shape)}")
    groups = keys.view(-1, group_size)
    return (groups != groups[:, :1]).any(dim=1)


@dataclass(frozen=True)
class GroupPick:
    round: int  # which generation round
    group: int  # group index within that round's local rows
    informative: bool


def pick_groups(informative_per_round: list[list[bool]], quota: int, filter_groups: bool) -> list[GroupPick]:
    """`quota` groups for this step: informative ones first (in generation order), then, if short,
    uninformative ones to keep the batch shape. Without filtering: the first `quota` groups of round 0."""
    if not filter_groups:
        first = informative_per_round[0]
        if len(first) < quota:
            raise ValueError(f"round 0 has {len(first)} groups, fewer than the quota {quota}")
        return [GroupPick(0, g, info) for g, info in enumerate(first[:quota])]
    useful = [GroupPick(r, g, True) for r, flags in enumerate(informative_per_round) for g, info in enumerate(flags) if info]
    if len(useful) >= quota:
        return useful[:quota]
    filler = [GroupPick(r, g, False) for r, flags in enumerate(informative_per_round) for g, info in enumerate(flags) if not info]
    if len(useful) + len(filler) < quota:
        raise ValueError(f"only {len(useful) + len(filler)} groups were generated for a quota of {quota}")
    return useful + filler[: quota - len(useful)]


def shortfall(informative_counts: list[int], quota: int) -> int:
    """Groups still missing on the worst-off rank (every rank runs the same number of rounds)."""
    return max(0, max(quota - count for count in informative_counts))


# Per-rollout tensors TRL's generation step returns, by how they are padded.
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
PER_TOKEN_KEYS = ("completion_ids", "completion_mask", "old_per_token_logps", "sampling_per_token_logps",
                  "importance_sampling_ratio", "tool_mask")


def _pad_to(t: torch.Tensor, length: int, value: float, left: bool) -> torch.Tensor:
    missing = length - t.size(1)
    if missing <= 0:
        return t
    return F.pad(t, (missing, 0) if left else (0, missing), value=value)


def gather_rows(rounds: list[dict[str, torch.Tensor]], rows: list[tuple[int, int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The listed (round, row) rollouts as one batch, re-padded to the longest round: prompts on the left,
    completions and per-completion-token tensors on the right. Batch-wide scalars are left to the caller."""
    prompt_len = max(r["prompt_ids"].size(1) for r in rounds)
    completion_len = max(r["completion_ids"].size(1) for r in rounds)
    out: dict[str, torch.Tensor] = {}
    for key, first in rounds[0].items():
        if not isinstance(first, torch.Tensor) or first.dim() == 0:
            continue
        if key in PROMPT_KEYS:
            padded = [_pad_to(r[key], prompt_len, pad_token_id if key == "prompt_ids" else 0, left=True) for r in rounds]
        elif key in PER_TOKEN_KEYS:  # (the trainer asks TRL for token-level importance weights)
            padded = [_pad_to(r[key], completion_len, pad_token_id if key == "completion_ids" else 0, left=False)
                      for r in rounds]
        elif first.dim() == 1 or (first.dim() == 2 and first.size(1) == 1):
            padded = [r[key] for r in rounds]  # one value per rollout (advantages, sequence-level weights)
        else:
            raise ValueError(f"cannot re-batch {key!r} of shape {tuple(first.shape)}: text rollouts only")
        out[key] = torch.cat([padded[r][row : row + 1] for r, row in rows])
    return out
