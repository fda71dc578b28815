"""Judge throughput against the verifier pools alone, in the same run, on the same samples.

    .venv/bin/python benchmarks/bench_judge.py [--workers 2] [--math-samples 2000] [--code-samples 60] [--tests 16]

Math: samples with ~2 KB of reasoning and a boxed answer (half right), judged by `klear.judge.Judge` and by
`MathVerifier.verify_batch` (its worker pool). Code: programs with `--tests` stdin tests each (a third fail one
test), judged by the Judge and by `CodeVerifier.verify_batch` (its sandbox slots). Both sides get `--workers`
processes / slots, are warmed up first (workers started, math-verify imported, sandbox zygotes forked), and
take turns for `--rounds` rounds; the best round of each counts.
Target (issue 12): the judge within 10% of the verifier pool alone.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from typing import Any

from klear.judge import Judge, JudgeConfig, resolve_problems
from klear.verifiers import CodeVerifier, MathVerifier, VerifierConfig

WORDS = ("consider", "the", "sum", "of", "both", "terms", "then", "factor", "and", "check", "each", "case", "again")


def _reasoning(rng: random.Random, chars: int = 2000) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS) if rng.random() < 0.8 else f"{rng.randint(1, 999)}")
    return " ".join(out)


def math_samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        gold = f"\\frac{{{a}}}{{{b}}}" if i % 3 == 0 else str(a * b)
        answer = gold if i % 2 == 0 else str(a * b + 1)
        response = f"<think>\n{_reasoning(rng)}\n</think>\n\nSo the result is $\\boxed{{{answer}}}$."
        rows.append({"id": f"m{i}", "sample": 0, "response": response, "finish_reason": "stop",
                     "record": f'{{"answer": "{gold.replace(chr(92), chr(92) * 2)}"}}', "gold": gold})
    return rows


def code_samples(n: int, tests: int) -> list[dict[str, Any]]:
    cases = [{"input": f"{i}\n", "output": f"{3 * i}\n", "testtype": "stdin"} for i in range(1, tests + 1)]
    good = "n = int(input())\nprint(3 * n)"
    bad = "n = int(input())\nprint(3 * n if n != 5 else 0)"
    rows = []
    for i in range(n):
        program = bad if i % 3 == 0 else good
        response = f"<think>\nplan\n</think>\n\n```python\n{program}\n```"
        rows.append({"id": f"c{i}", "sample": 0, "response": response, "finish_reason": "stop",
                     "record": None, "tests": cases})
    return rows


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_math(workers: int, n: int, rounds: int) -> tuple[float, float]:
    rows = math_samples(n)
    verifier = VerifierConfig(math_workers=workers)
    pairs = [(r["response"], r["gold"]) for r in rows]
    config = JudgeConfig(workers=workers, verifier=verifier)
    problems = resolve_problems(rows)
    pool_s = judge_s = float("inf")
    # Both pools live side by side and take turns, best of `rounds`: a busy shared machine slows both alike.
    with MathVerifier(verifier) as mv, Judge(config) as judge:
        mv.verify_batch(pairs[: 4 * workers])  # warm-up: workers started, math-verify imported
        judge.judge(rows[: 4 * workers], problems[: 4 * workers])
        for _ in range(rounds):
            t, plain = _timed(lambda: mv.verify_batch(pairs))
            pool_s = min(pool_s, t)
            t, judged = _timed(lambda: judge.judge(rows, problems))
            judge_s = min(judge_s, t)
    agree = sum(p.correct == j.correct for p, j in zip(plain, judged))
    assert agree == n, f"judge and verifier disagree on {n - agree} of {n} math samples"
    return n / pool_s, n / judge_s


def bench_code(workers: int, n: int, tests: int, rounds: int) -> tuple[float, float]:
    from klear.judge.problems import Problem

    rows = code_samples(n, tests)
    verifier = VerifierConfig(code_workers=workers, timeout_s=6.0, allow_unconfined=False)
    jobs = [{"response": r["response"], "tests": r["tests"], "problem_id": r["id"]} for r in rows]
    # The judge: `workers` processes with one sandbox slot each (their share of the cores).
    config = JudgeConfig(workers=workers, verifier=verifier.model_copy(update={"code_workers": 1}))
    problems = [Problem.make(r["id"], "code", None, r["tests"], None) for r in rows]
    pool_s = judge_s = float("inf")
    with CodeVerifier(verifier) as cv, Judge(config) as judge:
        cv.verify_batch(jobs[:workers])
        judge.judge(rows[: 2 * workers], problems[: 2 * workers])
        for _ in range(rounds):
            t, plain = _timed(lambda: cv.verify_batch(jobs))
            pool_s = min(pool_s, t)
            t, judged = _timed(lambda: judge.judge(rows, problems))
            judge_s = min(judge_s, t)
    assert [p.passed for p in plain] == [j.passed for j in judged], "judge and verifier disagree on code samples"
    return n / pool_s, n / judge_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--math-samples", type=int, default=2000)
    parser.add_argument("--code-samples", type=int, default=60)
    parser.add_argument("--tests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds per side; the best counts")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    math_pool, math_judge = bench_math(args.workers, args.math_samples, args.rounds)
    print(f"math, {args.math_samples} samples (~2 KB reasoning), {args.workers} workers:")
    print(f"  verifier pool alone (MathVerifier.verify_batch): {math_pool:8.1f} samples/s")
    print(f"  judge (klear.judge.Judge):                       {math_judge:8.1f} samples/s  "
          f"({100 * math_judge / math_pool:.0f}% of the pool)")
    code_pool, code_judge = bench_code(args.workers, args.code_samples, args.tests, args.rounds)
    print(f"code, {args.code_samples} samples x {args.tests} tests, {args.workers} workers:")
    print(f"  verifier pool alone (CodeVerifier.verify_batch): {code_pool:8.1f} samples/s "
          f"({code_pool * args.tests:.0f} test runs/s)")
    print(f"  judge (klear.judge.Judge):                       {code_judge:8.1f} samples/s "
          f"({code_judge * args.tests:.0f} test runs/s, {100 * code_judge / code_pool:.0f}% of the pool)")
    ok = math_judge >= 0.9 * math_pool and code_judge >= 0.9 * code_pool
    print(f"target (judge within 10% of the verifier pool): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
