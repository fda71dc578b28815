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

from klear.common.chat import THINK_CLOSE, THINK_OPEN, answer_section, format_fault
from klear.common.parallel import resolve_workers
from klear.common.workers import WorkerPool
from klear.gppo.config import RewardConfig
from klear.verifiers.code_verifier import (
    CodeResult,
    TestCase,
    extract_program_release,
    process_verifier,
    select_tests,
    verdict_of,
)
from klear.verifiers.config import VerifierConfig, worker_verifier
from klear.verifiers.math_verifier import extract_answer, judge, judge_official

__all__ = [
    "RewardOutcome", "RewardPool", "code_detail", "code_outcome", "code_reward", "failed_outcome", "format_check",
    "format_reward_override", "math_judgement", "math_outcome", "math_reward", "official_code_result",
    "official_math_judgement", "official_verifier", "score_rollout",
]

log = logging.getLogger(__name__)

# A worker imports the verifiers (math-verify, sympy) and the scorer before it is ready: seconds, but a node busy
# with a trainer can make it much slower. (No torch: klear.gppo.config keeps the loss names out of losses.py.)
START_TIMEOUT_S = 120.0
CLOSE_GRACE_S = 5.0  # on close, time for workers to shut their sandbox pools down before they are killed
# The released reward_config.ScoringConfig: wo_eos_think, wo_bos_think.
OFFICIAL_NO_THINK_END = -0.5
OFFICIAL_NO_THINK_START = -2.0
# The released firejail_exec.code_exec_firejail's other limits: --rlimit-nofile=32, --rlimit-fsize=8m,
# --rlimit-nproc=32 (its --timeout and --rlimit-as are RewardConfig.official_timeout_s / official_memory_mb).
OFFICIAL_NOFILE = 32
OFFICIAL_FILE_LIMIT_BYTES = 8 << 20
OFFICIAL_NPROC = 32


# --- scoring rules (pure) ---------------------------------------------------------------------------------
def format_check(response: str, cfg: RewardConfig) -> tuple[float | None, str]:
    """(None, "") when the reasoning is enclosed in `<think>...</think>`, else (the format penalty that replaces the
    reward, what is wrong).

    Official penalties, in the release's order (math_dapo / code_r1_compute.compute_score(is_longcot=True): `</think>`
    first, then `<think>`): -0.5 without `</think>` (so a response with neither tag too), else -2.0 without
    `<think>`. reward.mode official checks nothing else; the paper's rule with `official_format_penalties` gives a
    response that has both tags yet is malformed (tags repeated, out of order, text before `<think>`)
    `format_penalty`.
    """
    fault = format_fault(response, cfg.think_start_in_prompt)
    if fault is None:
        return None, ""
    if cfg.mode == "official" or cfg.official_format_penalties:
        if fault == "no_think_end":
            return OFFICIAL_NO_THINK_END, f"missing {THINK_CLOSE}"
        if fault == "no_think_start":
            return OFFICIAL_NO_THINK_START, f"missing {THINK_OPEN}"
        if cfg.mode == "official":
            return None, ""
    elif fault != "malformed":
        return cfg.format_penalty, f"missing {THINK_CLOSE if fault == 'no_think_end' else THINK_OPEN}"
    return cfg.format_penalty, (f"not one {THINK_OPEN}...{THINK_CLOSE} block at the start (tags repeated, out of "
                                f"order, or text before {THINK_OPEN})")


def format_reward_override(response: str, cfg: RewardConfig) -> float | None:
    """None when the reasoning is enclosed in `<think>...</think>`, else the format penalty that replaces the reward
    (see `format_check`)."""
    return format_check(response, cfg)[0]


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
    # Why, in words, for a person (`klear reward`): "missing </think>", "answer 41 is not 42", "11/16 tests passed;
    # first failure: test 3 (wrong_answer)", "reward budget of 500 s exceeded". Metrics use `reason`.
    detail: str = ""


def _filter_key(kind: str, reward: float, correct: bool, cfg: RewardConfig) -> float:
    return float(correct) if cfg.filter_on == "accuracy" else reward


