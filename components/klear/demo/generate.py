"""Synthetic prompt sources for the CPU preset and the tests: `klear demo-data --output URI`.

Publishes two sources, each item with a worked reference solution in the paper's chat format
(reasoning inside <think>...</think>, then the answer):

  math.jsonl  arithmetic word problems with integer answers; the prompt is in `problem`,
              the answer in `answer`, the reference in `solution` and as `messages`
  code.jsonl  small stdin/stdout programming problems with >= 16 test cases each; the prompt is
              in `question`, tests in `tests` (LiveCodeBench's {input, output, testtype}), the
              reference program, fenced as ```python, in `solution` and `messages`

and the demo's learnable task (klear/demo/tasks.py), column addition with worked solutions:

  arithmetic.jsonl     the training split: `problem`, `answer` (math RL) and the worked solution as
                       `solution` and `messages` (imported as teacher samples by `klear sample
                       --set backend=records`, trained on by SFT)
  demo_benchmark.jsonl the held-out split, never trained on: {id, benchmark: "demo", problem, answer},
                       what `klear evaluate` reads; no problem shares its operands with a training one

Planted on purpose, so curation has real work: exact duplicates (some re-cased or re-spaced)
and reworded AIME/HMMT problems (case changed, `$` removed, embedded in a longer prompt, cut to
their first 60%). `planted.json` lists them with what curate must do with each.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klear import testsets as benchmarks
from klear.common import lineage, storage
from klear.common.chat import ResponseParts, render_response
from klear.common.records import read_records, write_records
from klear.demo import tasks

NAMES = ("Ava", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luca")
THINGS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards", "stamps", "buttons")


def _chat(prompt: str, reasoning: str, answer_text: str) -> tuple[str, list[dict[str, str]]]:
    solution = render_response(ResponseParts(reasoning, answer_text, True))
    return solution, [{"role": "user", "content": prompt}, {"role": "assistant", "content": solution}]


# --------------------------------------------------------------------------- math


def _math_problem(rng: random.Random) -> tuple[str, int, str]:
    """One word problem: (text, integer answer, step-by-step reasoning)."""
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    kind = rng.randrange(4)
    if kind == 0:
        a, b, c = rng.randint(10, 90), rng.randint(2, 9), rng.randint(5, 40)
        text = (
            f"{name} collects {thing}. Each week {name} buys {b} boxes with {a} {thing} in every box, "
            f"and then gives {c} {thing} to {other}. How many {thing} does {name} keep from one week?"
        )
        answer = a * b - c
        steps = f"{name} buys {b} boxes of {a}, which is {a} * {b} = {a * b}. Giving away {c} leaves {a * b} - {c} = {answer}."
    elif kind == 1:
        per, groups, extra = rng.randint(3, 12), rng.randint(4, 15), rng.randint(1, 9)
        total = per * groups + extra
        text = (
            f"A teacher has {total} {thing} and hands them out to {groups} students, "
            f"{per} to each student. How many {thing} are left over after everyone has received theirs?"
        )
        answer = total - per * groups
        steps = f"{groups} students get {per} each: {groups} * {per} = {per * groups}. Left: {total} - {per * groups} = {answer}."
    elif kind == 2:
        price, count, paid = rng.randint(2, 20), rng.randint(2, 9), 0
        paid = price * count + rng.randint(1, 50)
        text = (
            f"At a market stall {name} buys {count} bags of {thing} at {price} dollars per bag and pays with "
            f"{paid} dollars. How much change, in dollars, should {name} receive?"
        )
        answer = paid - price * count
        steps = f"The bags cost {count} * {price} = {price * count}. Change: {paid} - {price * count} = {answer}."
    else:
        start, rate, days = rng.randint(5, 60), rng.randint(2, 11), rng.randint(3, 20)
        text = (
            f"On the first day {name} has {start} {thing}. Every following day {name} adds {rate} more to the "
            f"collection. How many {thing} does the collection hold on day {days}?"
        )
        answer = start + rate * (days - 1)
        steps = f"After day 1 there are {days - 1} more days of {rate}: {start} + {rate} * {days - 1} = {answer}."
    return text, answer, steps


def math_items(count: int, rng: random.Random) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(items) < count:
        text, answer, steps = _math_problem(rng)
        if text in seen:
            continue
        seen.add(text)
        solution, messages = _chat(text, f"{steps}\nSo the answer is {answer}.", f"The answer is $\\boxed{{{answer}}}$.")
        items.append(
            {"id": f"math-{len(items):05d}", "kind": "math", "problem": text, "answer": str(answer),
             "solution": solution, "messages": messages}
        )
    return items


# --------------------------------------------------------------------------- code


@dataclass(frozen=True)
class CodeTask:
    name: str
    statement: str
    program: str
    make_input: Callable[[random.Random], str]
    solve: Callable[[str], str]


def _ints(line: str) -> list[int]:
    return [int(x) for x in line.split()]


CODE_TASKS = (
    CodeTask(
        "sum-list",
        "You are given an integer n followed by n integers on the next line. Print the sum of the n integers.",
        "n = int(input())\nnums = list(map(int, input().split()))\nprint(sum(nums[:n]))",
        lambda r: (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}\n")([r.randint(-1000, 1000) for _ in range(r.randint(1, 20))]),
        lambda s: str(sum(_ints(s.splitlines()[1]))),
    ),
    CodeTask(
        "reverse-words",
        "Read one line of lowercase words separated by single spaces and print the words in reverse order.",
        "words = input().split()\nprint(' '.join(reversed(words)))",
        lambda r: " ".join(r.choice(("cat", "dog", "sun", "tree", "river", "stone")) for _ in range(r.randint(1, 9))) + "\n",
        lambda s: " ".join(reversed(s.split())),
    ),
    CodeTask(
        "count-vowels",
        "Read a single word made of lowercase English letters and print how many of its letters are vowels "
        "(a, e, i, o or u).",
        "word = input().strip()\nprint(sum(ch in 'aeiou' for ch in word))",
        lambda r: "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(1, 30))) + "\n",
        lambda s: str(sum(ch in "aeiou" for ch in s.strip())),
    ),
    CodeTask(
        "range-spread",
        "Given n on the first line and n integers on the second, print the difference between the largest and "
        "the smallest of them.",
        "n = int(input())\nnums = list(map(int, input().split()))\nprint(max(nums) - min(nums))",
        lambda r: (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}\n")([r.randint(-500, 500) for _ in range(r.randint(1, 15))]),
        lambda s: (lambda xs: str(max(xs) - min(xs)))(_ints(s.splitlines()[1])),
    ),
    CodeTask(
        "palindrome",
        "Read one word and print YES if it reads the same forwards and backwards, and NO otherwise.",
        "word = input().strip()\nprint('YES' if word == word[::-1] else 'NO')",
        lambda r: (lambda w: (w + w[::-1] if r.random() < 0.5 else w) + "\n")("".join(r.choice("abc") for _ in range(r.randint(1, 6)))),
        lambda s: "YES" if s.strip() == s.strip()[::-1] else "NO",
    ),
    CodeTask(
        "gcd-pair",
        "Two positive integers a and b are given on one line. Print their greatest common divisor.",
        "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))",
        lambda r: f"{r.randint(1, 10**6)} {r.randint(1, 10**6)}\n",
        lambda s: str(__import__("math").gcd(*_ints(s))),
    ),
    CodeTask(
        "fizz-count",
        "Given a positive integer n, print how many integers from 1 to n inclusive are divisible by 3 or by 5.",
        "n = int(input())\nprint(n // 3 + n // 5 - n // 15)",
        lambda r: f"{r.randint(1, 10**9)}\n",
        lambda s: (lambda n: str(n // 3 + n // 5 - n // 15))(int(s)),
    ),
    CodeTask(
        "running-max",
        "You get n and then n integers on one line. Print n numbers: the i-th is the maximum of the first i "
        "integers, separated by spaces.",
        "n = int(input())\nnums = list(map(int, input().split()))\nbest = None\nout = []\nfor x in nums[:n]:\n"
        "    best = x if best is None else max(best, x)\n    out.append(best)\nprint(' '.join(map(str, out)))",
        lambda r: (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}\n")([r.randint(-99, 99) for _ in range(r.randint(1, 12))]),
        lambda s: " ".join(str(max(_ints(s.splitlines()[1])[: i + 1])) for i in range(len(_ints(s.splitlines()[1])))),
    ),
)


def code_items(count: int, rng: random.Random, tests_per_problem: int = 16) -> list[dict[str, Any]]:
    items = []
    for i in range(count):
        task = CODE_TASKS[i % len(CODE_TASKS)]
        variant = i // len(CODE_TASKS)
        question = task.statement if variant == 0 else f"{task.statement} (Problem set {variant + 1}.)"
        inputs: list[str] = []
        while len(inputs) < tests_per_problem:
            candidate = task.make_input(rng)
            if candidate not in inputs:
                inputs.append(candidate)
        tests = [{"input": x, "output": task.solve(x) + "\n", "testtype": "stdin"} for x in inputs]
        reasoning = f"Read the input as described, compute the result, print it.\n{task.name}: straightforward."
        solution, messages = _chat(question, reasoning, f"```python\n{task.program}\n```")
        items.append(
            {"id": f"code-{i:05d}", "kind": "code", "question": question, "tests": tests,
             "solution": solution, "messages": messages}
        )
    return items


# --------------------------------------------------------------------------- planted overlaps


def _reworded(problem: str, how: str) -> str:
    if how == "recased-no-dollars":
        return problem.replace("$", "").upper()
    if how == "embedded":
        return f"Here is a question from my practice sheet, please help me think it through. {problem} Thanks a lot!"
    if how == "first-60-percent":
        tokens = problem.split()
        return " ".join(tokens[: max(1, int(len(tokens) * 0.6))])
    if how == "respaced":
        return "  ".join(problem.replace(",", " ,").split())
    raise ValueError(how)


def planted(math: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Rows appended to math.jsonl: duplicates of earlier rows and reworded test-set problems."""
    rows: list[dict[str, Any]] = []
    for k, original in enumerate(rng.sample(math, min(4, len(math)))):
        text = original["problem"] if k % 2 == 0 else "  " + original["problem"].upper().replace(".", " . ")
        rows.append({**original, "id": f"dup-{k}", "problem": text, "expect": "duplicate", "of": original["id"]})
    ways = ("recased-no-dollars", "embedded", "first-60-percent", "respaced")
    for b, name in enumerate(benchmarks.NAMES):
        items = read_records(str(benchmarks.path(name)))
        for k, item in enumerate(rng.sample(items, 2)):
            how = ways[(2 * b + k) % len(ways)]
            rows.append(
                {"id": f"leak-{item['id']}-{how}", "kind": "math", "problem": _reworded(item["problem"], how),
                 "answer": item["answer"], "expect": "contaminated", "of": item["id"]}
            )
    # Prompts under 9 words cannot share a 9-gram: one occurs inside a test item, one does not.
    leak = read_records(str(benchmarks.path("aime25")))[0]
    rows.append({"id": "short-leak", "kind": "math", "problem": " ".join(leak["problem"].split()[:6]),
                 "answer": "0", "expect": "short_match", "of": leak["id"]})
    rows.append({"id": "short-clean", "kind": "math", "problem": "What is seven times eight?", "answer": "56",
                 "expect": "kept", "of": ""})
    return rows


