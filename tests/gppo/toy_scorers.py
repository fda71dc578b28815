"""Scorers for synthetic RL tasks, run by the reward pool's worker processes like the real verifiers."""

from __future__ import annotations

from typing import Any

from klear.gppo.rewards import RewardOutcome


def digit_fraction(task: dict[str, Any], cfg: Any, verifier: Any) -> RewardOutcome:
    """Reward = share of the response's non-space characters that are digits: a dense signal a random
    tiny model can climb. "Correct" (for the SFT term) = mostly digits."""
    text = "".join(task["response"].split())
    reward = sum(c.isdigit() for c in text) / len(text) if text else 0.0
    return RewardOutcome(reward=reward, correct=reward > 0.5, format_ok=True, timed_out=False, filter_key=reward,
                         reason="scored")


def constant(task: dict[str, Any], cfg: Any, verifier: Any) -> RewardOutcome:
    """The same reward for every rollout: every group is uninformative."""
    return RewardOutcome(reward=1.0, correct=True, format_ok=True, timed_out=False, filter_key=1.0, reason="scored")


def sometimes_hang(task: dict[str, Any], cfg: Any, verifier: Any) -> RewardOutcome:
    """Hangs forever on responses that start with an even character code (about half); scores the rest."""
    text = task["response"]
    if text and ord(text[0]) % 2 == 0:
        while True:
            pass
    return digit_fraction(task, cfg, verifier)
