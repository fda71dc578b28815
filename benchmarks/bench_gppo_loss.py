"""Cost of GPPO's gradient-preserving clip against plain PPO clipping, in one run.

    python benchmarks/bench_gppo_loss.py [--batch 64] [--tokens 8192] [--repeats 5]

Times forward + backward of `policy_loss` on (batch, tokens) float32 log-probs on CPU for every
kind, and prints each against `ppo_clip` (target for gppo: <= 1.1x).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from klear.gppo.losses import KINDS, policy_loss


def time_kind(kind: str, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              repeats: int) -> float:
    samples = []
    for _ in range(repeats + 1):
        x = logp.detach().clone().requires_grad_(True)
        started = time.perf_counter()
        loss, _ = policy_loss(kind, x, old, adv, mask)  # type: ignore[arg-type]
        loss.backward()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples[1:])  # the first run warms up the allocator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = (args.batch, args.tokens)
    logp = torch.randn(shape) * 0.3 - 2.0
    old = logp + torch.randn(shape) * 0.2  # ratios spread over and beyond the clip range
    adv = torch.randn(args.batch)
    mask = (torch.rand(shape) > 0.1).float()
    # Interleave kinds over rounds so drift in machine load hits all of them alike.
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(3):
        for kind in KINDS:
            times[kind].append(time_kind(kind, logp, old, adv, mask, args.repeats))
    base = min(times["ppo_clip"])
    print(f"policy_loss forward+backward on {shape} tokens, {torch.get_num_threads()} threads")
    for kind in KINDS:
        best = min(times[kind])
        print(f"  {kind:12s} {best * 1e3:7.1f} ms   {best / base:4.2f}x ppo_clip")


if __name__ == "__main__":
    main()
