"""Verifier throughput: sandboxed runs/s and overhead against bare `python3 -I -S`, math verifications/s.

    .venv/bin/python benchmarks/bench_verifiers.py [--workers 2] [--runs 400] [--math-items 2000] [--repeat 3]

Targets (issue 3): >= 100 sandboxed runs/s of a trivial program on 2 cores, per-run overhead <= 1.5x
bare `python3 -I -S` measured in the same run, >= 200 math verifications/s on 2 cores.

The bare and sandboxed runs take turns `--repeat` times (each time the other first); the math batch runs `--repeat`
times. Prints the machine and the package versions, then min / median / max of every figure and of the ratios per
repeat.
"""

from __future__ import annotations

import argparse
import logging
import random
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from klear.verifiers import MathVerifier, SandboxPool, VerifierConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, interleaved, preamble, spread, timed  # noqa: E402

TRIVIAL = "print(int(input()) + 1)"


def _measure(one: Callable[[int], None], n: int, workers: int) -> tuple[float, float]:
    """(runs/s with `workers` at once, mean seconds per run one at a time)."""
    start = time.perf_counter()
    for i in range(n // 4):
        one(i)
    latency = (time.perf_counter() - start) / (n // 4)
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, range(n)))
    return n / (time.perf_counter() - start), latency


def bare_runs(n: int, workers: int) -> tuple[float, float]:
    """A fresh python3 -I -S per run: the baseline."""
    cmd = [sys.executable, "-I", "-S", "-c", TRIVIAL]

    def one(_: int) -> None:
        subprocess.run(cmd, input=b"1\n", capture_output=True, check=True)

    return _measure(one, n, workers)


def sandbox_runs(pool: SandboxPool, n: int, workers: int) -> tuple[float, float]:
    def one(_: int) -> None:
        result = pool.run(TRIVIAL, b"1\n")
        assert result.stdout == b"2\n", result

    return _measure(one, n, workers)


def math_items(n: int) -> list[tuple[str, str]]:
    """Mixed answers (integers, fractions, radicals, sets, intervals; right and wrong) after ~2 KB of reasoning."""
    rng = random.Random(0)
    pool = [
        ("73", "73"), ("73", "74"), (r"\frac{1}{2}", "0.5"), (r"\frac{3}{4}", r"\frac{6}{8}"),
        (r"2\sqrt{3}", r"\sqrt{12}"), (r"2\sqrt{3}", r"3\sqrt{2}"), (r"\{1,2\}", r"\{2,1\}"), ("(1,2]", "[1,2]"),
        ("x^2+2x+1", "(x+1)^2"), (r"\pi", "3.14"), ("12", r"12\%"), ("1000", "1{,}000"),
    ]
    reasoning = "<think>\n" + ("We consider the cases and compute each term carefully. " * 38) + "\n</think>\n"
    items = []
    for _ in range(n):
        gold, pred = rng.choice(pool)
        items.append((reasoning + f"Therefore the answer is $\\boxed{{{pred}}}$.", gold))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--math-items", type=int, default=2000)
    add_repeat_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(preamble("math-verify"), flush=True)

    config = VerifierConfig(code_workers=args.workers, math_workers=args.workers)
    with SandboxPool(config) as pool:
        for _ in range(10):  # warm up
            assert pool.run(TRIVIAL, b"1\n").stdout == b"2\n"
        runs = list(interleaved(args.repeat, lambda: bare_runs(args.runs, args.workers),
                                lambda: sandbox_runs(pool, args.runs, args.workers)))
        confinement = pool._all[0].info
    bare_rate, bare_latency = [r for (r, _), _ in runs], [latency for (_, latency), _ in runs]
    box_rate, box_latency = [r for _, (r, _) in runs], [latency for _, (_, latency) in runs]
    print(f"sandbox ({args.workers} workers, Landlock ABI {confinement['landlock_abi']}, "
          f"seccomp {confinement['seccomp']}, per-slot uid {pool.uids[0] is not None})")
    print("  " + spread("bare python3 -I -S, runs/s", bare_rate, digits=1))
    print("  " + spread("bare python3 -I -S, ms/run", [x * 1000 for x in bare_latency]))
    print("  " + spread("sandboxed, runs/s (target >= 100)", box_rate, digits=1))
    print("  " + spread("sandboxed, ms/run", [x * 1000 for x in box_latency]))
    print("  " + spread("overhead (time per run, sandboxed / bare; target <= 1.5x)",
                        [b / a for a, b in zip(bare_latency, box_latency)], "x"))
    print("  " + spread("throughput ratio (sandboxed / bare)", [b / a for a, b in zip(bare_rate, box_rate)], "x"))

    items = math_items(args.math_items)
    with MathVerifier(config) as verifier:
        verifier.verify_batch(items[:50])  # workers up
        batches = [timed(lambda: verifier.verify_batch(items)) for _ in range(args.repeat)]
    print(f"math ({args.workers} workers, ~{len(items[0][0]) // 1000} KB responses): "
          f"{sum(r.correct for r in batches[0][1])}/{len(items)} correct")
    print("  " + spread("verifications/s (target >= 200)", [len(items) / seconds for seconds, _ in batches], digits=1))

if __name__ == "__main__":
    main()