ARITHMETIC_COUNT = 2000
BENCHMARK_COUNT = 200


def generate(output: str, math_count: int = 200, code_count: int = 16, seed: int = 0,
             arithmetic_count: int = ARITHMETIC_COUNT, benchmark_count: int = BENCHMARK_COUNT) -> dict[str, Any]:
    storage.check_output(output, stage="demo-data")
    rng = random.Random(seed)
    math = math_items(math_count, rng)
    code = code_items(code_count, rng)
    extra = planted(math, rng)
    # The arithmetic splits draw from their own seeded streams: math.jsonl and code.jsonl stay as they were.
    arithmetic = tasks.train_items(arithmetic_count, seed, held_out=benchmark_count)
    benchmark = tasks.benchmark_items(benchmark_count, seed)
    with tempfile.TemporaryDirectory(prefix="klear-demo-") as tmp:
        root = Path(tmp)
        write_records(({k: v for k, v in row.items() if k not in ("expect", "of")} for row in math + extra),
                      root / "math.jsonl")
        write_records(code, root / "code.jsonl")
        if arithmetic:  # absent rather than empty: a consumer of the folder reads only what exists
            write_records(arithmetic, root / "arithmetic.jsonl")
        if benchmark:
            write_records(benchmark, root / "demo_benchmark.jsonl")
        summary = {
            "math": len(math) + len(extra),
            "code": len(code),
            "arithmetic": len(arithmetic),
            "benchmark": len(benchmark),
            "planted": [{"id": r["id"], "expect": r["expect"], "of": r["of"]} for r in extra],
        }
        (root / "planted.json").write_text(json.dumps(summary, indent=2))
        # Made from nothing but the seed: a lineage with no inputs and no config (a source of the chain).
        storage.publish_dir(root, output, meta={"stage": "demo-data", "seed": seed, "lineage": lineage.record([], None)})
    return summary


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo-data", help="synthetic prompt sources for the CPU preset", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, metavar="URI")
    parser.add_argument("--math", type=int, default=200, help="arithmetic word problems (default 200)")
    parser.add_argument("--code", type=int, default=16, help="programming problems (default 16)")
    parser.add_argument("--arithmetic", type=int, default=ARITHMETIC_COUNT,
                        help=f"addition problems with worked solutions, the training split (default {ARITHMETIC_COUNT})")
    parser.add_argument("--benchmark", type=int, default=BENCHMARK_COUNT,
                        help=f"held-out addition problems in demo_benchmark.jsonl (default {BENCHMARK_COUNT})")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=lambda a: print(json.dumps({k: v for k, v in generate(
        a.output, a.math, a.code, a.seed, a.arithmetic, a.benchmark).items() if k != "planted"})))
