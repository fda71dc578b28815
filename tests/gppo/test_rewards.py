"""GPPO rewards: the scoring rules, the default scorer through real verifiers, and the worker pool's hard budgets
against hostile scorers (real processes, no mocks)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from klear.common.config import load_config
from klear.gppo.config import RewardConfig
from klear.gppo.rewards import (
    RewardPool,
    code_outcome,
    code_reward,
    failed_outcome,
    format_check,
    format_reward_override,
    math_judgement,
    math_outcome,
    math_reward,
    worker_verifier,
)
from klear.verifiers.code_verifier import CodeResult
from klear.verifiers.config import VerifierConfig
from tests.processes import alive, gone_soon

TINY = load_config(VerifierConfig, "tiny")
PAPER = RewardConfig()
OFFICIAL = RewardConfig(official_format_penalties=True)
HOSTILE = RewardConfig(workers=2, budget_s=1.0, timeout_reward=-0.25, scorer="tests.gppo.hostile_scorers:act")

GOOD = "<think>\nreasoning\n</think>\nanswer"


# --- scoring rules ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("response", "paper", "official"),
    [
        (GOOD, None, None),
        ("  <think>\nr\n</think>\na", None, None),  # leading whitespace before the block
        ("reasoning\n</think>\nanswer", -1.0, -2.0),  # no <think>
        ("<think>\nreasoning cut off", -1.0, -0.5),  # <think> but no </think>
        ("no tags at all", -1.0, -0.5),  # the release checks </think> first
        ("<think>\nr\n</think>\n<think>\nagain\n</think>", -1.0, -1.0),  # both tags, but twice
        ("</think>\nr\n<think>\n", -1.0, -1.0),  # out of order
        ("preamble <think>\nr\n</think>\na", -1.0, -1.0),  # text before <think>
    ],
)
def test_format_penalties(response: str, paper: float | None, official: float | None) -> None:
    assert format_reward_override(response, PAPER) == paper
    assert format_reward_override(response, OFFICIAL) == official


def test_official_format_penalties_in_paper_mode_are_the_releases() -> None:
    """The switch gives the release's penalties in the release's order (</think> first, then <think>): the format
    cases of the vectors computed by the release's math_dapo.compute_score, whose answers are right, so the reward is
    the penalty alone; the official mode agrees."""
    vectors = json.loads((Path(__file__).parents[1] / "release_vectors" / "math_reward.json").read_text())["cases"]
    cases = [c for c in vectors if c["name"].startswith(("missing", "no tags", "empty response"))]
    assert {c["name"] for c in cases} >= {"missing </think>, right", "missing <think>, right", "no tags at all, right"}
    for case in cases:
        assert format_reward_override(case["response"], OFFICIAL) == case["reward"], case["name"]
        assert format_reward_override(case["response"], RewardConfig(mode="official")) == case["reward"], case["name"]
    assert format_check("no tags at all", OFFICIAL) == (-0.5, "missing </think>")
    assert format_check("reasoning\n</think>\nanswer", OFFICIAL) == (-2.0, "missing <think>")
    assert format_check("no tags", PAPER) == (-1.0, "missing </think>")
    assert format_check("<think>\nr\n</think>\n<think>\n</think>", PAPER)[1].startswith("not one <think>")


def test_format_penalty_value_is_configurable() -> None:
    assert format_reward_override("no tags", RewardConfig(format_penalty=-0.3)) == -0.3


def test_format_with_think_opened_in_prompt() -> None:
    paper = RewardConfig(think_start_in_prompt=True)
    official = RewardConfig(think_start_in_prompt=True, official_format_penalties=True)
    assert format_reward_override("reasoning\n</think>\nanswer", paper) is None
    assert format_reward_override("reasoning cut off", paper) == -1.0
    assert format_reward_override("reasoning cut off", official) == -0.5
    assert format_reward_override("<think>\nr\n</think>\na", paper) == -1.0  # a second <think>
    assert format_reward_override(GOOD, PAPER) is None


@pytest.mark.parametrize(("correct", "penalty", "reward"),
                         [(True, None, 1.0), (False, None, 0.0), (True, -0.5, -0.5), (False, -2.0, -2.0)])
def test_math_reward(correct: bool, penalty: float | None, reward: float) -> None:
    assert math_reward(correct, penalty) == reward


@pytest.mark.parametrize(
    ("passed", "total", "fraction", "plus_minus"),
    [(3, 3, 1.0, 1.0), (2, 3, 2 / 3, 1 / 3), (1, 4, 0.25, -0.5), (0, 3, 0.0, -1.0), (0, 0, 0.0, -1.0)],
)
def test_code_reward(passed: int, total: int, fraction: float, plus_minus: float) -> None:
    assert code_reward(passed, total, None, "pass_fraction") == pytest.approx(fraction)
    assert code_reward(passed, total, None, "plus_minus") == pytest.approx(plus_minus)
    assert code_reward(passed, total, -0.5, "pass_fraction") == -0.5
    assert code_reward(passed, total, -2.0, "plus_minus") == -2.0


def _code_result(passed: int, total: int, program_found: bool = True) -> CodeResult:
    return CodeResult(passed, total, passed / total, passed == total, program_found)


def test_code_outcome_filter_key() -> None:
    on_all_passed = RewardConfig(filter_on="accuracy")
    partial = code_outcome(GOOD, _code_result(2, 3), RewardConfig(filter_on="reward"))
    assert (partial.reward, partial.filter_key, partial.correct, partial.reason) == (
        pytest.approx(2 / 3), pytest.approx(2 / 3), False, "wrong")
    partial = code_outcome(GOOD, _code_result(2, 3), on_all_passed)
    assert (partial.reward, partial.filter_key) == (pytest.approx(2 / 3), 0.0)
    full = code_outcome(GOOD, _code_result(3, 3), on_all_passed)
    assert (full.reward, full.filter_key, full.correct, full.reason) == (1.0, 1.0, True, "correct")
    official = RewardConfig(code_reward="plus_minus")
    assert code_outcome(GOOD, _code_result(1, 3), official).filter_key == 0.0
    assert code_outcome(GOOD, _code_result(1, 3), official).reward == pytest.approx(-1 / 3)


def test_code_outcome_format_and_missing_program() -> None:
    bad = code_outcome("no think block", _code_result(3, 3), PAPER)  # every test passed, format broken
    assert (bad.reward, bad.correct, bad.format_ok, bad.reason) == (-1.0, False, False, "format")
    # not correct, so not "all passed" for the official filter either: the format penalty is the group's signal
    assert code_outcome("no think block", _code_result(3, 3), PAPER).filter_key == 0.0
    missing = code_outcome(GOOD, _code_result(0, 3, program_found=False), PAPER)
    assert (missing.reward, missing.reason) == (0.0, "no_program")


def test_math_outcome() -> None:
    right = math_outcome(GOOD, "correct", PAPER)
    assert (right.reward, right.correct, right.format_ok, right.filter_key, right.reason) == (1.0, True, True, 1.0,
                                                                                              "correct")
    assert math_outcome(GOOD, "no_box", PAPER).reason == "no_box"
    penalised = math_outcome("answer without think", "correct", OFFICIAL)
    assert (penalised.reward, penalised.correct, penalised.filter_key, penalised.reason, penalised.detail) == (
        -0.5, False, 0.0, "format", "missing </think>")
    no_start = math_outcome("answer\n</think>\n42", "correct", OFFICIAL)
    assert (no_start.reward, no_start.detail) == (-2.0, "missing <think>")
    # the detail says what was compared
    assert math_outcome(GOOD, "correct", PAPER, "42", "42").detail == "answer 42 verified against 42"
    assert math_outcome(GOOD, "wrong", PAPER, "41", "42").detail == "answer 41 is not 42"
    assert math_outcome(GOOD, "no_box", PAPER, None, "42").detail == "no \\boxed{} after </think>"
    # the filter key is accuracy by default, the reward on request
    assert math_outcome("x", "wrong", PAPER).filter_key == 0.0
    assert math_outcome("x", "wrong", RewardConfig(filter_on="reward")).filter_key == -1.0


def test_math_verdict_conflicting_boxes_is_a_switch() -> None:
    """Training judges like evaluation: the last box decides unless the (off by default) switch rejects hedges."""
    hedge = "<think>\nsum it up\n</think>\nFirst I thought $\\boxed{205}$, but finally $\\boxed{204}$."
    assert math_judgement(hedge, "204", TINY)[0] == "correct"
    assert math_judgement(hedge, "205", TINY)[0] == "wrong"
    strict = TINY.model_copy(update={"reject_conflicting_boxes": True})
    assert math_judgement(hedge, "204", strict)[0] == "conflicting_boxes"
    assert math_judgement(hedge.replace("205", "204"), "204", strict)[0] == "correct"  # the same box twice is no hedge


def test_failed_outcome() -> None:
    cfg = RewardConfig(timeout_reward=-0.5)
    out = failed_outcome({"task": "math", "response": GOOD}, cfg, "timeout", timed_out=True)
    assert (out.reward, out.correct, out.format_ok, out.timed_out, out.filter_key) == (-0.5, False, True, True, 0.0)
    assert out.detail == "reward budget of 60 s exceeded"
    code = failed_outcome({"task": "code", "response": "x"}, cfg, "error: boom", timed_out=False)
    assert (code.reward, code.format_ok, code.filter_key, code.reason) == (-0.5, False, 0.0, "error: boom")
    assert code.detail == "could not be scored: boom"


def test_release_budget_overrun_and_scorer_error_score_exactly_minus_one() -> None:
    """reward_manager/dapo.py: a rollout over TIMEOUT_PER_TASK (500 s) or whose compute_score raised gets -1.0."""
    release = RewardConfig(mode="official", budget_s=500, timeout_reward=-1)
    for response in (GOOD, "no tags", "<think>\ncut"):  # whatever the format: no format penalty replaces it
        for reason, timed_out in (("timeout", True), ("error: ValueError: x", False)):
            out = failed_outcome({"task": "code", "response": response}, release, reason, timed_out)
            assert (out.reward, out.correct, out.filter_key) == (-1.0, False, 0.0)
    assert failed_outcome({"task": "code", "response": GOOD}, release, "timeout", True).detail == (
        "reward budget of 500 s exceeded")


def test_worker_verifier_gives_disjoint_sandbox_slots() -> None:
    auto = TINY.model_copy(update={"code_workers": 0})
    a, b = worker_verifier(auto, 0, workers=4, cores=16), worker_verifier(auto, 1, workers=4, cores=16)
    assert (a.code_workers, a.slot_uid_base, b.slot_uid_base) == (4, 61000, 61004)
    assert worker_verifier(auto, 3, workers=32, cores=16).code_workers == 1
    assert worker_verifier(TINY, 1, workers=2, cores=16).slot_uid_base == 61000 + TINY.code_workers
    assert worker_verifier(TINY.model_copy(update={"slot_uid_base": None}), 1, 2, 16).slot_uid_base is None


# --- the default scorer in worker processes ---------------------------------------------------------------
@pytest.fixture(scope="module")
def verifier_pool() -> Iterator[RewardPool]:
    with RewardPool(RewardConfig(workers=2), TINY) as pool:
        yield pool


def test_default_scorer_math(verifier_pool: RewardPool) -> None:
    tasks = [{"task": "math", "response": response, "answer": "\\frac{1}{2}"} for response in (
        "<think>\nhalf\n</think>\nSo the answer is $\\boxed{0.5}$.",
        "<think>\nhalf?\n</think>\nSo the answer is $\\boxed{\\frac{1}{3}}$.",
        "<think>\nhalf, so \\boxed{\\frac12} and I keep going",  # cut off inside the reasoning
    )]
    right, wrong, cut = verifier_pool.score(tasks)
    assert (right.reward, right.correct, right.reason) == (1.0, True, "correct")
    assert (wrong.reward, wrong.correct, wrong.reason) == (0.0, False, "wrong")
    assert (cut.reward, cut.correct, cut.format_ok, cut.reason) == (-1.0, False, False, "format")
    # the reasons in words, carried from the worker
    assert (right.detail, wrong.detail, cut.detail) == ("answer 0.5 verified against \\frac{1}{2}",
                                                        "answer \\frac{1}{3} is not \\frac{1}{2}", "missing </think>")
    assert verifier_pool.last_timeouts == verifier_pool.last_errors == 0


def _program(body: str) -> str:
    return f"<think>\nadd\n</think>\nHere it is:\n```python\na, b = map(int, input().split())\n{body}\n```\n"


def test_default_scorer_code(verifier_pool: RewardPool) -> None:
    tests = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
             {"input": "5 5\n", "output": "10\n", "testtype": "stdin"},
             {"input": "0 7\n", "output": "7\n", "testtype": "stdin"}]
    tasks = [{"task": "code", "response": _program(body), "tests": tests, "problem_id": "sum"}
             for body in ("print(a + b)", "print(a + b if a != 5 else 0)")]
    tasks.append({"task": "code", "response": "<think>\nhmm\n</think>\nno code", "tests": tests})
    full, partial, none = verifier_pool.score(tasks)
    assert (full.reward, full.correct, full.filter_key, full.reason) == (1.0, True, 1.0, "correct")
    assert (partial.reward, partial.correct, partial.reason) == (pytest.approx(2 / 3), False, "wrong")
    assert (none.reward, none.reason) == (0.0, "no_program")
    assert (full.detail, partial.detail) == ("all 3 tests passed", "2/3 tests passed; first failure: test 1 (wrong_answer)")


# --- budgets, crashes, order ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_pool() -> Iterator[RewardPool]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_SECRET_ACCESS_KEY", "never-in-a-worker")
        mp.setenv("HF_TOKEN", "never-in-a-worker")
        pool = RewardPool(HOSTILE, TINY)
    with pool:
        pool.score([{"action": "value", "value": 0.0}])  # workers up, so budgets below exclude start-up
        yield pool


def test_hanging_scorer_is_killed_and_replaced(hostile_pool: RewardPool, tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    before = hostile_pool.timeouts
    start = time.monotonic()
    [out] = hostile_pool.score([{"task": "math", "response": GOOD, "action": "hang", "pid_file": str(pid_file)}])
    assert time.monotonic() - start < HOSTILE.budget_s + 1.5
    assert (out.reward, out.correct, out.timed_out, out.format_ok, out.reason) == (-0.25, False, True, True,
                                                                                   "timeout")
    assert (hostile_pool.timeouts, hostile_pool.last_timeouts) == (before + 1, 1)
    assert gone_soon(int(pid_file.read_text()))
    again = hostile_pool.score([{"action": "value", "value": 0.5}, {"action": "value", "value": 0.75}])
    assert [o.reward for o in again] == [0.5, 0.75] and hostile_pool.last_timeouts == 0


def test_children_of_a_killed_worker_die_with_it(hostile_pool: RewardPool, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    [out] = hostile_pool.score([{"action": "spawn_and_hang", "pid_file": str(pid_file)}])
    assert out.timed_out
    assert gone_soon(int(pid_file.read_text()))


def test_crashing_worker_gives_an_error_outcome(hostile_pool: RewardPool) -> None:
    before = hostile_pool.errors
    crashed, fine = hostile_pool.score([{"action": "crash"}, {"action": "value", "value": 1.0}])
    assert crashed.reason.startswith("error: reward worker died") and "3" in crashed.reason
    assert (crashed.reward, crashed.timed_out, crashed.correct) == (-0.25, False, False)
    assert fine.reward == 1.0
    assert (hostile_pool.errors, hostile_pool.last_errors, hostile_pool.last_timeouts) == (before + 1, 1, 0)
    assert hostile_pool.score([{"action": "value", "value": 0.5}] * 3)[2].reward == 0.5  # replaced


def test_raising_scorer_gives_an_error_outcome(hostile_pool: RewardPool) -> None:
    [out] = hostile_pool.score([{"action": "raise"}])
    assert (out.reward, out.reason, hostile_pool.last_errors) == (-0.25, "error: ValueError: scorer bug", 1)


def test_workers_get_no_secrets(hostile_pool: RewardPool) -> None:
    names = hostile_pool.score([{"action": "env"}])[0].reason.split()
    assert "PATH" in names and "PYTHONPATH" in names
    assert "AWS_SECRET_ACCESS_KEY" not in names and "HF_TOKEN" not in names


def test_order_is_kept_across_workers_and_close_stops_them() -> None:
    sleeps = [0.6, 0.0, 0.3, 0.0, 0.2, 0.0, 0.4, 0.1]
    pool = RewardPool(HOSTILE.model_copy(update={"workers": 3, "budget_s": 10.0}), TINY)
    with pool:
        outcomes = pool.score([{"action": "value", "value": float(i), "sleep": s} for i, s in enumerate(sleeps)])
        assert [o.reward for o in outcomes] == [float(i) for i in range(len(sleeps))]
        pids = {int(o.reason.split()[1]) for o in outcomes}
        assert len({int(o.reason.split()[1]) for o in outcomes[:3]}) == 3  # the first three ran at once
    assert not any(alive(pid) for pid in pids)


def test_scorer_that_cannot_load_is_a_clear_error() -> None:
    with RewardPool(HOSTILE.model_copy(update={"workers": 1, "scorer": "tests.gppo.hostile_scorers:missing"}),
                    TINY) as pool, pytest.raises(RuntimeError, match="failed to start.*hostile_scorers:missing"):
        pool.score([{"action": "value", "value": 0.0}])
