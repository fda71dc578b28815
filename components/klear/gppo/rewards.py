"""GPPO rewards: the scoring rules, the default scorer, and a pool of worker processes with hard budgets.

Only a process-level kill stops CPU-bound reward code (a sympy blow-up, a stuck sandbox call); thread and
asyncio timeouts do not. The caller is a multi-threaded trainer with torch loaded, so workers are plain
`python -m klear.gppo._reward_worker` subprocesses (no fork) run by klear.common.workers.WorkerPool, each in its
own session (killing the session's process group on overrun takes the scorer's children with it) and without
the caller's secrets.

    with RewardPool(config.reward, config.verifier) as pool:
        outcomes = pool.score([{"task": "math", "response": text, "answer": "4"}, ...])   # input order
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from klear.common.chat import THINK_CLOSE, THINK_OPEN
from klear.common.parallel import resolve_workers
from klear.common.workers import WorkerPool
from klear.gppo.config import RewardConfig
from klear.verifiers.code_verifier import (
    CodeResult,
    TestCase,
    extract_program,
    process_verifier,
    select_tests,
    verdict_of,
)
from klear.verifiers.config import VerifierConfig, worker_verifier
from klear.verifiers.math_verifier import extract_answer, format_ok, judge, judge_official

__all__ = [
    "RewardOutcome", "RewardPool", "code_outcome", "code_reward", "failed_outcome", "format_reward_override",
    "exact_output_match", "math_outcome", "math_reward", "math_verdict", "official_code_result", "official_math_verdict",
    "score_rollout",
]

log = logging.getLogger(__name__)

# A worker imports the verifiers (math-verify, sympy) and the scorer before it is ready: seconds, but a node busy
# with a trainer can make it much slower. (No torch: klear.gppo.config keeps the loss names out of losses.py.)
START_TIMEOUT_S = 120.0
CLOSE_GRACE_S = 5.0  # on close, time for workers to shut their sandbox pools down before they are killed
# The released reward_config.ScoringConfig: wo_eos_think, wo_bos_think.
OFFICIAL_NO_THINK_END = -0.5
OFFICIAL_NO_THINK_START = -2.0


# --- scoring rules (pure) ---------------------------------------------------------------------------------
def format_reward_override(response: str, cfg: RewardConfig) -> float | None:
    """None when the reasoning is enclosed in `<think>...</think>`, else the format penalty that replaces the reward.

    Official penalties: -2.0 without `<think>`, -0.5 with `<think>` but without `</think>`; a response that has
    both tags yet is malformed (tags repeated, out of order, text before `<think>`) gets `format_penalty`.
    """
    if cfg.mode == "official":  # math_dapo.compute_score(is_longcot=True): </think> first, then <think>
        if THINK_CLOSE not in response:
            return OFFICIAL_NO_THINK_END
        if not cfg.think_start_in_prompt and THINK_OPEN not in response:
            return OFFICIAL_NO_THINK_START
        return None
    if format_ok(response, cfg.think_start_in_prompt):
        return None
    if cfg.official_format_penalties:
        if not cfg.think_start_in_prompt and THINK_OPEN not in response:
            return -2.0
        if THINK_CLOSE not in response:
            return -0.5
    return cfg.format_penalty


def math_reward(correct: bool, penalty: float | None, mode: Literal["paper", "official"] = "paper") -> float:
    """Paper: 1 for a verified answer, else 0. Official (reward_config.ScoringConfig): 1, else -1. A format penalty
    replaces either."""
    if penalty is not None:
        return penalty
    if correct:
        return 1.0
    return -1.0 if mode == "official" else 0.0


def code_reward(passed: int, total: int, penalty: float | None,
                style: Literal["pass_fraction", "plus_minus"]) -> float:
    """Paper: fraction of tests passed, in [0, 1]. Official: mean of +1 per pass and -1 per failure, in [-1, 1].

    No tests at all is the worst score of the style; a format penalty replaces either.
    """
    if penalty is not None:
        return penalty
    if total == 0:
        return 0.0 if style == "pass_fraction" else -1.0
    if style == "pass_fraction":
        return passed / total
    return (2 * passed - total) / total


@dataclass(frozen=True)
class RewardOutcome:
    """One rollout's score and what the trainer needs besides it."""

    reward: float
    # The answer verified (math) or every test passed (code), in a well-formatted response: the rollouts the SFT
    # term imitates and accuracy counts. A format-penalised response is not correct, as in the official code
    # (SFT on reward == correct score), so the NLL term never trains on the format the penalty punishes.
    correct: bool
    format_ok: bool
    timed_out: bool
    # Whose variation within a group keeps the group (zero-advantage filter), per `filter_on`: whether the rollout is
    # correct (accuracy, the release's filter), or the reward.
    filter_key: float
    reason: str  # correct, wrong, format, timeout, no_program, judge_error, math extraction reasons, error: ...


