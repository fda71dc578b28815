"""The score formulas, on counts whose results are worked out by hand."""

from __future__ import annotations

import math

import pytest

from klear.evaluate.metrics import benchmark_scores, pass_at_k, powers_of_two, stderr_of_mean


def test_pass_at_k_by_hand() -> None:
    assert pass_at_k(8, 4, 2) == pytest.approx(1 - 6 / 28)  # C(4,2)=6, C(8,2)=28
    assert pass_at_k(8, 1, 4) == pytest.approx(1 - 35 / 70)  # C(7,4)=35, C(8,4)=70
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 5, 4) == 1.0  # fewer than k wrong samples: every draw of 4 holds a correct one
    assert pass_at_k(64, 16, 1) == pytest.approx(0.25)  # pass@1 is the fraction correct
    with pytest.raises(ValueError):
        pass_at_k(8, 9, 1)
    with pytest.raises(ValueError):
        pass_at_k(8, 1, 16)


def test_powers_of_two() -> None:
    assert powers_of_two(64) == [1, 2, 4, 8, 16, 32, 64]
    assert powers_of_two(8) == [1, 2, 4, 8]
    assert powers_of_two(6) == [1, 2, 4]
    assert powers_of_two(1) == [1]


def test_stderr() -> None:
    assert stderr_of_mean([1.0]) is None
    assert stderr_of_mean([0.5, 0.5, 0.5]) == 0.0
    # mean 0.5, sample variance ((0.5)^2 + (0.5)^2) / 1 = 0.5, stderr sqrt(0.5) / sqrt(2) = 0.5
    assert stderr_of_mean([0.0, 1.0]) == pytest.approx(0.5)


def test_benchmark_scores_planted_counts() -> None:
    """Four problems, 8 samples each, 8/4/1/0 correct."""
    scores = benchmark_scores([8, 4, 1, 0], 8)
    fractions = [1.0, 0.5, 0.125, 0.0]
    mean = 1.625 / 4
    sd = math.sqrt(sum((f - mean) ** 2 for f in fractions) / 3)
    assert scores["problems"] == 4
    assert scores["pass@1"] == pytest.approx(40.625)
    assert scores["stderr"] == pytest.approx(100 * sd / 2) and scores["stderr"] == pytest.approx(22.4624, abs=1e-4)
    assert scores["pass@k"] == pytest.approx({
        "1": 40.625,
        "2": 100 * (1 + 22 / 28 + 7 / 28 + 0) / 4,  # 1 - C(8-c,2)/28 per problem
        "4": 100 * (1 + 69 / 70 + 35 / 70 + 0) / 4,  # 1 - C(8-c,4)/70
        "8": 75.0,
    })
