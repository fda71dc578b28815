"""reward.mode official (the released verl reward code) against the paper's rules, on planted rollouts: the order
of right / no </think> / wrong / no <think>, the code reward's extraction regex, draw of 16 tests, exact comparison,
bare programs, packages, limits and two tests at a time within the 500 s budget, and the zero-advantage filter key
on a planted group. tests/gppo/test_release_code_vectors.py holds the release's own rewards for planted responses."""

from __future__ import annotations

import json
import random
import re
import time

import pytest
import torch

from klear.common.config import load_config
from klear.gppo.batching import varied_groups
from klear.gppo.config import RewardConfig
from klear.gppo.rewards import (
    RewardPool,
    math_outcome,
    official_math_judgement,
    official_verifier,
    score_rollout,
)
from klear.verifiers.code_verifier import compare_stdout_exact, extract_program_release, process_verifier, select_tests
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
    assert official_math_judgement("<think>\n\\boxed{12}\n</think>\n\nSo 13.", "12", TINY)[0] == "wrong"
    assert official_math_judgement("<think>\nx\n</think>\n\nThe answer is 12.", "12", TINY)[0] == "correct"


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
    assert compare_stdout_exact("1 2\n", "1 2") and not compare_stdout_exact("1  2", "1 2")


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


# --- the released code reward's rules -----------------------------------------------------------------------
RELEASE_REGEX = re.compile(r"</think>.*```python\n(.*?)\n```", re.DOTALL)  # code_r1_compute.CODE_EXTRACTION_PATTERN


def test_official_extraction_is_the_releases_regex() -> None:
    """extract_program_release finds what the release's regex finds (an empty body: no program), on random
    arrangements of tags, fences and text."""
    pieces = ["</think>", "<think>", "```python\n", "```python \n", "```py\n", "```Python\n", "```\n", "```", "\n```",
              "\n", "x = 1", " "]
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        match = RELEASE_REGEX.search(text)
        assert extract_program_release(text) == ((match.group(1) or None) if match else None), repr(text)
    program = "print(1)"
    for fence, found in (("```python", True), ("```py", False), ("```Python", False), ("```", False),
                         ("```python ", False), ("```python3", False)):
        assert (extract_program_release(f"<think>\nx\n</think>\n{fence}\n{program}\n```") == program) is found, fence


def test_official_code_details_say_why() -> None:
    verifier = TINY.model_copy(update={"max_tests": None})
    cfg = OFFICIAL.model_copy(update={"official_timeout_s": 1.0})
    py = score_rollout(_code_task("<think>\nplan\n</think>\n```py\nprint(0)\n```", 2), cfg, verifier)
    assert (py.reward, py.reason, py.detail) == (-1.0, "no_program", "no ```python block after </think>")
    slow = _code_task(_program("import time\nn = int(input())\nif n:\n    time.sleep(5)\nprint(2 * n)"), 3)
    out = score_rollout(slow, cfg, verifier)
    assert (out.reward, out.detail) == (pytest.approx(-1 / 3), "1/3 tests passed; first failure: test 1: timeout (1 s)")
    wrong = score_rollout(_code_task(_program("print(0)"), 2), cfg, verifier)
    assert wrong.detail == "1/2 tests passed; first failure: test 1 (wrong_answer)"
    assert score_rollout(_code_task(_program("print(2 * int(input()))"), 2), cfg, verifier).detail == "all 2 tests passed"
    no_start = _code_task("plan\n</think>\n```python\nprint(0)\n```", 1)
    assert score_rollout(no_start, cfg, verifier).detail == "missing <think>"


def test_official_stdin_programs_run_bare() -> None:
    """The release runs `python program.py`: no helper imports (sqrt, deque, stdin are NameErrors, each a failed
    test), Python's own recursion limit; the exit code decides along with the output."""
    verifier = TINY.model_copy(update={"max_tests": None})

    def reward(body: str) -> float:
        return score_rollout(_code_task(_program(body), 2), OFFICIAL, verifier).reward

    assert reward("print(2 * int(sqrt(int(input()) ** 2)))") == -1.0
    assert reward("from math import sqrt\nprint(2 * int(sqrt(int(input()) ** 2)))") == 1.0
    assert reward("print(2 * int(stdin.readline()))") == -1.0
    assert reward("import sys\nprint(2 * int(input()))\nsys.exit(1)") == -1.0
    assert reward("import sys\nprint(2 * int(input()))\nsys.exit()") == 1.0
    deep = "def d(k):\n    return 0 if k == 0 else 1 + d(k - 1)\nprint(2 * int(input()) + 0 * d(3000))"
    assert reward(deep) == -1.0
    assert reward("import sys\nsys.setrecursionlimit(10000)\n" + deep) == 1.0
    detail = score_rollout(_code_task(_program("print(sqrt(4))"), 1), OFFICIAL, verifier).detail
    assert detail == "0/1 tests passed; first failure: test 0 (runtime_error)"


def test_official_sandbox_has_the_releases_limits_and_packages() -> None:
    """firejail_exec's limits, the release's two tests at a time as two slots, and its image's packages (read-only);
    the pool the official reward runs on offers them all (installed here)."""
    settings = official_verifier(OFFICIAL, TINY)
    assert (settings.code_rules, settings.timeout_s, settings.memory_mb, settings.nofile, settings.nproc,
            settings.file_limit_bytes, settings.code_workers, settings.max_tests) == (
        "release", 35.0, 1024, 32, 32, 8 << 20, 2, None)
    assert settings.official_packages == ["numpy", "pandas", "sympy", "networkx", "regex"]
    pool = process_verifier(official_verifier(OFFICIAL, TINY.model_copy(update={"max_tests": None}))).pool
    assert pool.packages == sorted(OFFICIAL.official_packages)
    uses = "import numpy, pandas, sympy, networkx, regex\nprint(int(numpy.int64(2)) * int(input()))"
    assert score_rollout(_code_task(_program(uses), 2), OFFICIAL, TINY).reward == 1.0
    writes = pool.run("import numpy, os\nopen(os.path.join(os.path.dirname(numpy.__file__), 'x.py'), 'w')")
    assert writes.status == "runtime_error" and b"PermissionError" in writes.stderr


def test_official_code_runs_two_tests_at_a_time_within_the_budget() -> None:
    """16 tests of 35 s, two at a time, end within 280 s < 500 s: scaled down, 8 tests of 1 s each in a 6.5 s
    budget. A worker with one sandbox slot of its own share (code_workers 1) would run them one after the other
    (8 s) and lose the whole rollout to the budget (-1); two at a time they all pass in about 4 s, never faster
    (no more than two at once)."""
    cfg = RewardConfig(mode="official", workers=1, budget_s=6.5, timeout_reward=-1.0, official_timeout_s=3.0)
    verifier = TINY.model_copy(update={"code_workers": 1})
    sleepy = _code_task(_program("import time\ntime.sleep(1.0)\nprint(2 * int(input()))"), 8)
    with RewardPool(cfg, verifier) as pool:
        [warm] = pool.score([_code_task(_program("print(2 * int(input()))"), 2)])  # worker and sandbox started
        assert warm.reward == 1.0
        start = time.monotonic()
        [out] = pool.score([sleepy])
        elapsed = time.monotonic() - start
    assert (out.reward, out.timed_out, out.detail) == (1.0, False, "all 8 tests passed"), out
    assert 4.0 <= elapsed < cfg.budget_s
