"""How one sample is judged: what the parent decides alone (pure), and the scorer a worker process runs.

Math has two modes (verifier.math_mode): strict, below, and official (the released judge_math.py): the whole
response goes to a worker, math-verify extracts its last box anywhere (else its last number), and the finish
reason is ignored, so a truncated response whose last box is right is right.

The parent extracts the answer (math, strict: the last box after `</think>`) or the program (code: the last fenced
python block after `</think>`) and decides every sample that needs no verifier: truncated, no box, no
program, no reference. Only the rest go to worker processes, as small tasks (gold + extracted answer, or
program + tests), where math-verify's SIGALRM timeouts work and a stuck scorer can be killed.

Verdicts (one per sample):
  correct              verified answer / every test passed
  wrong                answer differs / a test's output differs (the first failing test decides the verdict)
  program_timeout, runtime_error, memory_limit, output_limit, sandbox_error
                       code: the first failing test's own verdict (a hanging program is killed per test)
  truncated            finish_reason "length": cut at max tokens, wrong whatever it holds
  no_think_end, no_box, empty_box, conflicting_boxes, no_program
                       nothing to judge where the answer should be
  judge_error          math-verify raised on this answer
  budget_timeout       the whole judgement overran its wall-clock budget: the worker was killed and replaced
  scorer_error         the scorer raised or its worker died; the rest goes on
  no_reference         the problem has neither an answer nor tests (not judged; correct is false)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from klear.common.chat import answer_section
from klear.judge.problems import Problem
from klear.verifiers.code_verifier import CodeResult, TestCase, extract_program, process_verifier, program_of, select_tests
from klear.verifiers.config import VerifierConfig
from klear.verifiers.math_verifier import extract_answer, judge, judge_official

__all__ = ["FAILED_VERDICTS", "Judgement", "code_judgement", "prepare", "score_task"]

FAILED_VERDICTS = ("budget_timeout", "scorer_error")  # judgements that did not complete


@dataclass(frozen=True)
class Judgement:
    """The judge's answer for one sample. `score`: math 1/0, code the fraction of tests passed."""

    kind: str  # math, code, or none (no reference)
    correct: bool
    score: float
    verdict: str
    passed: int = 0
    total: int = 0
    extracted: str | None = None  # math: the answer judged; code: None (programs are long)

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: its deep copy is a measurable share of judging a math sample.
        return {"kind": self.kind, "correct": self.correct, "score": self.score, "verdict": self.verdict,
                "passed": self.passed, "total": self.total, "extracted": self.extracted}


def prepare(response: str, finish_reason: str | None, problem: Problem | None,
            verifier: VerifierConfig) -> Judgement | tuple[dict[str, Any], str | None]:
    """A final Judgement when no verifier is needed, else (worker task, extracted math answer)."""
    if problem is None or problem.kind is None:
        return Judgement("none", False, 0.0, "no_reference")
    kind = problem.kind
    total = len(select_tests(problem.n_tests, verifier.max_tests, problem.id)) if kind == "code" else 0
    if kind == "math" and verifier.math_mode == "official":  # released judge_math.py: whole response, any finish
        assert problem.answer is not None
        return {"kind": "math", "gold": problem.answer, "answer": response, "official": True}, None
    if kind == "code" and verifier.code_rules != "strict":  # lcb_runner's or the release's rule, any finish
        official_program = program_of(response, verifier)
        if official_program is None:
            return Judgement(kind, False, 0.0, "no_program", 0, total)
        return {"kind": "code", "program": official_program, "tests": problem.tests, "fn_name": problem.fn_name,
                "problem_id": problem.id}, None
    if finish_reason == "length":  # cut at max tokens: wrong even if a box happens to be there
        return Judgement(kind, False, 0.0, "truncated", 0, total)
    if kind == "math":
        assert problem.answer is not None
        ext = extract_answer(response, verifier.think_end, verifier.require_think_end, verifier.require_box,
                             verifier.reject_conflicting_boxes)
        if ext.answer is None or ext.reason == "conflicting_boxes":
            return Judgement(kind, False, 0.0, ext.reason, extracted=ext.answer)
        return {"kind": "math", "gold": problem.answer, "answer": ext.answer, "boxed": ext.reason == "ok"}, ext.answer
    if answer_section(response, verifier.think_end, verifier.require_think_end) is None:
        return Judgement(kind, False, 0.0, "no_think_end", 0, total)
    program = extract_program(response, verifier.think_end, verifier.require_think_end)
    if program is None:
        return Judgement(kind, False, 0.0, "no_program", 0, total)
    return {"kind": "code", "program": program, "tests": problem.tests, "fn_name": problem.fn_name,
            "problem_id": problem.id}, None


def failed(kind: str, verdict: str, total: int = 0, extracted: str | None = None) -> Judgement:
    """A judgement that did not complete (budget overrun, crash): wrong, with why."""
    return Judgement(kind, False, 0.0, verdict, 0, total, extracted)


def code_judgement(result: CodeResult) -> Judgement:
    """Judgement of a program from its test results: the first failing test (in index order) names the verdict."""
    if result.all_passed:
        verdict = "correct"
    else:
        first = next((t["verdict"] for t in sorted(result.tests, key=lambda t: t["index"])
                      if t["verdict"] not in ("passed", "not_run")), "wrong_answer")
        verdict = {"wrong_answer": "wrong", "timeout": "program_timeout"}.get(first, first)
    return Judgement("code", result.all_passed, result.pass_fraction, verdict, result.passed, result.total)


# --- the default scorer (runs inside a worker process) --------------------------------------------------
def score_task(task: Mapping[str, Any], verifier: VerifierConfig) -> dict[str, Any]:
    """Judge one prepared task: math through math-verify, code through the sandboxed code verifier.

    Returns Judgement fields (kind, correct, score, verdict, passed, total). Raises on malformed tasks
    (e.g. a functional test without fn_name): the pool counts that sample as scorer_error.
    """
    if task["kind"] == "math" and task.get("official"):
        try:
            ok, extracted = judge_official(task["gold"], task["answer"], timeout=verifier.math_timeout_s)
        except Exception:  # noqa: BLE001 - as the released judge: what math-verify cannot handle is wrong
            return Judgement("math", False, 0.0, "judge_error").to_dict()
        return Judgement("math", ok, 1.0 if ok else 0.0, "correct" if ok else "wrong", extracted=extracted).to_dict()
    if task["kind"] == "math":
        try:
            ok = judge(task["gold"], task["answer"], boxed=task["boxed"], timeout=verifier.math_timeout_s)
        except Exception:  # noqa: BLE001 - an answer math-verify cannot handle is wrong, not a crashed scorer
            return Judgement("math", False, 0.0, "judge_error").to_dict()
        return Judgement("math", bool(ok), 1.0 if ok else 0.0, "correct" if ok else "wrong").to_dict()
    if task["kind"] == "code":
        tests = [TestCase.from_dict(t) for t in task["tests"]]
        result = process_verifier(verifier).run_tests(task["program"], tests, task.get("fn_name"),
                                                        problem_id=task.get("problem_id", ""))
        return code_judgement(result).to_dict()
    raise ValueError(f"unknown task kind {task['kind']!r} (expected math or code)")