def _filter_key(kind: str, reward: float, correct: bool, cfg: RewardConfig) -> float:
    return float(correct) if cfg.filter_on == "accuracy" else reward


def math_outcome(response: str, verdict: str, cfg: RewardConfig) -> RewardOutcome:
    """Outcome of a math rollout whose answer got `verdict` ("correct", "wrong", or why it was not judged)."""
    penalty = format_reward_override(response, cfg)
    reward = math_reward(verdict == "correct", penalty, cfg.mode)
    correct = verdict == "correct" and penalty is None
    return RewardOutcome(reward, correct, penalty is None, False, _filter_key("math", reward, correct, cfg),
                         "format" if penalty is not None else verdict)


def code_outcome(response: str, result: CodeResult, cfg: RewardConfig) -> RewardOutcome:
    """Outcome of a code rollout whose program got `result` from the code verifier."""
    penalty = format_reward_override(response, cfg)
    if cfg.mode == "official":  # code_r1_compute: mean of +1/-1 per test run; no program is a format error (-1)
        reward = penalty if penalty is not None else code_reward(result.passed, result.total, None, "plus_minus")
    else:
        reward = code_reward(result.passed, result.total, penalty, cfg.code_reward)
    correct = result.all_passed and penalty is None
    if penalty is not None:
        reason = "format"
    elif not result.program_found:
        reason = "no_program"
    else:
        reason = "correct" if result.all_passed else "wrong"
    return RewardOutcome(reward, correct, penalty is None, False, _filter_key("code", reward, correct, cfg), reason)


def failed_outcome(task: Mapping, cfg: RewardConfig, reason: str, timed_out: bool) -> RewardOutcome:
    """A rollout that could not be scored (budget overrun, crash): `timeout_reward`, never correct."""
    fmt = format_reward_override(task.get("response") or "", cfg) is None
    return RewardOutcome(cfg.timeout_reward, False, fmt, timed_out,
                         _filter_key(task.get("task", ""), cfg.timeout_reward, False, cfg), reason)


# --- the default scorer (runs inside a worker process) --------------------------------------------------
def math_verdict(response: str, gold: str, verifier: VerifierConfig) -> str:
    """"correct", "wrong", "judge_error", or the extraction's reason for judging nothing (no_box, ...).

    Calls math-verify directly: the worker's main thread is where its SIGALRM timeouts work.
    """
    ext = extract_answer(response, verifier.think_end, verifier.require_think_end, verifier.require_box,
                         verifier.reject_conflicting_boxes)
    if ext.answer is None or ext.reason == "conflicting_boxes":
        return ext.reason
    try:
        ok = judge(gold, ext.answer, boxed=ext.reason == "ok", timeout=verifier.math_timeout_s)
    except Exception:  # noqa: BLE001 - an answer math-verify cannot handle is wrong, not a crashed scorer
        return "judge_error"
    return "correct" if ok else "wrong"


def official_math_verdict(response: str, gold: str, verifier: VerifierConfig) -> str:
    """math_dapo.compute_score(is_use_math_verify=True): math-verify on what follows the last </think> (its last box,
    else its last number), a string match with the gold first. "correct", "wrong" or "judge_error"."""
    try:
        ok, _ = judge_official(gold, response.split(THINK_CLOSE)[-1], verifier.math_timeout_s)
    except Exception:  # noqa: BLE001 - the release scores what math-verify cannot handle as wrong
        return "judge_error"
    return "correct" if ok else "wrong"


def score_rollout(task: dict, cfg: RewardConfig, verifier: VerifierConfig) -> RewardOutcome:
    """The default scorer: math through math-verify, code through the sandboxed code verifier (all tests run)."""
    response = task["response"]
    if task["task"] == "math" and cfg.mode == "official":
        return math_outcome(response, official_math_verdict(response, task["answer"], verifier), cfg)
    if task["task"] == "math":
        return math_outcome(response, math_verdict(response, task["answer"], verifier), cfg)
    if task["task"] == "code" and cfg.mode == "official":
        tests = [TestCase.from_dict(t) for t in task["tests"]]
        program = extract_program(response, verifier.think_end, require_think_end=True)
        key = f"{task.get('problem_id', '')}\0{response}"  # a rollout's own draw, the same on every rescoring
        return code_outcome(response, official_code_result(program, tests, task.get("fn_name"), key, cfg, verifier), cfg)
    if task["task"] == "code":
        tests = [TestCase.from_dict(t) for t in task["tests"]]
        result = process_verifier(verifier).verify_response(
            response, tests, task.get("fn_name"), mode="all", problem_id=task.get("problem_id", ""))
        return code_outcome(response, result, cfg)
    raise ValueError(f"unknown task kind {task['task']!r} (expected math or code)")


