"""Judging nothing is not a result: samples that match no problem are refused, a problems file without ids is
refused naming the line and field, and unmatched samples beside matched ones are reported prominently. Runs
the real `klear judge` and `klear sft-data` commands."""

from __future__ import annotations

import json
from pathlib import Path

from tests.commands import jsonl, klear

ANSWER = "<think>\nTwo and two.\n</think>\n\n$\\boxed{4}$"


def _samples(tmp_path: Path, ids: list[str]) -> str:
    return jsonl(tmp_path / "samples.jsonl", [{"id": pid, "sample": k, "response": ANSWER, "finish_reason": "stop"}
                                                for pid in ids for k in range(2)])


def test_a_wrong_id_field_is_refused_naming_line_and_field(tmp_path: Path) -> None:
    problems = jsonl(tmp_path / "probs.jsonl", [{"id": f"p{i}", "answer": "4"} for i in range(3)])
    done = klear("judge", "--samples", _samples(tmp_path, ["p0", "p1", "p2"]), "--problems",
                  f"{problems}#id=wrong_field", "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "probs.jsonl:1: field 'wrong_field' is missing or empty" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_problems_file_without_ids_is_refused(tmp_path: Path) -> None:
    problems = jsonl(tmp_path / "probs.jsonl", [{"problem": "2+2?", "answer": "4"}])
    done = klear("judge", "--samples", _samples(tmp_path, ["probs:1"]), "--problems", problems,
                  "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 2 and "probs.jsonl:1: field 'id' is missing or empty" in done.stderr, done.stderr


def test_samples_matching_no_problem_are_refused(tmp_path: Path) -> None:
    problems = jsonl(tmp_path / "probs.jsonl", [{"id": f"q{i}", "answer": "4"} for i in range(3)])
    done = klear("judge", "--samples", _samples(tmp_path, ["p0", "p1", "p2"]), "--problems", problems,
                  "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "none of the 6 samples" in done.stderr and "matches a problem" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out" / "_MANIFEST.json").exists()  # the resume store may stay; nothing is published


def test_unmatched_samples_beside_matched_ones_are_reported_prominently(tmp_path: Path) -> None:
    problems = jsonl(tmp_path / "probs.jsonl", [{"id": "p0", "answer": "4"}])
    done = klear("judge", "--samples", _samples(tmp_path, ["p0", "stray"]), "--problems", problems,
                  "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 of 4 samples match no problem" in done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["totals"]["unknown_problem"] == 2 and report["unknown_problem_ids"] == ["stray"]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "**Warning: 2 of 4 samples match no problem**" in markdown and "stray" in markdown


def test_sft_data_refuses_a_reference_that_matches_no_prompt(tmp_path: Path) -> None:
    teacher = jsonl(tmp_path / "teacher.jsonl", [{"id": "p0", "sample": 0, "prompt": "2+2?", "response": ANSWER,
                                                   "finish_reason": "stop", "record": {"id": "p0", "answer": "4"}}])
    reference = jsonl(tmp_path / "reference.jsonl", [{"id": "other", "sample": 0, "response": ANSWER,
                                                       "finish_reason": "stop", "record": {"id": "other", "answer": "4"}}])
    done = klear("sft-data", "--samples", teacher, "--reference", reference, "--output", str(tmp_path / "out"),
                  "--config", "tiny")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "none of the 1 teacher prompts" in done.stderr and "wrong --reference" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def _math_problems(tmp_path: Path, ids: list[str], **extra: str) -> str:
    return jsonl(tmp_path / "probs.jsonl", [{"id": pid, "problem": f"What is two plus two, case {pid}? One number.",
                                             "answer": "4", **extra} for pid in ids])


def test_rl_filter_refuses_samples_matching_no_problem(tmp_path: Path) -> None:
    done = klear("rl-filter", "--problems", _math_problems(tmp_path, ["q0", "q1"]), "--samples",
                 _samples(tmp_path, ["p0", "p1"]), "--task", "math", "--output", str(tmp_path / "out"),
                 "--config", "tiny")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "none of the 4 samples" in done.stderr and "belongs to a problem" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out" / "_MANIFEST.json").exists()


def test_rl_filter_refuses_problems_without_ids(tmp_path: Path) -> None:
    problems = jsonl(tmp_path / "probs.jsonl", [{"problem": "What is two plus two? One number.", "answer": "4"}])
    done = klear("rl-filter", "--problems", problems, "--samples", _samples(tmp_path, ["probs:1"]), "--task", "math",
                 "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 2 and "probs.jsonl:1: field 'id' is missing or empty" in done.stderr, done.stderr


def test_rl_filter_reports_unmatched_samples_prominently(tmp_path: Path) -> None:
    done = klear("rl-filter", "--problems", _math_problems(tmp_path, ["p0"]), "--samples",
                 _samples(tmp_path, ["p0", "stray"]), "--task", "math", "--output", str(tmp_path / "out"),
                 "--config", "tiny")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 of 4 samples in" in done.stderr and "belong to no problem" in done.stderr, done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["orphan_samples"]["count"] == 2 and report["orphan_samples"]["ids"] == ["stray"]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert markdown.index("**Warning: 2 of 4 samples belong to no problem**") < markdown.index("| reason |")


def test_sft_data_reports_teacher_prompts_missing_from_the_reference(tmp_path: Path) -> None:
    teacher = jsonl(tmp_path / "teacher.jsonl", [{"id": pid, "sample": 0, "prompt": "2+2?", "response": ANSWER,
                                                   "finish_reason": "stop", "record": {"id": pid, "answer": "4"}}
                                                  for pid in ("p0", "lost")])
    reference = jsonl(tmp_path / "reference.jsonl", [{"id": "p0", "sample": 0, "response": ANSWER,
                                                       "finish_reason": "stop", "record": {"id": "p0", "answer": "4"}}])
    done = klear("sft-data", "--samples", teacher, "--reference", reference, "--output", str(tmp_path / "out"),
                 "--config", "tiny")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 of 2 teacher prompts have no samples in --reference" in done.stderr, done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["prompts_missing_from_reference"] == 1 and report["prompts_missing_from_reference_ids"] == ["lost"]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert markdown.index("**Warning: 1 teacher prompts have no samples in the reference**") < markdown.index("## ")


def test_problems_without_any_reference_are_refused(tmp_path: Path) -> None:
    """Ids match, but a wrong answer field leaves every problem without a reference: nothing could be judged."""
    problems = jsonl(tmp_path / "probs.jsonl", [{"id": f"p{i}", "solution": "4"} for i in range(2)])
    done = klear("judge", "--samples", _samples(tmp_path, ["p0", "p1"]), "--problems", problems,
                 "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "none of the 4 samples" in done.stderr and "has a problem with an answer or tests" in done.stderr
    assert "probs.jsonl#answer=FIELD&tests=FIELD" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out" / "_MANIFEST.json").exists()
    mapped = klear("judge", "--samples", _samples(tmp_path, ["p0", "p1"]), "--problems", f"{problems}#answer=solution",
                   "--output", str(tmp_path / "out"), "--config", "tiny")
    assert mapped.returncode == 0, mapped.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["totals"]["correct"] == 4
