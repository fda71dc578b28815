"""Math judging throughput per mode (strict, official) beside the verifier pool's own rate, in the same run.

    .venv/bin/python benchmarks/bench_judge_modes.py [--workers 2] [--samples 600] [--reasoning-chars 2000 30000]

AIME-style samples: reasoning of `--reasoning-chars` characters (words, numbers and some inline LaTeX), then a
boxed integer answer (half right). strict judges the last box after </think>; official (the released
judge_math.py) has math-verify parse the whole response. Each judge and the MathVerifier pool get `--workers`
processes, are warmed up, and take turns for `--rounds` rounds; the best round counts.
Target (issue 25): official not slower than strict by more than 20%.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from typing import Any

from klear.judge import Judge, JudgeConfig
from klear.judge.problems import Problem
from klear.verifiers import MathVerifier, VerifierConfig

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


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench(workers: int, n: int, chars: int, rounds: int) -> dict[str, float]:
    rows, problems = aime_samples(n, chars)
    pairs = [(r["response"], p.answer or "") for r, p in zip(rows, problems)]
    verifier = VerifierConfig(math_workers=workers)
    configs = {mode: JudgeConfig(workers=workers, verifier=verifier.model_copy(update={"math_mode": mode}))
               for mode in ("strict", "official")}
    best = {"pool": float("inf"), "strict": float("inf"), "official": float("inf")}
    verdicts: dict[str, list[bool]] = {}
    with MathVerifier(verifier) as mv, Judge(configs["strict"]) as strict, Judge(configs["official"]) as official:
        judges = {"strict": strict, "official": official}
        mv.verify_batch(pairs[: 4 * workers])  # warm-up: workers started, math-verify imported
        for judge in judges.values():
            judge.judge(rows[: 4 * workers], problems[: 4 * workers])
        for _ in range(rounds):
            t, _ = _timed(lambda: mv.verify_batch(pairs))
            best["pool"] = min(best["pool"], t)
            for mode, judge in judges.items():
                t, out = _timed(lambda judge=judge: judge.judge(rows, problems))
                best[mode] = min(best[mode], t)
                verdicts[mode] = [j.correct for j in out]
    assert verdicts["strict"] == verdicts["official"], "the modes disagree on plain boxed answers"
    return {name: n / seconds for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--reasoning-chars", type=int, nargs="+", default=[2000, 30000])
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds per side; the best counts")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    ok = True
    for chars in args.reasoning_chars:
        rate = bench(args.workers, args.samples, chars, args.rounds)
        ratio = rate["official"] / rate["strict"]
        ok = ok and ratio >= 0.8
        print(f"math, {args.samples} AIME-style samples, {chars} characters of reasoning, {args.workers} workers:")
        print(f"  verifier pool alone (MathVerifier, strict): {rate['pool']:8.1f} samples/s")
        print(f"  judge, math_mode strict:                    {rate['strict']:8.1f} samples/s")
        print(f"  judge, math_mode official:                  {rate['official']:8.1f} samples/s  "
              f"({100 * ratio:.0f}% of strict)")
    print(f"target (official within 20% of strict): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
