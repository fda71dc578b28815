"""Math judging modes: strict (the last box after </think>, truncated wrong) and official (the released
benchmarks/judge_math.py: math-verify over the whole response, finish reason ignored), on hand-made responses
whose verdicts differ between the modes, through the verifier pool and through the judge library."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from klear.common.config import load_config
from klear.judge import Judge, JudgeConfig
from klear.judge.problems import Problem
from klear.verifiers import MathVerifier, VerifierConfig

GOLD = "73"
THOUGHT = "<think>\nCount the residents owning each subset, then subtract the overlaps.\n"

# (name, response, finish reason, strict verdict, official verdict, why the modes differ or agree)
CASES = [
    ("truncated_right_box", THOUGHT + "So the count is $\\boxed{73}$, but let me double-check the", "length",
     "truncated", "correct", "official ignores the finish reason; its last box anywhere is right"),
    ("truncated_then_wrong_box", THOUGHT + "First \\boxed{73}, no wait, \\boxed{74}; checking", "length",
     "truncated", "wrong", "official judges the last box, here the wrong one"),
    ("no_box_final_number", THOUGHT + "</think>\n\nThe answer is 73.", "stop",
     "no_box", "correct", "official falls back to math-verify's last number"),
    ("no_box_number_then_other", THOUGHT + "</think>\n\n73 is it. We checked 4 cases.", "stop",
     "no_box", "wrong", "the fallback takes the last number, 4"),
    ("box_only_in_thought", THOUGHT + "I get \\boxed{73}.\n</think>\n\nThat settles it.", "stop",
     "no_box", "correct", "strict reads only what follows </think>; official the whole response"),
    ("two_boxes_thought_and_answer", THOUGHT + "Maybe \\boxed{74}.\n</think>\n\nSo $\\boxed{73}$.", "stop",
     "correct", "correct", "both take the last box"),
    ("two_boxes_answer_last_wrong", THOUGHT + "</think>\n\n\\boxed{73}, or rather \\boxed{74}.", "stop",
     "wrong", "wrong", "both take the last box, a hedge is judged on its last"),
    ("plain_right", THOUGHT + "</think>\n\nThe answer is $\\boxed{73}$.", "stop",
     "correct", "correct", "the ordinary case"),
]
IDS = [c[0] for c in CASES]


@pytest.fixture(scope="module")
def judges() -> Iterator[dict[str, Judge]]:
    tiny = load_config(JudgeConfig, "tiny")
    configs = {mode: tiny.model_copy(update={"workers": 1, "verifier": tiny.verifier.model_copy(update={"math_mode": mode})})
               for mode in ("strict", "official")}
    with Judge(configs["strict"]) as strict, Judge(configs["official"]) as official:
        yield {"strict": strict, "official": official}


def test_modes_differ_as_the_released_judge_does(judges: dict[str, Judge]) -> None:
    rows = [{"id": "p", "sample": i, "response": c[1], "finish_reason": c[2]} for i, c in enumerate(CASES)]
    problems: list[Problem | None] = [Problem.make("p", "math", GOLD, None, None)] * len(rows)
    got = {mode: [j.verdict for j in judge.judge(rows, problems)] for mode, judge in judges.items()}
    assert dict(zip(IDS, got["strict"])) == {c[0]: c[3] for c in CASES}
    assert dict(zip(IDS, got["official"])) == {c[0]: c[4] for c in CASES}


def test_official_reports_what_math_verify_extracted(judges: dict[str, Judge]) -> None:
    rows = [{"id": "p", "sample": 0, "response": CASES[3][1], "finish_reason": "stop"}]
    [j] = judges["official"].judge(rows, [Problem.make("p", "math", GOLD, None, None)])
    assert (j.verdict, j.extracted, j.score) == ("wrong", "4", 0.0)


def test_verifier_pool_official_mode() -> None:
    config = VerifierConfig(math_mode="official", math_workers=1, math_timeout_s=1, math_item_timeout_s=8)
    with MathVerifier(config) as verifier:
        results = verifier.verify_batch([(c[1], GOLD) for c in CASES])
    assert [r.correct for r in results] == [c[4] == "correct" for c in CASES]
    assert results[2].extracted == "73"
