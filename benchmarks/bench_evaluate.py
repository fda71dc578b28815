"""Scoring throughput of `klear evaluate` on 2 cores, beside the verifier pools' own rate on the same samples.

    .venv/bin/python benchmarks/bench_evaluate.py [--workers 2] [--math-problems 30] [--k 64]
                                                  [--code-problems 10] [--code-k 8] [--tests 20] [--repeat 3]

AIME-style: `--math-problems` x `--k` samples with ~8 KB responses (reasoning + a boxed answer, half right).
LiveCodeBench-style: stdin and functional problems with `--tests` tests each (a public one, the rest private in
LiveCodeBench's base64/zlib/pickle encoding), `--code-k` samples each: right programs, and wrong ones failing
half-way (stop at the first failure, as LiveCodeBench grades). The stage runs end to end (read the published
samples, choose the first k, judge, score, render the report); the pools run on the same (response, reference)
pairs: MathVerifier.verify_batch and CodeVerifier.verify_batch in first-failure mode, with as many workers.
The stage and the pool take turns `--repeat` times (each repeat the other goes first); printed after the machine and
the package versions: min / median / max of each side's samples/s and of their ratio per repeat.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import storage
from klear.common.config import load_config
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.livecodebench import decode_private_tests
from klear.evaluate.stage import run
from klear.verifiers import CodeVerifier, MathVerifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, interleaved, preamble, spread, timed  # noqa: E402

WORDS = ("consider", "the", "sum", "of", "both", "terms", "then", "factor", "and", "check", "each", "case", "again")
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 0, "repetition_penalty": 1.0, "max_tokens": 32768}


def _reasoning(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        out.append(rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randint(1, 999)))
        size += len(out[-1]) + 1
    return " ".join(out)


def _publish(rows: list[dict[str, Any]], uri: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "samples").mkdir()
        pq.write_table(pa.Table.from_pylist(rows), Path(tmp) / "samples" / "part-00000.parquet")
        storage.publish_dir(tmp, uri, meta={"stage": "sample", "settings": {"sampling": SAMPLING}})
    return uri


def _write_jsonl(rows: list[dict[str, Any]], path: Path) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def math_case(tmp: Path, problems: int, k: int) -> tuple[str, str, list[tuple[str, str]]]:
    rng = random.Random(0)
    items, rows, pairs = [], [], []
    for p in range(problems):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        gold = f"\\frac{{{a}}}{{{b}}}" if p % 3 == 0 else str(a * b)
        items.append({"id": f"bench-{p}", "benchmark": "bench_math", "problem": f"Compute {a} and {b}.", "answer": gold})
        for j in range(k):
            answer = gold if (p + j) % 2 == 0 else str(a * b + 1 + j)  # wrong answers vary, as sampled ones do
            response = f"<think>\n{_reasoning(rng, 8000)}\n</think>\n\nSo the result is $\\boxed{{{answer}}}$."
            rows.append({"id": f"bench-{p}", "sample": j, "response": response, "finish_reason": "stop",
                         "completion_tokens": len(response) // 4})
            pairs.append((response, gold))
    return _write_jsonl(items, tmp / "math.jsonl"), _publish(rows, str(tmp / "math-samples")), pairs


def _lcb_row(qid: str, tests: list[dict[str, str]], func_name: str | None) -> dict[str, Any]:
    import base64
    import pickle
    import zlib

    private = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests[1:])))).decode()
    return {"question_id": qid, "question_title": qid, "question_content": f"Problem {qid}.", "platform": "atcoder",
            "contest_id": "c", "contest_date": "2024-10-01T00:00:00", "difficulty": "medium",
            "starter_code": "class Solution:\n    def triple(self, n: int) -> int:\n        " if func_name else "",
            "public_test_cases": json.dumps(tests[:1]), "private_test_cases": private,
            "metadata": json.dumps({"func_name": func_name} if func_name else {})}


def code_case(tmp: Path, problems: int, k: int, n_tests: int, functional: bool) -> tuple[str, str, list[dict[str, Any]]]:
    kind = "functional" if functional else "stdin"
    tests = [{"input": str(i) if functional else f"{i}\n", "output": str(3 * i) if functional else f"{3 * i}\n",
              "testtype": kind} for i in range(1, n_tests + 1)]
    half = n_tests // 2
    if functional:
        head = "class Solution:\n    def triple(self, n: int) -> int:\n"
        good, bad = head + "        return 3 * n", head + f"        return 3 * n if n != {half} else 0"
    else:
        good, bad = "n = int(input())\nprint(3 * n)", f"n = int(input())\nprint(3 * n if n != {half} else 0)"
    items, rows, jobs = [], [], []
    for p in range(problems):
        qid = f"{kind}-{p}"
        items.append(_lcb_row(qid, tests, "triple" if functional else None))
        for j in range(k):
            response = f"<think>\nplan\n</think>\n\n```python\n{bad if j % 3 == 0 else good}\n```"
            rows.append({"id": qid, "sample": j, "response": response, "finish_reason": "stop", "completion_tokens": 40})
            jobs.append({"response": response, "tests": decode_private_tests(json.dumps(tests)), "problem_id": qid,
                         "fn_name": "triple" if functional else None})
    return (_write_jsonl(items, tmp / f"lcb-{kind}.jsonl"), _publish(rows, str(tmp / f"{kind}-samples")), jobs)


def _judging_rate(report: dict[str, Any]) -> float:
    judge = report["judge"]
    return float(judge["judged"] / judge["judge_s"])


def compare(repeat: int, n: int, stage: Callable[[], tuple[float, dict[str, Any]]], pool: Callable[[], tuple[float, int]],
            correct: Callable[[dict[str, Any]], int]) -> None:
    """The stage (seconds, report) and the warm pool (seconds, right answers) taking turns; prints their spreads."""
    runs = list(interleaved(repeat, stage, pool))
    for (_, report), (_, right) in runs:
        assert right == correct(report), (right, correct(report))
    end_to_end = [n / stage_s for (stage_s, _), _ in runs]
    judging = [_judging_rate(report) for (_, report), _ in runs]
    alone = [n / pool_s for _, (pool_s, _) in runs]
    print("  " + spread("klear evaluate, end to end (read, judge, score, report), samples/s", end_to_end, digits=1))
    print("  " + spread("klear evaluate, judging phase (workers started inside), samples/s", judging, digits=1))
    print("  " + spread("verifier pool alone, warm, samples/s", alone, digits=1))
    print("  " + spread("end to end / pool", [e / a for e, a in zip(end_to_end, alone)], "x"))
    print("  " + spread("judging phase / pool", [j / a for j, a in zip(judging, alone)], "x"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--math-problems", type=int, default=30)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--code-problems", type=int, default=10)
    parser.add_argument("--code-k", type=int, default=8)
    parser.add_argument("--tests", type=int, default=20)
    add_repeat_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(preamble("math-verify", "pyarrow"), flush=True)
    w = args.workers
    common = ["benchmarks.bench_math.kind=math", f"benchmarks.bench_math.k={args.k}",
              f"benchmarks.livecodebench_v5.k={args.code_k}", f"judge.workers={w}", "judge.verifier.code_workers=1",
              "judge.resume=false"]
    math_config = load_config(EvaluateConfig, "paper", [*common, "only=[bench_math]"])
    code_config = load_config(EvaluateConfig, "paper", [*common, "only=[livecodebench_v5]"])
    verifier = math_config.judge.verifier
    outputs = itertools.count()  # every stage run writes a fresh output
    with tempfile.TemporaryDirectory(prefix="bench-evaluate-") as tmp_dir:
        tmp = Path(tmp_dir)
        math_file, math_samples, pairs = math_case(tmp, args.math_problems, args.k)
        print(f"AIME-style: {len(pairs)} samples (~8 KB responses, {args.math_problems} problems x {args.k}), "
              f"{w} workers", flush=True)
        with MathVerifier(verifier.model_copy(update={"math_workers": w})) as mv:
            mv.verify_batch(pairs[: 4 * w])  # warm-up: workers started, math-verify imported
            compare(args.repeat, len(pairs),
                    lambda: timed(lambda: run([math_samples], str(tmp / f"out-{next(outputs)}"), math_config,
                                              [math_file])),
                    lambda: timed(lambda: sum(r.correct for r in mv.verify_batch(pairs))),
                    lambda report: report["benchmarks"]["bench_math"]["correct"])
        for functional in (False, True):
            name = "functional" if functional else "stdin"
            lcb, samples, jobs = code_case(tmp, args.code_problems, args.code_k, args.tests, functional)
            print(f"LiveCodeBench-style {name}: {len(jobs)} samples x {args.tests} tests ({args.code_problems} "
                  f"problems x {args.code_k}, a third failing at test {args.tests // 2}, first-failure mode), "
                  f"{w} workers", flush=True)
            with CodeVerifier(verifier.model_copy(update={"code_workers": w})) as cv:
                cv.verify_batch(jobs[:w])  # warm-up: sandbox zygotes forked
                compare(args.repeat, len(jobs),
                        lambda: timed(lambda: run([samples], str(tmp / f"out-{next(outputs)}"),  # noqa: B023
                                                  code_config, [lcb])),  # noqa: B023 (called before the next case)
                        lambda: timed(lambda: sum(r.all_passed for r in cv.verify_batch(jobs))),  # noqa: B023
                        lambda report: report["benchmarks"]["livecodebench_v5"]["correct"])


if __name__ == "__main__":
    main()
