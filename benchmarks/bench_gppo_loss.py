"""Cost of GPPO's gradient-preserving clip against plain PPO clipping, in one run.

    python benchmarks/bench_gppo_loss.py [--batch 64] [--tokens 8192] [--calls 5] [--repeat 3]

Times forward + backward of `policy_loss` on (batch, tokens) float32 log-probs on CPU for every kind (the median of
`--calls` calls after a warm-up one), the kinds taking turns `--repeat` times, each round starting with the next.
Prints the machine and torch's version, then per kind min / median / max of its milliseconds and of its ratio to
`ppo_clip` in the same round (target for gppo: <= 1.1x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from klear.gppo.losses import KINDS, policy_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, in_turns, preamble, spread  # noqa: E402


def time_kind(kind: str, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              calls: int) -> float:
    samples = []
    for _ in range(calls + 1):
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
    parser.add_argument("--calls", type=int, default=5, help="timed calls per kind and round; their median counts")
    add_repeat_argument(parser)
    args = parser.parse_args()
    print(preamble("torch"), flush=True)
    torch.manual_seed(0)
    shape = (args.batch, args.tokens)
    logp = torch.randn(shape) * 0.3 - 2.0
    old = logp + torch.randn(shape) * 0.2  # ratios spread over and beyond the clip range
    adv = torch.randn(args.batch)
    mask = (torch.rand(shape) > 0.1).float()
    sides = [lambda kind=kind: time_kind(kind, logp, old, adv, mask, args.calls) for kind in KINDS]
    rounds = list(in_turns(args.repeat, sides))
    base = KINDS.index("ppo_clip")
    print(f"policy_loss forward+backward on {shape} tokens, {torch.get_num_threads()} threads")
    for index, kind in enumerate(KINDS):
        print("  " + spread(f"{kind:12s} ms", [r[index] * 1e3 for r in rounds], digits=1))
        if index != base:
            print("  " + spread(f"{kind:12s} / ppo_clip", [r[index] / r[base] for r in rounds], "x"))

if __name__ == "__main__":
    main()
