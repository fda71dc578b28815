"""Vectors of the release's policy loss over one mini-batch of unequal micro-batches, value and gradient.

dp_actor.update_policy (use_dynamic_bsz, as the scripts run): for each micro-batch, compute_gppo_loss with the
micro-batch's token-mean (agg_loss), plus positive_loss_coeff x the token-mean NLL of its correct responses, times
len(micro-batch) / ppo_mini_batch_size, gradients summed over the micro-batches. compute_gppo_loss at two commits:
after "fix dual clip bug" (clip_ratio_c applies) and before it (-Ã, c = 1, whatever clip_ratio_c said). HEAD's
compute_gppo_loss raises NameError (`only_higher`), so no run of HEAD trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.release_vectors.release import DUAL_CLIP_FIXED, DUAL_CLIP_UNFIXED, functions, provenance

CORE = "verl/trainer/ppo/core_algos.py"
TORCH_FUNCTIONAL = "verl/utils/torch_functional.py"
SPLITS = [[0, 1], [1, 4], [4, 6]]  # micro-batches of 1, 3 and 2 responses: unequal token counts
POSITIVE_LOSS_COEFF = 0.1  # script: positive_loss_coeff=0.1
CLIP = {"cliprange_low": 0.2, "cliprange_high": 0.28, "clip_ratio_c": 10.0}  # script values


class _VerlF:
    """verl.utils.torch_functional as core_algos imports it: only masked_mean is used by the loss."""

    def __init__(self, git_dir: Path) -> None:
        self.masked_mean = functions(git_dir, DUAL_CLIP_FIXED, TORCH_FUNCTIONAL, ["masked_mean"], {})["masked_mean"]


def planted_batch(seed: int) -> dict[str, torch.Tensor]:
    """Six responses of 1-12 tokens, ratios wide enough that every clip branch and the dual clip occur."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 2, 3, 11, 7, 1])
    mask = (torch.arange(12).unsqueeze(0) < lengths.unsqueeze(1)).float()
    old = -torch.rand(6, 12, generator=g) * 3
    logp = old + torch.randn(6, 12, generator=g) * 1.2
    advantages = torch.tensor([1.0, -1.5, 0.5, -0.8, -1.2, 2.0]).unsqueeze(1).expand(6, 12).contiguous()
    correct = torch.tensor([True, False, True, False, False, True])
    return {"log_prob": logp, "old_log_prob": old, "advantages": advantages, "response_mask": mask, "correct": correct}


def release_mini_batch(loss_fn: Any, agg_loss: Any, batch: dict[str, torch.Tensor]) -> tuple[float, list[list[float]]]:
    logp = batch["log_prob"].clone().requires_grad_(True)
    total = torch.zeros(())
    mini = batch["log_prob"].shape[0]
    for start, end in SPLITS:
        mask, correct = batch["response_mask"][start:end], batch["correct"][start:end]
        pg_loss, *_ = loss_fn(old_log_prob=batch["old_log_prob"][start:end], log_prob=logp[start:end],
                              advantages=batch["advantages"][start:end], response_mask=mask,
                              loss_agg_mode="token-mean", **CLIP)
        positive = torch.tensor(0)
        if correct.any():
            positive = agg_loss(-logp[start:end][correct], loss_mask=mask[correct], loss_agg_mode="token-mean")
        loss = (POSITIVE_LOSS_COEFF * positive + pg_loss) * ((end - start) / mini)
        loss.backward()
        total = total + loss.detach()
    assert logp.grad is not None
    return float(total), logp.grad.tolist()


def generate(git_dir: Path) -> dict[str, Any]:
    cases = []
    for commit, c in ((DUAL_CLIP_FIXED, 10.0), (DUAL_CLIP_UNFIXED, 1.0)):
        namespace: dict[str, Any] = {"torch": torch, "verl_F": _VerlF(git_dir)}
        fns = functions(git_dir, commit, CORE, ["agg_loss", "compute_gppo_loss"], namespace)
        for seed in (0, 1):
            batch = planted_batch(seed)
            loss, grad = release_mini_batch(fns["compute_gppo_loss"], fns["agg_loss"], batch)
            cases.append({"commit": provenance(git_dir, commit, CORE, "compute_gppo_loss")["commit"], "dual_clip": c,
                          "seed": seed, "splits": SPLITS, **{k: v.tolist() for k, v in batch.items()},
                          "loss": loss, "grad_log_prob": grad})
    return {
        "provenance": [provenance(git_dir, DUAL_CLIP_FIXED, CORE, "compute_gppo_loss, agg_loss"),
                       provenance(git_dir, DUAL_CLIP_UNFIXED, CORE, "compute_gppo_loss"),
                       provenance(git_dir, DUAL_CLIP_FIXED, "verl/workers/actor/dp_actor.py",
                                  "DataParallelPPOActor.update_policy",
                                  note="use_dynamic_bsz: loss x len(micro-batch) / ppo_mini_batch_size; positive_loss "
                                       "= agg_loss(-log_prob[correct]) x positive_loss_coeff, added before")],
        "clip": {"eps_low": CLIP["cliprange_low"], "eps_high": CLIP["cliprange_high"],
                 "script_clip_ratio_c": CLIP["clip_ratio_c"], "positive_loss_coeff": POSITIVE_LOSS_COEFF},
        "cases": cases,
    }
