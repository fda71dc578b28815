"""rl-filter: the rule on planted pass rates and test counts (exactly 16 tests, exactly 0.5), math agreement,
curate's dedup and decontamination, bad input, and an output `klear gppo` trains on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from klear import testsets
from klear.common import storage
from klear.common.config import load_config
from klear.judge.io import SampleInputError
from klear.rl_filter.config import RlFilterConfig
from klear.rl_filter.decide import decide
from klear.rl_filter.stage import RlFilterError, run
from tests.judge.samples import CORRECT, WRONG, boxed, code_record, math_record, publish_samples, read_parquet_folder, sample_row

CONFIG = load_config(RlFilterConfig, "tiny")


@pytest.mark.parametrize(("kind", "n_tests", "passed", "samples", "overrides", "reason"), [
    ("code", 16, 9, 16, [], None),  # exactly 16 tests, 9/16 > 0.5: kept
    ("code", 16, 8, 16, [], "low_pass_rate"),  # exactly 0.5 is not "more than half"
    ("code", 15, 16, 16, [], "few_tests"),
    ("code", 16, 0, 0, [], "no_samples"),
    ("math", 0, 9, 16, [], None),  # a majority verifies
    ("math", 0, 8, 16, [], "low_pass_rate"),
    ("math", 0, 3, 4, [], None),  # fewer samples than 16: the rate over those there are
    ("math", 0, 2, 3, ["min_samples=4"], "few_samples"),
    ("math", 0, 9, 16, ["min_pass_rate=0.6"], "too_hard"),  # the optional band
    ("math", 0, 16, 16, ["max_pass_rate=0.9"], "too_easy"),
    ("math", 0, 16, 16, [], None),  # no band by default: solved by every sample is kept
])
def test_decide(kind: str, n_tests: int, passed: int, samples: int, overrides: list[str], reason: str | None) -> None:
    assert decide(kind, n_tests, passed, samples, load_config(RlFilterConfig, "paper", overrides)) == reason


def _aime_text() -> str:
    return json.loads(testsets.path("aime24").read_text().splitlines()[0])["problem"]


def _problems(tmp_path: Path) -> str:
    rows = [
        code_record("c_ok", 16), code_record("c_half", 16), code_record("c_few", 15), code_record("c_none", 16),
        math_record("m_major", "6", "Compute the number of ways to choose two items from four distinct items today."),
        math_record("m_tie", "3", "What is the value of one plus two, written as a single whole number please?"),
        {"id": "m_noans", "problem": "Show that the square root of two is irrational, using a complete proof.", "source": "mathsrc"},
        math_record("m_dup", "6", "COMPUTE the number of ways to choose two items, from four distinct items today!"),
        math_record("m_aime", "5", f"Consider this: {_aime_text()}"),
    ]
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _samples(tmp_path: Path) -> str:
    rows: list[dict[str, Any]] = []
    for pid, good in (("c_ok", 9), ("c_half", 8), ("c_few", 16)):
        rows += [sample_row(pid, k, CORRECT if k < good else WRONG, {}) for k in range(16)]
    rows += [sample_row("m_major", k, boxed(a), {}) for k, a in enumerate(["6", "6", "7", "6"])]
    rows += [sample_row("m_tie", k, boxed(a), {}) for k, a in enumerate(["3", "4", "3", "5"])]
    rows += [sample_row("m_dup", 0, boxed("6"), {}), sample_row("m_aime", 0, boxed("5"), {}),
             sample_row("ghost", 0, boxed("1"), {}), sample_row("ghost", 1, boxed("1"), {})]
    return publish_samples(rows, str(tmp_path / "samples"))


def test_filter_keeps_and_removes_with_reasons_and_pass_counts(tmp_path: Path) -> None:
    out = str(tmp_path / "rl")
    report = run(_problems(tmp_path), _samples(tmp_path), out, CONFIG)
    kept = {r["id"]: r for r in read_parquet_folder(out, "prompts")}
    removed = {r["id"]: r for r in read_parquet_folder(out, "removed")}
    assert set(kept) == {"c_ok", "m_major"}
    assert {pid: r["reason"] for pid, r in removed.items()} == {
        "c_half": "low_pass_rate", "c_few": "few_tests", "c_none": "no_samples", "m_tie": "low_pass_rate",
        "m_noans": "no_answer", "m_dup": "duplicate", "m_aime": "contaminated"}
    assert (kept["c_ok"]["passed"], kept["c_ok"]["samples"], kept["c_ok"]["pass_rate"]) == (9, 16, 9 / 16)
    assert (removed["c_half"]["passed"], removed["c_half"]["samples"], removed["c_half"]["pass_rate"]) == (8, 16, 0.5)
    assert (kept["m_major"]["passed"], kept["m_major"]["samples"]) == (3, 4) and kept["m_major"]["answer"] == "6"
    assert removed["m_dup"]["matched"] == ["m_major"]
    assert removed["m_aime"]["matched"] == ["aime24-2024-II-1"] and len(removed["m_aime"]["ngram"].split()) == 9
    # The kept rows are what gppo reads: prompt, answer (math), tests as JSON + fn_name (code), id.
    assert len(json.loads(kept["c_ok"]["tests"])) == 16 and kept["c_ok"]["task"] == "code"
    assert kept["m_major"]["prompt"].startswith("Compute the number") and kept["m_major"]["tests"] == ""
    assert report["totals"] == {"problems": 9, "kept": 2, "removed": 7}
    assert report["reasons"]["low_pass_rate"] == 2 and report["reasons"]["few_tests"] == 1
    assert report["per_source"]["codesrc"] == {"read": 4, "kept": 1, "low_pass_rate": 1, "few_tests": 1, "no_samples": 1}
    assert report["orphan_samples"]["count"] == 2 and report["orphan_samples"]["ids"] == ["ghost"]
    # No sandbox time on problems dropped before judging: c_few's, m_dup's and m_aime's samples were not judged.
    assert report["samples_of_dropped_problems"] == 18 and report["samples_judged"] == 40
    assert sum(report["pass_rate_histogram"]["kept"]) == 2
    with storage.fetch_published(out) as (local, manifest):
        assert manifest.meta["stage"] == "rl-filter"
        assert (local / "pass_rate_hist.png").read_bytes()[:4] == b"\x89PNG"
        assert "low_pass_rate" in (local / "report.md").read_text()


def test_task_code_drops_math_problems_as_no_tests(tmp_path: Path) -> None:
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps(math_record("m", "1")) + "\n" + json.dumps(code_record("c", 16)) + "\n")
    samples = publish_samples([sample_row("c", k, CORRECT, {}) for k in range(2)] + [sample_row("m", 0, boxed("1"), {})],
                              str(tmp_path / "s"))
    report = run(str(problems), samples, str(tmp_path / "out"), CONFIG, task="code")
    assert report["reasons"]["no_tests"] == 1 and report["totals"]["kept"] == 1


def test_bad_input_publishes_nothing(tmp_path: Path) -> None:
    problems = _problems(tmp_path)
    empty = publish_samples([], str(tmp_path / "empty"))
    with pytest.raises(SampleInputError, match="no sample rows"):
        run(problems, empty, str(tmp_path / "o1"), CONFIG)
    strangers = publish_samples([sample_row("x", 0, boxed("1"), {})], str(tmp_path / "strangers"))
    with pytest.raises(RlFilterError, match="none of the 1 samples"):
        run(problems, strangers, str(tmp_path / "o2"), CONFIG)
    (tmp_path / "none.jsonl").write_text("")
    with pytest.raises(RlFilterError, match="holds no problems"):
        run(str(tmp_path / "none.jsonl"), strangers, str(tmp_path / "o3"), CONFIG)
    for out in ("o1", "o2", "o3"):
        assert not (tmp_path / out / storage.MANIFEST_NAME).exists()


@pytest.mark.slow
def test_output_trains_two_gppo_steps(tmp_path: Path, tiny_model: str, demo_files: list[str]) -> None:
    from klear.gppo.config import GppoConfig
    from klear.gppo.stage import run as gppo_run

    items = [json.loads(line) for line in Path(demo_files[0]).read_text().splitlines()[:8]]
    samples = [sample_row(str(item["id"]), k, item["solution"], {}) for item in items for k in range(2)]
    out = str(tmp_path / "rl")
    report = run(demo_files[0], publish_samples(samples, str(tmp_path / "samples")), out,
                 load_config(RlFilterConfig, "tiny", ["decontaminate=false"]), task="math")
    assert report["totals"]["kept"] == len({item["problem"].lower() for item in items}) >= 4
    config = load_config(GppoConfig, "tiny-math", ["max_steps=2", "save_steps=100"])
    trained = gppo_run(tiny_model, [out], str(tmp_path / "gppo"), config, work_dir=str(tmp_path / "work"))
    assert trained["data"]["read"] == report["totals"]["kept"] and trained["data"]["kept"] == trained["data"]["read"]
    assert trained["training"]["global_step"] == 2
