"""The judge on the real verifiers and sandbox: math answers, programs passing all / some / none of their tests,
a hanging program, a crashing and a hanging scorer; the pure parts; pass rates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from klear.common.config import load_config
from klear.common.records import unwrap_record
from klear.judge import Judge, JudgeConfig, judge_samples, pass_rates, problem_from_row, resolve_problems
from klear.judge.problems import Problem, parse_tests
from klear.judge.rates import histogram
from klear.judge.scoring import Judgement, code_judgement, prepare
from klear.verifiers.code_verifier import CodeResult
from klear.verifiers.config import VerifierConfig
from tests.judge.samples import CORRECT, HALF, HANG, WRONG, boxed, code_record, math_record, program, response, sample_row

# 3 s per test: a correct program must never time out on a busy 2-core machine; the hanging one costs 2 x 3 s.
CONFIG = load_config(JudgeConfig, "tiny", ["verifier.timeout_s=3.0"])


@pytest.fixture(scope="module")
def judge() -> Iterator[Judge]:
    with Judge(CONFIG) as j:
        yield j


# --- pure parts ------------------------------------------------------------------------------------------
def test_unwrap_record_merges_both_levels_outer_wins() -> None:
    original = {"id": "orig-7", "problem": "What is 2+2?", "answer": "4", "extra": 1}
    curated = {"id": "c-7", "source": "numina", "prompt": "What is 2+2?", "record": json.dumps(original)}
    flat = unwrap_record({"id": "c-7", "record": json.dumps(curated)})
    assert flat == {"id": "c-7", "source": "numina", "prompt": "What is 2+2?", "problem": "What is 2+2?",
                    "answer": "4", "extra": 1}
    assert unwrap_record({"id": "x", "record": "not json"}) is None
    assert unwrap_record({"id": "x", "record": "[1, 2]"}) is None
    assert unwrap_record({"id": "x"}) == {"id": "x"}


def test_problem_from_row_kinds_and_references() -> None:
    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    code = problem_from_row({"id": "p", "record": json.dumps({"question": "q", "tests": json.dumps(tests),
                                                               "metadata": json.dumps({"func_name": "solve"})})})
    assert code is not None and code.kind == "code" and code.tests == tests and code.fn_name == "solve"
    math = problem_from_row({"id": "m", "record": json.dumps({"problem": "q", "answer": 3})})
    assert math is not None and math.kind == "math" and math.answer == "3" and math.tests is None
    none = problem_from_row({"id": "n", "record": json.dumps({"problem": "q"})})
    assert none is not None and none.kind is None
    # An explicit task reads only its own reference.
    both = {"id": "b", "answer": "5", "tests": tests}
    assert problem_from_row(both, "math").kind == "math" and problem_from_row(both, "auto").kind == "code"  # type: ignore[union-attr]
    assert parse_tests("[{\"input\": \"1\"}]") is None and parse_tests([]) is None and parse_tests("oops") is None
    changed = problem_from_row({"id": "m", "record": json.dumps({"problem": "q", "answer": 4})})
    assert changed is not None and changed.reference_hash != math.reference_hash


def test_resume_fingerprint_changes_with_response_finish_reason_and_reference() -> None:
    from klear.judge.io import fingerprint

    base = fingerprint(boxed("4"), "stop", _math("4"))
    assert base == fingerprint(boxed("4"), "stop", _math("4"))
    assert len({base, fingerprint(boxed("5"), "stop", _math("4")), fingerprint(boxed("4"), "length", _math("4")),
                fingerprint(boxed("4"), "stop", _math("5")), fingerprint(boxed("4"), "stop", None)}) == 5


def _math(answer: str = "4") -> Problem:
    return Problem.make("m", "math", answer, None, None)


def test_prepare_decides_what_needs_no_verifier() -> None:
    v = VerifierConfig()
    truncated = prepare(boxed("4"), "length", _math(), v)
    assert isinstance(truncated, Judgement) and truncated.verdict == "truncated" and not truncated.correct
    assert prepare("<think>cut off while thin", "length", _math(), v).verdict == "truncated"  # type: ignore[union-attr]
    assert prepare(response("r", "no box here: 4"), "stop", _math(), v).verdict == "no_box"  # type: ignore[union-attr]
    # Several boxes: the last one is the answer (VerifierConfig.reject_conflicting_boxes is off by default).
    assert prepare(response("r", "\\boxed{3} or \\boxed{4}"), "stop", _math(), v)[1] == "4"  # type: ignore[index]
    strict = v.model_copy(update={"reject_conflicting_boxes": True})  # the switch reaches the judge too
    hedge = prepare(response("r", "\\boxed{3} or \\boxed{4}"), "stop", _math(), strict)
    assert isinstance(hedge, Judgement) and hedge.verdict == "conflicting_boxes" and not hedge.correct
    assert prepare("\\boxed{4} without think end", "stop", _math(), v).verdict == "no_think_end"  # type: ignore[union-attr]
    # The last box after </think> is what goes to math-verify; boxes in the reasoning are drafts.
    task, extracted = prepare(response("maybe \\boxed{5}", "so \\boxed{4}"), "stop", _math(), v)  # type: ignore[misc]
    assert task == {"kind": "math", "gold": "4", "answer": "4", "boxed": True} and extracted == "4"
    code = Problem.make("c", "code", None, [{"input": "1", "output": "2", "testtype": "stdin"}] * 3, None)
    assert prepare(response("r", "no code"), "stop", code, v).verdict == "no_program"  # type: ignore[union-attr]
    assert prepare("<think>```python\nprint(2)\n```", "stop", code, v).verdict == "no_think_end"  # type: ignore[union-attr]
    assert prepare(CORRECT, "length", code, v).total == 3  # type: ignore[union-attr]
    assert prepare(CORRECT, "stop", None, v).verdict == "no_reference"  # type: ignore[union-attr]


def test_code_judgement_first_failing_test_names_the_verdict() -> None:
    tests = [{"index": 1, "verdict": "timeout"}, {"index": 0, "verdict": "passed"}, {"index": 2, "verdict": "wrong_answer"}]
    j = code_judgement(CodeResult(1, 3, 1 / 3, False, True, tests))
    assert (j.verdict, j.correct, j.passed, j.total) == ("program_timeout", False, 1, 3)
    assert j.score == pytest.approx(1 / 3)
    assert code_judgement(CodeResult(2, 2, 1.0, True, True, [])).verdict == "correct"


def test_pass_rates_and_histogram() -> None:
    rows = [{"id": "a", "kind": "math", "correct": c, "score": float(c), "verdict": "correct" if c else "wrong"}
            for c in (True, True, False, True)]
    rows += [{"id": "b", "kind": "code", "correct": False, "score": 0.5, "verdict": "budget_timeout"},
             {"id": "c", "kind": "none", "correct": False, "score": 0.0, "verdict": "no_reference"}]
    table = pass_rates(rows)
    assert (table["a"].samples, table["a"].correct, table["a"].pass_rate) == (4, 3, 0.75)
    assert table["b"].unscored == 1 and table["b"].mean_score == 0.5 and table["b"].pass_rate == 0.0
    assert table["c"].pass_rate is None
    assert histogram([0.0, 0.05, 0.5, 0.99, 1.0], bins=10) == [2, 0, 0, 0, 0, 1, 0, 0, 0, 2]


# --- real verifiers --------------------------------------------------------------------------------------
def test_math_samples_with_known_answers(judge: Judge) -> None:
    cases = [  # (gold, response, finish_reason, correct, verdict)
        ("\\frac{1}{2}", boxed("0.5"), "stop", True, "correct"),
        ("2\\sqrt{3}", boxed("\\sqrt{12}"), "stop", True, "correct"),
        ("42", boxed("41"), "stop", False, "wrong"),
        ("42", response("the answer is \\boxed{42}", "I give up"), "stop", False, "no_box"),
        ("42", boxed("42"), "length", False, "truncated"),  # truncated: wrong even with a box
        ("42", "<think>\nlong reasoning cut off \\boxed{42}", "stop", False, "no_think_end"),
    ]
    rows = [sample_row(f"m{i}", 0, text, math_record(f"m{i}", gold), finish) for i, (gold, text, finish, _, _) in enumerate(cases)]
    judged = judge.judge(rows, resolve_problems(rows))
    assert [(j.correct, j.verdict) for j in judged] == [(c, v) for *_, c, v in cases]
    assert [j.score for j in judged] == [1.0 if c else 0.0 for *_, c, _ in cases]
    assert judged[0].extracted == "0.5"


def test_code_samples_pass_all_some_none_and_a_hanging_program(judge: Judge) -> None:
    record = code_record("c1", n_tests=4)
    rows = [sample_row("c1", k, text, record) for k, text in enumerate([CORRECT, HALF, WRONG])]
    rows.append(sample_row("c2", 0, HANG, code_record("c2", n_tests=2)))
    judged = judge.judge(rows, resolve_problems(rows))
    assert [(j.kind, j.passed, j.total, j.correct) for j in judged] == [
        ("code", 4, 4, True), ("code", 2, 4, False), ("code", 0, 4, False), ("code", 0, 2, False)]
    assert [j.score for j in judged] == [1.0, 0.5, 0.0, 0.0]
    assert [j.verdict for j in judged] == ["correct", "wrong", "wrong", "program_timeout"]  # the hang was killed


def test_a_malformed_problem_is_a_counted_scorer_error_and_the_rest_goes_on(judge: Judge) -> None:
    functional = [{"input": "1", "output": "2", "testtype": "functional"}]  # functional tests need fn_name
    bad = {"question": "q", "tests": functional}
    rows = [sample_row("bad", 0, program("class Solution:\n    pass"), bad),
            sample_row("ok", 0, CORRECT, code_record("ok", 2))]
    errors_before = judge.errors
    judged = judge.judge(rows, resolve_problems(rows))
    assert [j.verdict for j in judged] == ["scorer_error", "correct"]
    assert judge.errors == errors_before + 1


def test_crashing_and_hanging_scorers_are_counted_and_the_rest_goes_on() -> None:
    config = CONFIG.model_copy(update={"scorer": "tests.judge.scorers:hostile", "math_budget_s": 5.0})
    rows = [sample_row(f"p{i}", 0, boxed(ans), math_record(f"p{i}", "7"))
            for i, ans in enumerate(["7", "CRASH", "7", "HANG", "8", "7"])]
    with Judge(config) as judge:
        judged = judge.judge(rows, resolve_problems(rows))
        assert judge.timeouts == 1 and judge.errors == 1
    assert [j.verdict for j in judged] == ["correct", "scorer_error", "correct", "budget_timeout", "wrong", "correct"]
    table = pass_rates({"id": r["id"], **j.to_dict()} for r, j in zip(rows, judged))
    assert table["p3"].unscored == 1 and table["p3"].correct == 0


def test_judge_samples_against_problems_by_id(judge: Judge) -> None:
    problems = {"q": Problem.make("q", "math", "10", None, None)}
    rows = [sample_row("q", 0, boxed("10"), {}), sample_row("q", 1, boxed("11"), {}),
            sample_row("stranger", 0, boxed("10"), math_record("stranger", "10"))]
    rows[0]["answer"] = "not the gold"  # a sample's own `answer` column is the model's answer: never read as gold
    out = judge_samples(rows, problems, judge=judge)
    assert [(r["correct"], r["verdict"]) for r in out] == [(True, "correct"), (False, "wrong"),
                                                            (False, "unknown_problem")]
    assert out[0]["prompt"] == rows[0]["prompt"]  # the sample's columns pass through


def test_judge_without_problems_uses_each_samples_record(judge: Judge) -> None:
    rows: list[dict[str, Any]] = [sample_row("r", k, boxed(a), math_record("r", "3")) for k, a in enumerate("3343")]
    rows.append(sample_row("plain", 0, boxed("1"), {"problem": "no reference at all"}))
    out = judge_samples(rows, judge=judge)
    table = pass_rates(out)
    assert table["r"].pass_rate == 0.75 and table["plain"].pass_rate is None
    assert out[-1]["verdict"] == "no_reference"
