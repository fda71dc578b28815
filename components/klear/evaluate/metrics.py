"""Scores of one benchmark from per-problem counts (pure): avg@k as pass@1, its standard error, unbiased pass@k.

    pass@1  = mean over problems of c_i / n                       (percent)
    stderr  = sample standard deviation of c_i / n  / sqrt(P)      (percent; the spread of problems, not of samples)
    pass@k  = mean over problems of 1 - C(n - c_i, k) / C(n, k)    (Chen et al. 2021), k = 1, 2, 4, ... <= n
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["benchmark_scores", "pass_at_k", "powers_of_two", "stderr_of_mean"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if not 0 <= c <= n:
        raise ValueError(f"correct count {c} outside 0..{n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} outside 1..{n}")
    # Exact integers: math.comb is 0 when k > n - c, so a problem with more than n - k correct scores 1.
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n: the k values reported for n samples per problem."""
    return [1 << i for i in range(n.bit_length())] if n >= 1 else []


def stderr_of_mean(values: Sequence[float]) -> float | None:
    """Standard error of the mean of `values` (sample standard deviation, n - 1); None for fewer than two."""
    count = len(values)
    if count < 2:
        return None
    mean = sum(values) / count
    variance = sum((v - mean) ** 2 for v in values) / (count - 1)
    return math.sqrt(variance) / math.sqrt(count)


def benchmark_scores(correct: Sequence[int], n: int) -> dict[str, Any]:
    """pass@1, stderr (both in percent) and pass@k per power of two, from each problem's correct count out of n."""
    if not correct:
        raise ValueError("no problems to score")
    fractions = [c / n for c in correct]
    stderr = stderr_of_mean(fractions)
    return {
        "problems": len(correct),
        "pass@1": 100.0 * sum(fractions) / len(fractions),
        "stderr": None if stderr is None else 100.0 * stderr,
        "pass@k": {str(k): 100.0 * sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in powers_of_two(n)},
    }
