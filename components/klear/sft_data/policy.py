"""Difficulty labels and keep policies (pure): which teacher responses become SFT records, and why not."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from klear.common.chat import ResponseParts, split_response
from klear.judge.rates import first_k_pass_rate
from klear.sft_data.config import Policy

Difficulty = Literal["easy", "hard", "unknown"]
POLICIES: tuple[Policy, ...] = ("keep_all", "drop_incorrect_on_easy", "drop_incorrect")


def reference_pass_rate(judged: Iterable[tuple[int, bool]], k: int) -> float | None:
    """The reference model's pass rate over its first `k` samples by index ((sample index, correct) pairs);
    None when it has none."""
    correct, counted = first_k_pass_rate(judged, k)
    return correct / counted if counted else None


def difficulty(pass_rate: float | None, easy_threshold: float) -> Difficulty:
    """easy: the reference model's pass rate is at least `easy_threshold`; hard below; unknown without one."""
    if pass_rate is None:
        return "unknown"
    return "easy" if pass_rate >= easy_threshold else "hard"


def keeps(policy: Policy, level: Difficulty, correct: bool | None, unknown_as: Literal["hard", "easy"] = "hard",
          keep_unlabelled: bool = True) -> bool:
    """Does `policy` keep a response? `correct` None: the problem has no answer or tests (unlabelled)."""
    if correct is None:
        return keep_unlabelled
    if policy == "keep_all" or correct:
        return True
    if policy == "drop_incorrect":
        return False
    return (unknown_as if level == "unknown" else level) != "easy"  # drop_incorrect_on_easy


def truncated(response: ResponseParts | str, finish_reason: str | None) -> bool:
    """Cut at max tokens (finish_reason length), or no end of reasoning: such a record would teach the model to
    stop mid-thought and never close its turn. `response`: its parts (a sample row's: `response_parts`) or text."""
    parts = split_response(response) if isinstance(response, str) else response
    return finish_reason == "length" or parts.reasoning is None or not parts.closed


def correctness(kind: str | None, correct: bool | None) -> bool | None:
    """A judged row's label: None when its problem has no reference (the judge's kind "none")."""
    return None if kind in (None, "none") else bool(correct)
