"""The demo's learnable task: column addition with a worked, digit-by-digit solution.

    What is 47 + 38?  ->  <think>\n7 + 8 = 15\n4 + 3 + 1 = 8\n</think>\n\nThe answer is $\\boxed{85}$.

Each reasoning line adds one column, right to left, with the carry of the line before; the answer
reads the lines back. With one token per digit (tiny_model.py) every step is a copy or a one-digit
sum, which a model of a few hundred thousand parameters learns in minutes on a CPU, while a single
wrong digit anywhere makes the answer wrong: after SFT the model is right often but not always,
which is what RL needs (groups of rollouts with mixed rewards).

The held-out benchmark (`benchmark_items`) is drawn first, from its own seed; the training split
(`train_items`) never holds a problem with the same operands in any order. Prompts are shorter than
curate's 9-word n-grams and differ only in their numbers, so decontamination against the benchmark
finds no overlap unless a prompt is repeated verbatim.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from klear.common.chat import ResponseParts, render_response

BENCHMARK = "demo"
_BENCHMARK_SALT = 7_919  # separates the benchmark's random stream from the training split's


@dataclass(frozen=True)
class TaskSpec:
    """Difficulty: how many numbers are summed and how many digits each has (no leading zeros)."""

    operands: int = 2
    digits: int = 2

    def space(self) -> int:
        """Distinct problems up to the order of the operands (multisets of numbers)."""
        return math.comb(9 * 10 ** (self.digits - 1) + self.operands - 1, self.operands)


def draw(rng: random.Random, spec: TaskSpec) -> tuple[int, ...]:
    low, high = 10 ** (spec.digits - 1), 10 ** spec.digits - 1
    return tuple(rng.randint(low, high) for _ in range(spec.operands))


def prompt(numbers: tuple[int, ...]) -> str:
    return f"What is {' + '.join(map(str, numbers))}?"


def worked_lines(numbers: tuple[int, ...]) -> list[str]:
    """One line per column, ones first: the column's digits, the carry in (if any), and their sum."""
    width = max(len(str(n)) for n in numbers)
    lines, carry = [], 0
    for column in range(width):
        digits = [n // 10 ** column % 10 for n in numbers if len(str(n)) > column]
        terms = [*map(str, digits), *([str(carry)] if carry else [])]
        total = sum(digits) + carry
        lines.append(f"{' + '.join(terms)} = {total}")
        carry = total // 10
    return lines


def solution(numbers: tuple[int, ...]) -> str:
    reasoning = "\n".join(worked_lines(numbers))
    return render_response(ResponseParts(reasoning, f"The answer is $\\boxed{{{sum(numbers)}}}$.", True))


def item(numbers: tuple[int, ...], ident: str) -> dict[str, Any]:
    """A training row: the prompt as `problem`, `answer`, and the worked solution as `solution` and `messages`
    (so `klear sample --set backend=records` imports it as a teacher sample)."""
    text, worked = prompt(numbers), solution(numbers)
    return {"id": ident, "kind": "math", "problem": text, "answer": str(sum(numbers)), "solution": worked,
            "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": worked}]}


def _distinct(rng: random.Random, spec: TaskSpec, count: int, taken: set[tuple[int, ...]]) -> Iterator[tuple[int, ...]]:
    """`count` problems whose operand multisets are new (not in `taken`, which is updated)."""
    if count + len(taken) > spec.space() * 0.9:  # rejection sampling would crawl
        raise ValueError(f"{count} more problems of {spec} is too close to its {spec.space()} possible ones")
    made = 0
    while made < count:
        numbers = draw(rng, spec)
        key = tuple(sorted(numbers))
        if key in taken:
            continue
        taken.add(key)
        made += 1
        yield numbers


def benchmark_items(count: int = 200, seed: int = 0, spec: TaskSpec = TaskSpec()) -> list[dict[str, Any]]:
    """The held-out split, as benchmark rows {id, benchmark, problem, answer} (what `klear evaluate` reads)."""
    rng = random.Random(seed * 1_000_003 + _BENCHMARK_SALT)
    return [{"id": f"{BENCHMARK}-{i:04d}", "benchmark": BENCHMARK, "problem": prompt(numbers), "answer": str(sum(numbers))}
            for i, numbers in enumerate(_distinct(rng, spec, count, set()))]


def train_items(count: int, seed: int = 0, spec: TaskSpec = TaskSpec(), held_out: int = 200) -> list[dict[str, Any]]:
    """The training split: `count` problems disjoint (by operands, in any order) from `benchmark_items(held_out, seed)`."""
    rng = random.Random(seed * 1_000_003 + _BENCHMARK_SALT)
    taken: set[tuple[int, ...]] = set()
    for _ in _distinct(rng, spec, held_out, taken):  # replays the benchmark's draws to exclude them
        pass
    rng = random.Random(seed)
    return [item(numbers, f"add-{i:05d}") for i, numbers in enumerate(_distinct(rng, spec, count, taken))]