def official_verifier(cfg: RewardConfig, verifier: VerifierConfig) -> VerifierConfig:
    """The sandbox settings of the released code reward: its timeout and address-space limit, every test chosen here."""
    return verifier.model_copy(update={"timeout_s": cfg.official_timeout_s, "memory_mb": cfg.official_memory_mb,
                                       "max_tests": None})


def exact_output_match(actual: str, expected: str) -> bool:
    """code_r1_compute's comparison: the whole output equal to the expected one after strip(), nothing more."""
    return actual.strip() == expected.strip()


def official_code_result(program: str | None, tests: list[TestCase], fn_name: str | None, key: str, cfg: RewardConfig,
                         verifier: VerifierConfig) -> CodeResult:
    """A program's run on at most `official_max_tests` tests drawn by `key`, judged by exact comparison."""
    chosen = select_tests(len(tests), cfg.official_max_tests, key)
    if program is None:
        return CodeResult(0, len(chosen), 0.0, False, False, [{"index": i, "verdict": "not_run"} for i in chosen])
    pool = process_verifier(official_verifier(cfg, verifier)).pool

    def one(i: int) -> dict:
        test = tests[i]
        if test.testtype == "functional":
            if not fn_name:
                raise ValueError("functional test without fn_name")
            run = pool.run(program, fn_name=fn_name, args=test.input, timeout_s=cfg.official_timeout_s)
            # The returned value, compared here in the form the sandbox's rules send it (never in the program).
            ok = verdict_of(run, test, verifier.code_rules) == "passed"
        else:
            run = pool.run(program, test.input, timeout_s=cfg.official_timeout_s)
            ok = run.status == "ok" and exact_output_match(run.stdout.decode("utf-8", "replace"), test.output)
        return {"index": i, "verdict": "passed" if ok else (run.status if run.status != "ok" else "wrong_answer")}

    with ThreadPoolExecutor(max(1, pool.workers)) as ex:
        entries = list(ex.map(one, chosen))
    passed = sum(e["verdict"] == "passed" for e in entries)
    total = len(chosen)
    return CodeResult(passed, total, passed / total if total else 0.0, total > 0 and passed == total, True, entries)


# --- worker processes ---------------------------------------------------------------------------------
class RewardPool:
    """Score rollouts on worker processes running `cfg.scorer`; every rollout is scored within `cfg.budget_s`.

    A worker that overruns is killed with its children and replaced (outcome: timed_out, `timeout_reward`);
    a scorer that raises or a worker that dies gives an "error: ..." outcome with `timeout_reward`. Workers
    start on the first `score()`; one that cannot start raises RuntimeError.
    """

    def __init__(self, cfg: RewardConfig, verifier: VerifierConfig):
        self.cfg, self.verifier = cfg, verifier
        self.workers = resolve_workers(cfg.workers)
        cfg_json, cores = cfg.model_dump_json(), resolve_workers(0)

        def setup(index: int) -> tuple[str, str]:  # each worker its own share of the sandbox slots
            return cfg_json, worker_verifier(verifier, index, self.workers, cores).model_dump_json()

        self._pool = WorkerPool("klear.gppo._reward_worker", self.workers, setup, item_timeout_s=cfg.budget_s,
                                start_timeout_s=START_TIMEOUT_S, close_grace_s=CLOSE_GRACE_S, name="reward worker")

    # Rollouts that overran the budget / could not be scored: over the pool's life, and in the latest score().
    @property
    def timeouts(self) -> int:
        return self._pool.timeouts

    @property
    def errors(self) -> int:
        return self._pool.errors

    @property
    def last_timeouts(self) -> int:
        return self._pool.last_timeouts

    @property
    def last_errors(self) -> int:
        return self._pool.last_errors

    def score(self, tasks: list[dict]) -> list[RewardOutcome]:
        """Outcomes of `tasks`, in the same order."""
        outcomes = []
        for task, reply in zip(tasks, self._pool.run(tasks)):
            if reply.ok:
                outcomes.append(RewardOutcome(**reply.value))
            elif reply.status == "timeout":
                outcomes.append(failed_outcome(task, self.cfg, "timeout", timed_out=True))
            else:
                outcomes.append(failed_outcome(task, self.cfg, f"error: {reply.message}", timed_out=False))
        self._warn(outcomes)
        return outcomes

    def _warn(self, outcomes: list[RewardOutcome]) -> None:
        if self.last_timeouts:
            log.warning("%d rollout(s) overran the %.1f s reward budget: scored %s, workers replaced",
                        self.last_timeouts, self.cfg.budget_s, self.cfg.timeout_reward)
        if self.last_errors:
            first = next((o.reason for o in outcomes if o.reason.startswith("error: ")), "?")
            log.warning("%d rollout(s) could not be scored (first: %s)", self.last_errors, first)

    def close(self) -> None:
        """Ask every worker to stop, give them a moment to shut their sandboxes, then kill what is left."""
        self._pool.close()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
