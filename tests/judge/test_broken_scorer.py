"""A broken scorer is a failed stage, not a published output of all-wrong verdicts: through the real command,
unsliced and sliced; one scorer error among good verdicts is still counted and published."""

from __future__ import annotations

from pathlib import Path

from klear.common import storage
from tests.commands import klear
from tests.judge.samples import boxed, math_record, publish_samples, sample_row

BROKEN = ("--set", "scorer=tests.judge.scorers:broken")


def _samples(tmp_path: Path, answers: list[str]) -> str:
    rows = [sample_row(f"m{i}", 0, boxed(a), math_record(f"m{i}", "7")) for i, a in enumerate(answers)]
    return publish_samples(rows, str(tmp_path / "samples"))


def test_a_scorer_that_fails_on_every_sample_fails_the_stage(tmp_path: Path) -> None:
    samples = _samples(tmp_path, ["7", "8", "7"])
    out = tmp_path / "judged"
    failed = klear("judge", "--samples", samples, "--output", str(out), "--config", "tiny", *BROKEN)
    assert failed.returncode == 2, failed.stderr
    assert "every one of the 3 samples sent to the scorer tests.judge.scorers:broken failed" in failed.stderr
    assert "scorer misconfigured: no such reference column" in failed.stderr
    assert not storage.exists(str(out / storage.MANIFEST_NAME))
    sliced = klear("judge", "--samples", samples, "--output", str(out), "--slice", "0/1", "--config", "tiny", *BROKEN)
    assert sliced.returncode == 2 and "the scorer is broken" in sliced.stderr
    assert not list((tmp_path / "judged.work").rglob("part.json"))  # no part: the merge cannot take it for done


def test_one_scorer_error_among_verdicts_is_counted_and_published(tmp_path: Path) -> None:
    samples = _samples(tmp_path, ["7", "CRASH", "8"])
    out = tmp_path / "judged"
    done = klear("judge", "--samples", samples, "--output", str(out), "--config", "tiny",
                 "--set", "scorer=tests.judge.scorers:hostile")
    assert done.returncode == 0, done.stderr
    assert storage.exists(str(out / storage.MANIFEST_NAME))