def _short(text: str, limit: int = 60) -> str:
    """`text` on one line, cut to `limit` characters: an answer quoted in a detail."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


# Why an answer was not judged (math_verifier.extract_answer's reasons), in words.
_NOT_JUDGED = {"no_box": f"no \\boxed{{}} after {THINK_CLOSE}", "empty_box": f"empty \\boxed{{}} after {THINK_CLOSE}",
               "no_think_end": f"missing {THINK_CLOSE}", "no_answer": f"no answer found after {THINK_CLOSE}"}


def math_detail(verdict: str, answer: str | None, gold: str) -> str:
    """A math verdict in words: "answer 42 verified against 42", "answer 41 is not 42", "no \\boxed{} after </think>";
    `answer` None: nothing was extracted to judge."""
    if verdict in _NOT_JUDGED:
        return _NOT_JUDGED[verdict]
    if verdict == "judge_error":
        return f"answer {_short(answer or '?')} could not be judged against {_short(gold)}"
    if answer is None:
        return _NOT_JUDGED["no_answer"]
    if verdict == "conflicting_boxes":
        return f"boxes with different answers (the last: {_short(answer)})"
    if verdict == "correct":
        return f"answer {_short(answer)} verified against {_short(gold)}"
    return f"answer {_short(answer)} is not {_short(gold)}"


def math_outcome(response: str, verdict: str, cfg: RewardConfig, answer: str | None = None,
                 gold: str | None = None) -> RewardOutcome:
    """Outcome of a math rollout whose answer got `verdict` ("correct", "wrong", or why it was not judged); with the
    `gold` it was judged against (and the `answer` extracted, None for nothing), the detail says what was compared."""
    penalty, why = format_check(response, cfg)
    reward = math_reward(verdict == "correct", penalty, cfg.mode)
    correct = verdict == "correct" and penalty is None
    detail = why if penalty is not None else verdict if gold is None else math_detail(verdict, answer, gold)
    return RewardOutcome(reward, correct, penalty is None, False, _filter_key("math", reward, correct, cfg),
                         "format" if penalty is not None else verdict, detail)


def code_detail(result: CodeResult, timeout_s: float | None = None) -> str:
    """A code result in words: "all 16 tests passed", "11/16 tests passed; first failure: test 3 (wrong_answer)",
    "... first failure: test 3: timeout (35 s)". Tests are named by their index in the rollout's test list."""
    if result.total == 0:
        return "no tests"
    if result.all_passed:
        return f"all {result.total} tests passed" if result.total > 1 else "the only test passed"
    failures = [t for t in result.tests if t.get("verdict") not in ("passed", "not_run")]
    summary = f"{result.passed}/{result.total} tests passed"
    if not failures:
        return summary
    first = min(failures, key=lambda t: t.get("index", 0))
    what = (f"test {first.get('index', '?')}: timeout ({timeout_s:g} s)" if first["verdict"] == "timeout" and timeout_s
            else f"test {first.get('index', '?')} ({first['verdict']})")
    return f"{summary}; first failure: {what}"


def code_outcome(response: str, result: CodeResult, cfg: RewardConfig, timeout_s: float | None = None) -> RewardOutcome:
    """Outcome of a code rollout whose program got `result` from the code verifier (`timeout_s`: each test's, for the
    detail)."""
    penalty, why = format_check(response, cfg)
    if cfg.mode == "official":  # code_r1_compute: mean of +1/-1 per test run; no program is a format error (-1)
        reward = penalty if penalty is not None else code_reward(result.passed, result.total, None, "plus_minus")
    else:
        reward = code_reward(result.passed, result.total, penalty, cfg.code_reward)
    correct = result.all_passed and penalty is None
    if penalty is not None:
        reason, detail = "format", why
    elif not result.program_found:
        reason = "no_program"
        # official: the release's regex found nothing; paper: the verifier's code_rules extraction did not
        detail = f"no ```python block after {THINK_CLOSE}" if cfg.mode == "official" else "no program found"
    else:
        reason, detail = "correct" if result.all_passed else "wrong", code_detail(result, timeout_s)
    return RewardOutcome(reward, correct, penalty is None, False, _filter_key("code", reward, correct, cfg), reason,
                         detail)


def failed_outcome(task: Mapping, cfg: RewardConfig, reason: str, timed_out: bool) -> RewardOutcome:
    """A rollout that could not be scored (budget overrun, crash): `timeout_reward`, never correct."""
    fmt = format_reward_override(task.get("response") or "", cfg) is None
    detail = (f"reward budget of {cfg.budget_s:g} s exceeded" if timed_out
              else f"could not be scored: {reason.removeprefix('error: ')}")
    return RewardOutcome(cfg.timeout_reward, False, fmt, timed_out,
                         _filter_key(task.get("task", ""), cfg.timeout_reward, False, cfg), reason, detail)


# --- the default scorer (runs inside a worker process) --------------------------------------------------
def math_judgement(response: str, gold: str, verifier: VerifierConfig) -> tuple[str, str | None]:
    """(verdict, the answer judged): "correct", "wrong", "judge_error", or the extraction's reason for judging
    nothing (no_box, ...).

    Calls math-verify directly: the worker's main thread is where its SIGALRM timeouts work.
    """
    ext = extract_answer(response, verifier.think_end, verifier.require_think_end, verifier.require_box,
                         verifier.reject_conflicting_boxes)
    if ext.answer is None or ext.reason == "conflicting_boxes":
        return ext.reason, ext.answer
    try:
        ok = judge(gold, ext.answer, boxed=ext.reason == "ok", timeout=verifier.math_timeout_s)
    except Exception:  # noqa: BLE001 - an answer math-verify cannot handle is wrong, not a crashed scorer
        return "judge_error", ext.answer
    return "correct" if ok else "wrong", ext.answer


