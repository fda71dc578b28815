"""Math judging throughput per mode (strict, official) beside the verifier pool's own rate, in the same run.

    .venv/bin/python benchmarks/bench_judge_modes.py [--workers 2] [--samples 600] [--reasoning-chars 2000 30000]
                                                       [--repeat 3]

AIME-style samples: reasoning of `--reasoning-chars` characters (words, numbers and some inline LaTeX), then a
boxed integer answer (half right). strict judges the last box after </think>; official (the released
judge_math.py) has math-verify parse the whole response. Each judge and the MathVerifier pool get `--workers`
processes, are warmed up, and take turns `--repeat` times, each round starting with the next. Prints the machine and
the package versions, then min / median / max of each side's samples/s and of official / strict per round.
Target (issue 25): official not slower than strict by more than 20% (the median ratio >= 0.8).
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klear.judge import Judge, JudgeConfig
from klear.judge.problems import Problem
from klear.verifiers import MathVerifier, VerifierConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, in_turns, preamble, spread, timed  # noqa: E402

WORDS = ("consider", "the", "sum", "of", "both", "terms", "then", "factor", "and", "check", "each", "case", "again",
         "$x^2 + y^2$", "$\\frac{a}{b}$", "so", "we", "get", "$n = 3$")


def aime_samples(n: int, chars: int, seed: int = 0) -> tuple[list[dict[str, Any]], list[Problem]]:
    rng = random.Random(seed)
    rows, problems = [], []
    for i in range(n):
        gold = rng.randint(0, 999)
        answer = gold if i % 2 == 0 else gold + 1
        words: list[str] = []
        size = 0
        while size < chars:
            words.append(rng.choice(WORDS) if rng.random() < 0.85 else str(rng.randint(1, 999)))
            size += len(words[-1]) + 1
        response = f"<think>\n{' '.join(words)}\n</think>\n\nSo the answer is $\\boxed{{{answer}}}$."
        rows.append({"id": f"m{i}", "sample": 0, "response": response, "finish_reason": "stop"})
        problems.append(Problem.make(f"m{i}", "math", str(gold), None, None))
    return rows, problems


def bench(workers: int, n: int, chars: int, repeat: int) -> dict[str, list[float]]:
    """Samples/s of the pool, strict and official, one value per round each."""
    rows, problems = aime_samples(n, chars)
    pairs = [(r["response"], p.answer or "") for r, p in zip(rows, problems)]
    verifier = VerifierConfig(math_workers=workers)
    configs = {mode: JudgeConfig(workers=workers, verifier=verifier.model_copy(update={"math_mode": mode}))
               for mode in ("strict", "official")}
    with MathVerifier(verifier) as mv, Judge(configs["strict"]) as strict, Judge(configs["official"]) as official:
        mv.verify_batch(pairs[: 4 * workers])  # warm-up: workers started, math-verify imported
        for judge in (strict, official):
            judge.judge(rows[: 4 * workers], problems[: 4 * workers])
        sides: list[Callable[[], tuple[float, list[Any]]]] = [lambda: timed(lambda: mv.verify_batch(pairs)),
                                                              lambda: timed(lambda: strict.judge(rows, problems)),
                                                              lambda: timed(lambda: official.judge(rows, problems))]
        rounds = list(in_turns(repeat, sides))
    for _, (_, by_strict), (_, by_official) in rounds:
        assert [j.correct for j in by_strict] == [j.correct for j in by_official], \
            "the modes disagree on plain boxed answers"
    return {name: [n / r[side][0] for r in rounds] for side, name in enumerate(("pool", "strict", "official"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--reasoning-chars", type=int, nargs="+", default=[2000, 30000])
    add_repeat_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(preamble("math-verify"), flush=True)
    ok = True
    for chars in args.reasoning_chars:
        rate = bench(args.workers, args.samples, chars, args.repeat)
        ratios = [o / s for o, s in zip(rate["official"], rate["strict"])]
        ok = ok and statistics.median(ratios) >= 0.8
        print(f"math, {args.samples} AIME-style samples, {chars} characters of reasoning, {args.workers} workers:")
        print("  " + spread("verifier pool alone (MathVerifier, strict), samples/s", rate["pool"], digits=1))
        print("  " + spread("judge, math_mode strict, samples/s", rate["strict"], digits=1))
        print("  " + spread("judge, math_mode official, samples/s", rate["official"], digits=1))
        print("  " + spread("official / strict", ratios, "x"), flush=True)
    print(f"target (official within 20% of strict, median ratios): {'met' if ok else 'NOT met'}")

if __name__ == "__main__":
    main()
