"""Math verification: extraction, hand-written judging cases, the shipped benchmark answers, timeouts, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from klear.testsets import all_paths
from klear.verifiers import MathVerifier, VerifierConfig, extract_answer, format_ok
from klear.verifiers.math_verifier import Extraction, find_boxes

REASONING = "<think>\n" + "Let me work through the problem carefully step by step. " * 40 + "\n</think>\n\n"


def respond(answer: str) -> str:
    return REASONING + f"So the final answer is $\\boxed{{{answer}}}$."


@pytest.fixture(scope="module")
def verifier() -> Iterator[MathVerifier]:
    with MathVerifier(VerifierConfig(math_workers=2, math_timeout_s=1, math_item_timeout_s=8)) as v:
        yield v


# --- extraction (pure) ---------------------------------------------------------------------------
def test_find_boxes_nested_and_escaped_braces() -> None:
    text = r"a \boxed{\frac{1}{2}} b \boxed {\{1, 2\}} c \fbox{x^{2}} d \boxed 7 e \boxed{unclosed"
    assert find_boxes(text) == [r"\frac{1}{2}", r"\{1, 2\}", "x^{2}", "7"]


def test_only_after_last_think_end() -> None:
    response = r"<think>maybe \boxed{1}</think> wait </think> final \boxed{2}"
    assert extract_answer(response).answer == "2"
    assert extract_answer(r"<think>\boxed{5}</think> no box here").reason == "no_box"
    assert extract_answer(r"<think>\boxed{5} cut off").reason == "no_think_end"
    assert extract_answer(r"\boxed{5}", think_end="").answer == "5"
    assert extract_answer(r"<think>x \boxed{5}", require_think_end=False).answer == "5"


def test_several_boxes_and_empty_box() -> None:
    # Default (paper, official code): the last box is the answer, whatever came before it.
    assert extract_answer(r"</think> \boxed{1} or \boxed{2}") == Extraction("2", "ok")
    # The switch: different boxes are a hedge; the same box twice is not.
    assert extract_answer(r"</think> \boxed{1} or \boxed{2}", reject_conflicting=True).reason == "conflicting_boxes"
    assert extract_answer(r"</think> \boxed{2} so again \boxed{ 2 }", reject_conflicting=True).reason == "ok"
    assert extract_answer(r"</think> \boxed{2} so again \boxed{ 2 }").reason == "ok"
    assert extract_answer(r"</think> \boxed{}").reason == "empty_box"


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        ("<think>reason</think>answer", True),
        ("  <think>reason</think>answer", True),
        ("answer <think>reason</think>", False),
        ("<think>reason</think>x</think>", False),
        ("<think><think>r</think>", False),
        ("<think></think>answer", False),
        ("<think>never closed", False),
        ("no tags", False),
    ],
)
def test_format_check(response: str, ok: bool) -> None:
    assert format_ok(response) is ok


def test_format_check_with_think_opened_in_prompt() -> None:
    assert format_ok("reason</think>answer", think_start_in_prompt=True)
    assert not format_ok("reason answer", think_start_in_prompt=True)


# --- judging: >= 40 hand-written cases -----------------------------------------------------------
CASES = [
    # integers and formatting
    ("73", "73", True), ("73", "073", True), ("73", "74", False), ("-5", "-5", True), ("-5", "5", False),
    ("1000", "1,000", True), ("1000", "1{,}000", True), ("0", "0", True),
    # fractions, decimals, radicals
    (r"\frac{1}{2}", "0.5", True), (r"\frac{1}{2}", r"\dfrac{1}{2}", True), (r"\frac{1}{2}", "1/2", True),
    (r"\frac{1}{3}", "0.33", False), (r"\frac{3}{4}", r"\frac{6}{8}", True), (r"2\sqrt{3}", r"\sqrt{12}", True),
    (r"2\sqrt{3}", r"3\sqrt{2}", False), (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}", True),
    (r"\pi", r"\pi", True), (r"2\pi", r"\pi", False), (r"e^{2}", r"e^2", True),
    # LaTeX vs plain, text and units
    ("73", r"\text{73}", True), ("73", r"73^\circ", True), ("73", r"73 \text{ cm}", True),
    ("12", r"12\%", True), (r"x^2+1", "x^2 + 1", True), (r"x^{2}+2x+1", "(x+1)^2", True),
    # intervals and sets
    ("(1,2]", "(1,2]", True), ("(1,2]", "[1,2]", False), (r"\{1,2\}", r"\{2,1\}", True),
    (r"\{1,2\}", r"\{1,3\}", False), (r"(-\infty, 0)", r"(-\infty,0)", True),
    # matrices and tuples
    (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", True),
    (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&2\\4&3\end{pmatrix}", False),
    ("(1,2)", "(1, 2)", True), ("(1,2)", "(2, 1)", False),
    # reward hacking: lists of candidates, \pm, intervals/inequalities containing the gold
    ("73", "1, 2, 73", False), ("73", r"73 \text{ or } 74", False), ("3", r"\pm 3", False),
    ("-3", r"\pm 3", False), ("73", "(0, 100)", False), ("73", "x > 0", False), ("73", r"73 \le x", False),
    ("73", r"\mathbb{R}", False), ("73", r"(-\infty, \infty)", False), ("73", "x", False),
    # malformed LaTeX
    ("73", r"\frac{73", False), ("73", r"}}{{", False), ("73", r"\sqrt{", False),
]


def test_hand_written_cases(verifier: MathVerifier) -> None:
    assert len(CASES) >= 40
    results = verifier.verify_batch([(respond(pred), gold) for gold, pred, _ in CASES])
    wrong = [(gold, pred, r.reason) for (gold, pred, want), r in zip(CASES, results) if r.correct is not want]
    assert not wrong, wrong
    balanced = range(len(CASES) - 3)  # the last three are malformed on purpose
    assert [results[i].extracted for i in balanced] == [CASES[i][1] for i in balanced]


def test_several_boxes_missing_box_and_truncation(verifier: MathVerifier) -> None:
    cases = [
        (REASONING + r"It is \boxed{72} or maybe \boxed{73}.", "73"),  # the last box decides (default)
        (REASONING + r"First I thought \boxed{205}, but finally \boxed{204}.", "204"),
        (REASONING + r"First I thought \boxed{204}, but finally \boxed{205}.", "204"),
        (REASONING + r"It is \boxed{73}, i.e. \boxed{73}.", "73"),  # the same answer twice is fine
        (REASONING + "The answer is 73.", "73"),  # no box: wrong by default
        ("<think>I think it is \\boxed{73} but let me check " + "x " * 100, "73"),  # cut off mid-thought
    ]
    assert [r.correct for r in verifier.verify_batch(cases)] == [True, True, False, True, False, False]
    with MathVerifier(VerifierConfig(math_workers=1, reject_conflicting_boxes=True)) as strict:
        results = strict.verify_batch(cases[:4])
    assert [r.correct for r in results] == [False, False, False, True]  # a hedge is wrong under the switch
    assert [r.reason for r in results][:3] == ["conflicting_boxes"] * 3
    with MathVerifier(VerifierConfig(math_workers=1, require_box=False)) as lenient:
        assert lenient.verify(REASONING + "The answer is 73.", "73").correct


def _benchmark_rows() -> list[dict]:
    rows = [json.loads(line) for path in all_paths() for line in path.read_text().splitlines() if line.strip()]
    assert len(rows) == 90
    return rows


def test_benchmark_gold_answers(verifier: MathVerifier) -> None:
    """Every AIME/HMMT gold answer: judged right against itself, wrong against a different answer."""
    rows = _benchmark_rows()
    right = verifier.verify_batch([(respond(row["answer"]), row["answer"]) for row in rows])
    wrong_answer = [r"\frac{1}{7919}" if row["answer"] != r"\frac{1}{7919}" else "2" for row in rows]
    wrong = verifier.verify_batch([(respond(w), row["answer"]) for w, row in zip(wrong_answer, rows)])
    assert [row["id"] for row, r in zip(rows, right) if not r.correct] == []
    assert [row["id"] for row, r in zip(rows, wrong) if r.correct] == []
    # an integer answer off by one is also wrong
    ints = [row for row in rows if row["answer"].strip().isdigit()]
    off = verifier.verify_batch([(respond(str(int(row["answer"]) + 1)), row["answer"]) for row in ints])
    assert not any(r.correct for r in off)


def test_one_megabyte_response(verifier: MathVerifier) -> None:
    big = "<think>" + ("blah {nested} \\frac{1}{2} " * 45000) + "</think> " + "filler " * 10000 + r"\boxed{42}"
    assert len(big) > 1_000_000
    start = time.monotonic()
    result = verifier.verify(big, "42")
    assert result.correct and result.extracted == "42"
    assert time.monotonic() - start < 5


def test_pathological_expressions_time_out(verifier: MathVerifier) -> None:
    bad = [r"2^{2^{2^{2^{2^{2^{2}}}}}}", r"(10^{10^{10}})!", r"\frac{(x+1)^{30000}-1}{x}"]
    start = time.monotonic()
    results = verifier.verify_batch([(respond(b), "1") for b in bad] + [(respond("73"), "73")])
    assert [r.correct for r in results] == [False, False, False, True]
    assert time.monotonic() - start < 3 * 8  # each within its budget, the batch keeps going


def test_outer_wall_clock_kill() -> None:
    """An item that outlives its budget is killed from outside and the pool keeps working."""
    config = VerifierConfig(math_workers=1, math_timeout_s=30, math_item_timeout_s=0.5)
    with MathVerifier(config) as v:
        v.verify(respond("1"), "1")  # workers up
        start = time.monotonic()
        stalled = v.verify(respond(r"(10^{10^{10}})!"), "1")
        assert time.monotonic() - start < 3
        assert not stalled.correct and stalled.reason == "timeout"
        assert v.verify(respond("73"), "73").correct


def test_cli_verify_math(tmp_path) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"response": respond("73"), "gold": "73"}) + "\n"
                     + json.dumps({"response": respond("72"), "gold": "73"}) + "\n")
    out = subprocess.run([sys.executable, "-m", "klear.cli", "verify-math", "--input", str(cases), "--config", "tiny"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(line["correct"], line["extracted"]) for line in lines] == [(True, "73"), (False, "72")]


def test_cli_verify_math_names_the_bad_line(tmp_path) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"response": respond("1"), "gold": "1"}) + "\n" + '{"response": "no gold"}\n')
    proc = subprocess.run([sys.executable, "-m", "klear.cli", "verify-math", "--input", str(cases)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"{cases}:2" in proc.stderr and proc.stdout == ""
