"""reward.mode official (the released verl reward code) against the paper's rules, on planted rollouts: the order
of right / no </think> / wrong / no <think>, the code reward's draw of 16 tests and exact comparison, and the
zero-advantage filter key on a planted group."""

from __future__ import annotations

import json

import pytest
import torch

from klear.common.config import load_config
from klear.gppo.batching import varied_groups
from klear.gppo.config import RewardConfig
from klear.gppo.rewards import exact_output_match, math_outcome, official_math_verdict, score_rollout
from klear.verifiers.code_verifier import select_tests
from klear.verifiers.config import VerifierConfig

TINY = load_config(VerifierConfig, "tiny")
PAPER = RewardConfig()
OFFICIAL = RewardConfig(mode="official")

MATH = {
    "right": "<think>\nadd them\n</think>\n\nThe sum is $\\boxed{12}$.",
    "no_think_end": "<think>\nadd them, the sum is \\boxed{12} and then I keep checking",
    "wrong": "<think>\nadd them\n</think>\n\nThe sum is $\\boxed{13}$.",
    "no_think_start": "add them\n</think>\n\nThe sum is $\\boxed{12}$.",
}


def _math(kind: str, cfg: RewardConfig) -> float:
    return score_rollout({"task": "math", "response": MATH[kind], "answer": "12"}, cfg, TINY).reward


def test_official_math_ranks_a_missing_end_of_thought_above_a_wrong_answer() -> None:
    official = {kind: _math(kind, OFFICIAL) for kind in MATH}
    assert official == {"right": 1.0, "no_think_end": -0.5, "wrong": -1.0, "no_think_start": -2.0}
    assert official["right"] > official["no_think_end"] > official["wrong"] > official["no_think_start"]
    paper = {kind: _math(kind, PAPER) for kind in MATH}
    assert paper == {"right": 1.0, "no_think_end": -1.0, "wrong": 0.0, "no_think_start": -1.0}
    # the old switch keeps math at {0, 1}: a missing </think> still ranks below a wrong answer
    switch = {kind: _math(kind, RewardConfig(official_format_penalties=True)) for kind in MATH}
    assert switch["no_think_end"] < switch["wrong"] == 0.0


def test_official_format_checks_the_end_of_thought_first() -> None:
    # the release tests "</think>" before "<think>": a response with neither tag gets -0.5, not -2
    assert score_rollout({"task": "math", "response": "no tags, 12", "answer": "12"}, OFFICIAL, TINY).reward == -0.5
    # repeated tags are no format error there: the text after the last </think> is judged
    twice = "<think>\na\n</think>\n<think>\nb\n</think>\n\\boxed{12}"
    assert score_rollout({"task": "math", "response": twice, "answer": "12"}, OFFICIAL, TINY).reward == 1.0


def test_official_math_judges_the_answer_part_with_math_verify_fallback() -> None:
    assert official_math_verdict("<think>\n\\boxed{12}\n</think>\n\nSo 13.", "12", TINY) == "wrong"
    assert official_math_verdict("<think>\nx\n</think>\n\nThe answer is 12.", "12", TINY) == "correct"


def test_filter_key_on_a_planted_group() -> None:
    """All wrong, one rollout cut before </think>: no answer is right, so the release drops the group; filtering on
    the reward keeps it and trains on the format penalty alone."""
    group = [MATH["wrong"]] * 3 + [MATH["no_think_end"]]
    for cfg, kept in ((OFFICIAL, False), (OFFICIAL.model_copy(update={"filter_on": "reward"}), True),
                      (PAPER, False), (RewardConfig(filter_on="reward"), True)):
        keys = [score_rollout({"task": "math", "response": r, "answer": "12"}, cfg, TINY).filter_key for r in group]
        assert bool(varied_groups(torch.tensor(keys, dtype=torch.float64), 4)[0]) is kept, (cfg.mode, cfg.filter_on)
    mixed = [math_outcome(MATH["right"], "correct", PAPER), math_outcome(MATH["wrong"], "wrong", PAPER)]
    assert [o.filter_key for o in mixed] == [1.0, 0.0]


