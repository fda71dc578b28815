"""`report_modes`: the judge stage shows math accuracy under strict and official side by side; the published
verdicts are verifier.math_mode's."""

from __future__ import annotations

from pathlib import Path

from klear.common import storage
from klear.common.config import load_config
from klear.judge.config import JudgeConfig
from klear.judge.stage import run
from tests.judge.samples import boxed, math_record, publish_samples, read_parquet_folder, sample_row


def test_report_shows_both_modes_side_by_side(tmp_path: Path) -> None:
    record = math_record("m1", "12")
    rows = [sample_row("m1", 0, boxed("12"), record),
            sample_row("m1", 1, "<think>\nSo it is \\boxed{12}, now let me verify", record, finish_reason="length"),
            sample_row("m1", 2, "<think>\nadd\n</think>\n\nThe answer is 12.", record),
            sample_row("m1", 3, boxed("13"), record)]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    config = load_config(JudgeConfig, "tiny", ["report_modes=[strict,official]", "workers=1"])
    report = run(samples, str(tmp_path / "judged"), config)
    assert report["math_mode"] == "strict"
    modes = report["math_modes"]
    assert list(modes) == ["strict", "official"]
    assert (modes["strict"]["correct"], modes["official"]["correct"]) == (1, 3)
    assert modes["strict"]["verdicts"] == {"correct": 1, "truncated": 1, "no_box": 1, "wrong": 1}
    verdicts = [r["verdict"] for r in sorted(read_parquet_folder(str(tmp_path / "judged"), "judged"),
                                             key=lambda r: r["sample"])]
    assert verdicts == ["correct", "truncated", "no_box", "wrong"]  # the published rows: strict's
    with storage.fetch_published(str(tmp_path / "judged")) as (local, _):
        md = (local / "report.md").read_text()
    assert "Math judged in mode **strict**" in md
    assert "| official | 4 | 3 | 75.0% |" in md and "| strict (verdicts above) | 4 | 1 | 25.0% |" in md
    assert "</think>" not in md  # the rule text is escaped like data


def test_official_mode_alone(tmp_path: Path) -> None:
    record = math_record("m1", "12")
    rows = [sample_row("m1", 0, "<think>\nSo \\boxed{12}, verify", record, finish_reason="length")]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    config = load_config(JudgeConfig, "tiny", ["verifier.math_mode=official", "workers=1"])
    report = run(samples, str(tmp_path / "judged"), config)
    assert report["math_mode"] == "official" and list(report["math_modes"]) == ["official"]
    assert report["per_kind"]["math"]["correct"] == 1 and report["totals"]["truncated"] == 0