def official_math_judgement(response: str, gold: str, verifier: VerifierConfig) -> tuple[str, str | None]:
    """math_dapo.compute_score(is_use_math_verify=True): math-verify on what follows the last </think> (its last box,
    else its last number), a string match with the gold first. ("correct", "wrong" or "judge_error", the answer
    math-verify extracted: None when it found nothing, which is wrong)."""
    try:
        # The release's split("</think>")[-1]: the whole response when it has none (its format check came first).
        section = answer_section(response, require_think_end=False)
        assert section is not None
        ok, answer = judge_official(gold, section, verifier.math_timeout_s)
    except Exception:  # noqa: BLE001 - the release scores what math-verify cannot handle as wrong
        return "judge_error", None
    if answer is None:
        return "wrong", None  # scored as wrong (the metrics' reason); math_detail says nothing was found
    return "correct" if ok else "wrong", answer


def score_rollout(task: dict, cfg: RewardConfig, verifier: VerifierConfig) -> RewardOutcome:
    """The default scorer: math through math-verify, code through the sandboxed code verifier (all tests run)."""
    response = task["response"]
    if task["task"] == "math":
        judgement = official_math_judgement if cfg.mode == "official" else math_judgement
        verdict, answer = judgement(response, task["answer"], verifier)
        return math_outcome(response, verdict, cfg, answer, task["answer"])
    if task["task"] == "code" and cfg.mode == "official":
        tests = [TestCase.from_dict(t) for t in task["tests"]]
        program = extract_program_release(response)
        key = f"{task.get('problem_id', '')}\0{response}"  # a rollout's own draw, the same on every rescoring
        result = official_code_result(program, tests, task.get("fn_name"), key, cfg, verifier)
        return code_outcome(response, result, cfg, cfg.official_timeout_s)
    if task["task"] == "code":
        tests = [TestCase.from_dict(t) for t in task["tests"]]
        result = process_verifier(verifier).verify_response(
            response, tests, task.get("fn_name"), mode="all", problem_id=task.get("problem_id", ""))
        return code_outcome(response, result, cfg, verifier.timeout_s)
    raise ValueError(f"unknown task kind {task['task']!r} (expected math or code)")


def official_verifier(cfg: RewardConfig, verifier: VerifierConfig) -> VerifierConfig:
    """The sandbox settings of the released code reward (code_r1_compute, firejail_exec): its rules (release:
    extraction, bare stdin programs, exit code 0 and exact output), its image's packages, its timeout,
    address-space, file-size, open-file and process limits, its tests at once per rollout (as many sandbox slots),
    every test chosen here."""
    return verifier.model_copy(update={
        "code_rules": "release", "official_packages": list(cfg.official_packages), "timeout_s": cfg.official_timeout_s,
        "memory_mb": cfg.official_memory_mb, "file_limit_bytes": OFFICIAL_FILE_LIMIT_BYTES, "nofile": OFFICIAL_NOFILE,
        "nproc": OFFICIAL_NPROC, "code_workers": cfg.official_tests_at_once, "max_tests": None})


def official_code_result(program: str | None, tests: list[TestCase], fn_name: str | None, key: str, cfg: RewardConfig,
                         verifier: VerifierConfig) -> CodeResult:
    """A program's run on at most `official_max_tests` tests drawn by `key`, `official_tests_at_once` at a time,
    under the release's rules (`official_verifier`): passed when it exits 0 with the expected output after strip()
    (stdin) or returns the expected value (call-based); an error, a timeout or a limit fails the test."""
    chosen = select_tests(len(tests), cfg.official_max_tests, key)
    if program is None:
        return CodeResult(0, len(chosen), 0.0, False, False, [{"index": i, "verdict": "not_run"} for i in chosen])
    pool = process_verifier(official_verifier(cfg, verifier)).pool

    def one(i: int) -> dict:
        test = tests[i]
        if test.testtype == "functional":
            if not fn_name:
                raise ValueError("functional test without fn_name")
            # The returned value, compared here in the form the sandbox sends it (never in the program).
            run = pool.run(program, fn_name=fn_name, args=test.input, timeout_s=cfg.official_timeout_s)
        else:
            run = pool.run(program, test.input, timeout_s=cfg.official_timeout_s)
        return {"index": i, "verdict": verdict_of(run, test, "release")}

    # code_r1_compute.MAX_WORKERS tests at once: 16 tests of 35 s end within 280 s, inside the 500 s budget.
    with ThreadPoolExecutor(max(1, min(cfg.official_tests_at_once, pool.workers))) as ex:
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
        cores = resolve_workers(0)
        if cfg.mode == "official":
            # Each worker runs its rollout's tests `official_tests_at_once` at a time, on as many sandbox slots of
            # its own (uids too); by default one worker per that many cores, so no program waits for a core.
            verifier = official_verifier(cfg, verifier)
        self.cfg, self.verifier = cfg, verifier
        self.workers = cfg.workers or (max(1, cores // cfg.official_tests_at_once) if cfg.mode == "official" else cores)
        cfg_json = cfg.model_dump_json()

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
