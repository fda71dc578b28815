"""benchmarks/math_verify_versions.py on the 0.9.0 side only (CI has no math-verify 0.7.0 interpreter): the seeded
generator, its coverage, the release's judging code against this project's judge_official and official reward,
the figures, and the script end to end with this interpreter on both sides."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import math_verify_versions as mvv
from klear.gppo.config import RewardConfig
from klear.gppo.rewards import score_rollout
from klear.verifiers.config import VerifierConfig
from klear.verifiers.math_verifier import judge_official

SCRIPT = Path(mvv.__file__).resolve()


@pytest.fixture(autouse=True)
def quiet_math_verify() -> Iterator[None]:
    logging.disable(logging.WARNING)  # math-verify logs each parse it gives up on
    yield
    logging.disable(logging.NOTSET)


def test_generator_is_seeded() -> None:
    assert mvv.generate(300, seed=7) == mvv.generate(300, seed=7)
    assert [it["response"] for it in mvv.generate(300, seed=7)] != [it["response"] for it in mvv.generate(300, seed=8)]


def test_generator_covers_every_category_form_and_placement() -> None:
    items = mvv.generate(2000, seed=0)  # the benchmark's default run
    assert {it["category"] for it in items} == set(mvv.CATEGORIES)
    assert {it["form"] for it in items} == set(mvv.FORMS)
    assert {it["placement"] for it in items} == set(mvv.PLACEMENTS)
    for category in mvv.CATEGORIES:  # each category has right answers and near misses
        assert {it["intended"] for it in items if it["category"] == category} == {"right", "wrong"}, category
    # The first rows already hold every category, and every form and placement, so a short run covers them too.
    first = mvv.generate(len(mvv.CATEGORIES) * len(mvv.FORMS), seed=3)
    assert {it["category"] for it in first[: len(mvv.CATEGORIES)]} == set(mvv.CATEGORIES)
    assert {it["form"] for it in first} == set(mvv.FORMS)
    assert {it["placement"] for it in first[: len(mvv.PLACEMENTS)]} == set(mvv.PLACEMENTS)
    several = next(it for it in items if it["form"] == "several_boxes" and it["placement"] == "after_think")
    assert several["response"].count("\\boxed{") == 2
    assert all("</think>" not in it["response"] for it in items if it["placement"] in ("truncated", "no_think"))


def test_hand_cases_are_read_from_the_math_tests() -> None:
    cases = mvv.hand_cases()
    assert len(cases) >= 41  # tests/verifiers/test_math.py's CASES (>= 40) and \boxed{25\%} against 25
    assert (cases[-1]["gold"], cases[-1]["answer"]) == ("25", "25\\%")
    assert ("73", "74") in {(c["gold"], c["answer"]) for c in cases}


def test_release_judging_agrees_with_judge_official_and_the_official_reward() -> None:
    """The copy of the release's judges, run here (0.9.0), gives judge_official's verdict and extraction on every
    generated response (judge_math.py: the whole response) and the official reward of klear.gppo (math_dapo)."""
    from math_verify import parse, verify

    items = mvv.generate(360, seed=0) + mvv.hand_cases()
    reward_cfg, verifier = RewardConfig(mode="official"), VerifierConfig(math_timeout_s=mvv.TIMEOUT_S)
    differ, correct = [], 0
    for it in items:
        got = mvv.judge_item(it["gold"], it["response"], parse, verify)
        correct += got["eval"] == mvv.CORRECT
        try:
            official, extracted = judge_official(it["gold"], it["response"], mvv.TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the pool reports an error, judged wrong, as the release's except does
            official, extracted = False, None
        reward = score_rollout({"task": "math", "response": it["response"], "answer": it["gold"]}, reward_cfg, verifier).reward
        if (got["eval"] == mvv.CORRECT, got["eval_extracted"], got["reward"]) != (official, extracted, reward):
            differ.append((it["id"], it["gold"], it["answer"], got, official, extracted, reward))
    assert not differ, differ
    assert 0.2 < correct / len(items) < 0.8  # right and wrong answers both judged, not all one way


def test_flip_figures_count_each_direction() -> None:
    items = [{"id": i, "category": c, "form": "boxed", "placement": "after_think", "gold": "1", "answer": "1"}
             for i, c in enumerate("aabb")]
    old = [{"eval": s, "eval_extracted": "x"} for s in (1.0, -1.0, 1.0, -1.0)]
    new = [{"eval": s, "eval_extracted": "y"} for s in (-1.0, -1.0, 1.0, 1.0)]
    figures = mvv.flip_figures(items, old, new, "eval")
    assert figures["right_to_wrong"]["count"] == 1 and figures["wrong_to_right"]["count"] == 1
    assert figures["agreement"]["count"] == 2
    assert figures["by_category"] == {"a": {"n": 2, "right_to_wrong": 1, "wrong_to_right": 0},
                                      "b": {"n": 2, "right_to_wrong": 0, "wrong_to_right": 1}}
    assert [f["id"] for f in figures["flipped"]] == [0, 3]
    low, high = mvv.wilson(0, 100)
    assert low == 0.0 and 0.03 < high < 0.04  # Wilson: 1.96^2 / (100 + 1.96^2)
    low, high = mvv.wilson(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-3) and high == pytest.approx(0.5962, abs=1e-3)


def test_script_with_this_interpreter_on_both_sides(tmp_path: Path) -> None:
    """The whole command, both sides through `--worker` subprocesses: the same math-verify finds no flips."""
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--other-python", sys.executable, "--responses", "60",
                          "--jobs", "2", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "do not hold math-verify 0.7.0 and 0.9.0" in run.stderr  # the 0.9.0 interpreter stood in for 0.7.0
    figures = json.loads(out.read_text())
    assert figures["versions"]["090"]["math-verify"] == "0.9.0"
    for judge in ("eval", "reward"):
        assert figures[judge]["responses"] == 60
        assert figures[judge]["agreement"]["count"] == 60 and figures[judge]["flipped"] == []
        assert figures[f"{judge}_hand"]["responses"] == len(mvv.hand_cases())
    # The verdicts from the worker processes are the in-process ones (the sides' shards are put back in order).
    from math_verify import parse, verify

    items = mvv.generate(60, seed=0)
    _, verdicts = mvv.run_side(sys.executable, items, jobs=3)
    assert verdicts == [mvv.judge_item(it["gold"], it["response"], parse, verify) for it in items]


def test_script_without_other_python_says_how_to_make_one() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--other-python" in run.stderr and "pip install math-verify==0.7.0" in run.stderr
