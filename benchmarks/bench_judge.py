"""Judge throughput against the verifier pools alone, in the same run, on the same samples.

    .venv/bin/python benchmarks/bench_judge.py [--workers 2] [--math-samples 2000] [--code-samples 60] [--tests 16] [--repeat 3]

Math: samples with ~2 KB of reasoning and a boxed answer (half right), judged by `klear.judge.Judge` and by
`MathVerifier.verify_batch` (its worker pool). Code: programs with `--tests` stdin tests each (a third fail one
test), judged by the Judge and by `CodeVerifier.verify_batch` (its sandbox slots). Both sides get `--workers`
processes / slots, are warmed up first (workers started, math-verify imported, sandbox zygotes forked), and
take turns `--repeat` times, each time the other first. Prints the machine and the package versions, then min /
median / max of each side's samples/s and of judge / pool per repeat.
Target (issue 12): the judge within 10% of the verifier pool alone (the median ratio >= 0.9).
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from klear.judge import Judge, JudgeConfig, resolve_problems
from klear.verifiers import CodeVerifier, MathVerifier, VerifierConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, interleaved, preamble, spread, timed  # noqa: E402

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


def bench_math(workers: int, n: int, repeat: int) -> list[tuple[float, float]]:
    """(pool samples/s, judge samples/s) per repeat."""
    rows = math_samples(n)
    verifier = VerifierConfig(math_workers=workers)
    pairs = [(r["response"], r["gold"]) for r in rows]
    config = JudgeConfig(workers=workers, verifier=verifier)
    problems = resolve_problems(rows)
    # Both pools live side by side and take turns: a busy shared machine slows both alike.
    with MathVerifier(verifier) as mv, Judge(config) as judge:
        mv.verify_batch(pairs[: 4 * workers])  # warm-up: workers started, math-verify imported
        judge.judge(rows[: 4 * workers], problems[: 4 * workers])
        runs = list(interleaved(repeat, lambda: timed(lambda: mv.verify_batch(pairs)),
                                lambda: timed(lambda: judge.judge(rows, problems))))
    for (_, plain), (_, judged) in runs:
        agree = sum(p.correct == j.correct for p, j in zip(plain, judged))
        assert agree == n, f"judge and verifier disagree on {n - agree} of {n} math samples"
    return [(n / pool_s, n / judge_s) for (pool_s, _), (judge_s, _) in runs]


def bench_code(workers: int, n: int, tests: int, repeat: int) -> list[tuple[float, float]]:
    """(pool samples/s, judge samples/s) per repeat."""
    from klear.judge.problems import Problem

    rows = code_samples(n, tests)
    verifier = VerifierConfig(code_workers=workers, timeout_s=6.0, allow_unconfined=False)
    jobs = [{"response": r["response"], "tests": r["tests"], "problem_id": r["id"]} for r in rows]
    # The judge: `workers` processes with one sandbox slot each (their share of the cores).
    config = JudgeConfig(workers=workers, verifier=verifier.model_copy(update={"code_workers": 1}))
    problems = [Problem.make(r["id"], "code", None, r["tests"], None) for r in rows]
    with CodeVerifier(verifier) as cv, Judge(config) as judge:
        cv.verify_batch(jobs[:workers])
        judge.judge(rows[: 2 * workers], problems[: 2 * workers])
        runs = list(interleaved(repeat, lambda: timed(lambda: cv.verify_batch(jobs)),
                                lambda: timed(lambda: judge.judge(rows, problems))))
    for (_, plain), (_, judged) in runs:
        assert [p.passed for p in plain] == [j.passed for j in judged], "judge and verifier disagree on code samples"
    return [(n / pool_s, n / judge_s) for (pool_s, _), (judge_s, _) in runs]


def summary(runs: list[tuple[float, float]], what: str, tests: int = 0) -> float:
    """Prints each side's samples/s and judge / pool; returns the median ratio."""
    pool, judge = [p for p, _ in runs], [j for _, j in runs]
    ratios = [j / p for p, j in runs]
    print("  " + spread(f"verifier pool alone ({what}.verify_batch), samples/s", pool, digits=1))
    print("  " + spread("judge (klear.judge.Judge), samples/s", judge, digits=1))
    if tests:
        print("  " + spread("judge, test runs/s", [j * tests for j in judge], digits=0))
    print("  " + spread("judge / pool", ratios, "x"))
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--math-samples", type=int, default=2000)
    parser.add_argument("--code-samples", type=int, default=60)
    parser.add_argument("--tests", type=int, default=16)
    add_repeat_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(preamble("math-verify"), flush=True)
    print(f"math, {args.math_samples} samples (~2 KB reasoning), {args.workers} workers:", flush=True)
    math_ratio = summary(bench_math(args.workers, args.math_samples, args.repeat), "MathVerifier")
    print(f"code, {args.code_samples} samples x {args.tests} tests, {args.workers} workers:", flush=True)
    code_ratio = summary(bench_code(args.workers, args.code_samples, args.tests, args.repeat), "CodeVerifier",
                         args.tests)
    ok = math_ratio >= 0.9 and code_ratio >= 0.9
    print(f"target (judge within 10% of the verifier pool, median ratios): {'met' if ok else 'NOT met'}")

if __name__ == "__main__":
    main()
