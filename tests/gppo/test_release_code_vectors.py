"""The official code reward against vectors computed by the release's own code_r1_compute.compute_score
(tests/release_vectors/code_reward.json, with its provenance and executor; `python -m tests.release_vectors.regenerate
--release GIT_DIR code_reward` remakes it): every planted response scored here, in reward workers and the real
sandbox, gets the release's reward; call-based programs get the names the release's BASE_IMPORTS gives them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from klear.common.config import load_config
from klear.gppo.config import RewardConfig
from klear.gppo.rewards import RewardOutcome, RewardPool
from klear.verifiers._zygote import RELEASE_IMPORTS
from klear.verifiers.config import VerifierConfig
from tests.release_vectors.gen_code_reward import names_of

VECTORS = json.loads((Path(__file__).parents[1] / "release_vectors" / "code_reward.json").read_text())
RELEASE = RewardConfig(mode="official", budget_s=500.0, timeout_reward=-1.0, workers=2)
TINY = load_config(VerifierConfig, "tiny")


def task_of(case: dict[str, Any]) -> dict[str, Any]:
    return {"task": "code", "response": case["response"], "tests": case["tests"], "fn_name": case["fn_name"],
            "problem_id": case["name"]}


@pytest.fixture(scope="module")
def outcomes() -> Iterator[dict[str, RewardOutcome]]:
    """Every case scored as training scores it, under each case's timeout (the release's ground truth "timeout")."""
    scored: dict[str, RewardOutcome] = {}
    for timeout in sorted({case["timeout_s"] for case in VECTORS["cases"]}):
        cases = [case for case in VECTORS["cases"] if case["timeout_s"] == timeout]
        cfg = RELEASE.model_copy(update={"official_timeout_s": float(timeout)})
        with RewardPool(cfg, TINY) as pool:  # one pool at a time: both would take the same sandbox uids
            scored |= {case["name"]: out for case, out in zip(cases, pool.score([task_of(c) for c in cases]))}
    yield scored


def test_vectors_come_from_the_releases_compute_score() -> None:
    [source, names] = VECTORS["provenance"]
    assert (source["repo"], source["file"]) == ("Kwai-Klear/KlearReasoner", "verl/utils/reward_score/code_r1_compute.py")
    assert len(source["commit"]) == 40 and source["executor"]
    assert names["file"].endswith("code_r1_reward/utils.py")
    rewards = {case["reward"] for case in VECTORS["cases"]}
    assert rewards >= {1.0, 0.0, -1.0, -0.5, -2.0}  # every kind of outcome is among them


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda case: case["name"])
def test_code_reward_is_the_releases(outcomes: dict[str, RewardOutcome], case: dict[str, Any]) -> None:
    out = outcomes[case["name"]]
    assert out.reward == pytest.approx(case["reward"]), (case["name"], out)
    assert not out.timed_out and not out.reason.startswith("error"), out  # scored, not cut by the 500 s budget
    assert out.correct is (case["reward"] == 1.0)


def test_call_based_programs_get_the_releases_names() -> None:
    """_zygote.RELEASE_IMPORTS binds the names BASE_IMPORTS + BASE_LEETCODE_IMPORTS bind, to the same things (the
    module `bisect`, not the function it imports first; `time` the function)."""
    ours, release = names_of(RELEASE_IMPORTS), VECTORS["release_names"]
    assert sorted(set(release) - set(ours)) == [] and sorted(set(ours) - set(release)) == []
    assert {name: ours[name] for name in release if ours[name] != release[name]} == {}


@pytest.mark.skipif(not os.environ.get("KLEAR_RELEASE_GIT_DIR"),
                    reason="set KLEAR_RELEASE_GIT_DIR to a git directory of Kwai-Klear/KlearReasoner")
def test_vectors_are_what_the_release_computes_now() -> None:
    """The generator, run again on the release (a minute: firejail starts every program), gives the stored rewards."""
    from tests.release_vectors.gen_code_reward import generate

    fresh = generate(Path(os.environ["KLEAR_RELEASE_GIT_DIR"]))
    assert [(c["name"], c["reward"]) for c in fresh["cases"]] == [(c["name"], c["reward"]) for c in VECTORS["cases"]]
    assert fresh["release_names"] == VECTORS["release_names"]
