"""The filter rule (pure): why a problem is dropped, or None to keep it."""

from __future__ import annotations

from klear.rl_filter.config import RlFilterConfig

# Every reason a problem can be dropped, in the order they are checked.
REASONS = ("contaminated", "short_match", "duplicate", "duplicate_id", "no_answer", "no_tests", "few_tests",
           "no_samples", "few_samples", "low_pass_rate", "too_hard", "too_easy")


def missing_reference(task: str, kind: str | None) -> str | None:
    """no_answer / no_tests when the problem lacks what its task is judged on."""
    if kind is not None:
        return None
    return "no_tests" if task == "code" else "no_answer"


def decide(kind: str, n_tests: int, passed: int, samples: int, config: RlFilterConfig) -> str | None:
    """The reason a judgeable problem is dropped (None: keep). `passed` of `samples` filter-model samples were
    correct (math: verified answer; code: every test passed)."""
    if kind == "code" and n_tests < config.min_tests:
        return "few_tests"
    if samples == 0:
        return "no_samples"
    if samples < config.min_samples:
        return "few_samples"
    rate = passed / samples
    if rate <= config.keep_above:  # "more than half": exactly half is dropped
        return "low_pass_rate"
    if config.min_pass_rate is not None and rate < config.min_pass_rate:
        return "too_hard"
    if config.max_pass_rate is not None and rate > config.max_pass_rate:
        return "too_easy"
    return None