def _program(body: str) -> str:
    return f"<think>\nplan\n</think>\n\n```python\n{body}\n```"


def _code_task(response: str, n_tests: int, expected: str = "{}") -> dict:
    tests = [{"input": f"{i}\n", "output": expected.format(2 * i) + "\n", "testtype": "stdin"} for i in range(n_tests)]
    return {"task": "code", "response": response, "tests": tests, "fn_name": None, "problem_id": "p1"}


def test_official_code_reward_exact_comparison_and_16_tests() -> None:
    verifier = TINY.model_copy(update={"max_tests": None})
    right = _code_task(_program("print(2 * int(input()))"), 20)
    out = score_rollout(right, OFFICIAL, verifier)
    assert (out.reward, out.correct, out.filter_key) == (1.0, True, 1.0)
    # "10.0" for "10": the same number to the paper's LiveCodeBench comparison, a wrong answer to the release's
    floats = _code_task(_program("print(float(2 * int(input())))"), 4)
    assert score_rollout(floats, PAPER, verifier).reward == 1.0
    assert score_rollout(floats, OFFICIAL, verifier).reward == -1.0
    half = _code_task(_program("n = int(input())\nprint(2 * n if n % 2 == 0 else 0)"), 4)
    # inputs 0..3: the even two pass, the odd two fail: (2 - 2) / 4 (the paper: 2 / 4)
    assert score_rollout(half, OFFICIAL, verifier).reward == pytest.approx(0.0)
    assert score_rollout(half, PAPER, verifier).reward == pytest.approx(0.5)
    assert score_rollout(_code_task("<think>\nplan\n</think>\nno program", 4), OFFICIAL, verifier).reward == -1.0
    assert exact_output_match("1 2\n", "1 2") and not exact_output_match("1  2", "1 2")


def test_official_code_draws_16_tests_per_rollout_seeded() -> None:
    a, b = "p1\0response a", "p1\0response b"
    assert len(select_tests(40, OFFICIAL.official_max_tests, a)) == 16
    assert select_tests(40, 16, a) == select_tests(40, 16, a)  # the same rollout: the same draw
    assert select_tests(40, 16, a) != select_tests(40, 16, b)  # another rollout of the problem: another draw


def test_reward_presets_carry_the_released_values() -> None:
    assert (OFFICIAL.official_max_tests, OFFICIAL.official_timeout_s, OFFICIAL.official_memory_mb) == (16, 35.0, 1024)
    assert json.loads(PAPER.model_dump_json())["filter_on"] == "accuracy"


@pytest.mark.parametrize("rules", ["strict", "official", "runner"])
def test_official_code_reward_judges_returned_values_outside_the_program(rules: str) -> None:
    """Functional tests: the value a method returns (a dict, a nested list) is compared by the reward, whichever
    sandbox rules send it; a program that writes a verdict on its fds instead of returning one gains nothing."""
    verifier = TINY.model_copy(update={"max_tests": None, "code_rules": rules})
    tests = [{"input": f"{i}", "output": json.dumps({"n": [i, [2 * i]]}), "testtype": "functional"} for i in range(3)]

    def task(body: str) -> dict:
        return {"task": "code", "response": _program(f"class Solution:\n    def f(self, n):\n{body}"),
                "tests": tests, "fn_name": "f", "problem_id": "p1"}

    right = score_rollout(task("        return {'n': [n, [2 * n]]}"), OFFICIAL, verifier)
    assert (right.reward, right.correct) == (1.0, True)
    forged = "        import os\n        for fd in range(21):\n            try:\n                os.write(fd, b'true\\n')\n" \
             "            except OSError:\n                pass\n        os._exit(0)"
    assert score_rollout(task(forged), OFFICIAL, verifier).reward == -1.0
