"""Judging over many pods: `klear judge --slice I/N` into a shared work area, then `--merge` publishes the rows
and report an unsliced run gives; a missing slice or score is named and refused; one pod per slice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from klear.common import storage
from klear.common.config import load_config
from klear.common.slices import slice_of
from klear.judge.config import JudgeConfig
from klear.judge.stage import MergeIncompleteError, complete_count, run
from tests.judge.samples import CORRECT, HALF, WRONG, boxed, code_record, math_record, publish_samples, sample_row

CONFIG = load_config(JudgeConfig, "tiny", ["verifier.timeout_s=3.0", "chunk_size=5"])
IDS = [f"m{i}" for i in range(9)]


def _rows() -> list[dict]:
    rows = [sample_row(pid, k, boxed(str(i + k % 2)), math_record(pid, str(i)))
            for i, pid in enumerate(IDS) for k in range(3)]
    rows.append(sample_row("m0", 3, boxed("0"), math_record("m0", "0"), finish_reason="length"))
    record = code_record("c1", n_tests=3)
    rows += [sample_row("c1", k, text, record) for k, text in enumerate([CORRECT, HALF, WRONG])]
    rows.append(sample_row("ghost", 0, boxed("1"), math_record("ghost", "1")))
    return rows


def _published(uri: str) -> dict[str, bytes]:
    """The published rows and pass rates, file by file, as bytes."""
    with storage.fetch_published(uri) as (local, manifest):
        return {rel: (local / rel).read_bytes() for rel in sorted(manifest.files) if rel.endswith(".parquet")}


def _figures(report: dict) -> dict:
    return {key: report[key] for key in ("totals", "per_kind", "verdicts", "unknown_problem_ids", "sample_settings")}


def test_slices_then_merge_publish_what_an_unsliced_judge_does(tmp_path: Path) -> None:
    samples = publish_samples(_rows(), str(tmp_path / "samples"))
    problems = tmp_path / "problems.jsonl"
    lines = [{"id": pid, "answer": str(i)} for i, pid in enumerate(IDS)] + [{"id": "c1", "tests": code_record("c1", 3)["tests"]}]
    problems.write_text("".join(json.dumps(line) + "\n" for line in lines))
    whole = run(samples, str(tmp_path / "whole"), CONFIG, problems=str(problems))
    assert len({slice_of(pid, 3) for pid in [*IDS, "c1", "ghost"]}) == 3  # every slice has samples
    out = str(tmp_path / "sliced")
    parts = [run(samples, out, CONFIG, problems=str(problems), slice_spec=f"{i}/3") for i in (2, 0, 1)]
    assert not storage.exists(f"{out}/_MANIFEST.json")  # slices publish nothing
    assert sum(p["samples"] for p in parts) == whole["totals"]["samples"] == 32
    merged = run(samples, out, CONFIG, problems=str(problems), merge=True)
    assert _published(out) == _published(str(tmp_path / "whole"))  # byte for byte, in the samples' order
    assert _figures(merged) == _figures(whole) and whole["totals"]["unknown_problem"] == 1
    assert sorted(merged["slices"]) == ["0/3", "1/3", "2/3"]
    assert not (tmp_path / "sliced.work").exists()  # the slices' scores and parts go once published
    # A retried merge after publishing: the output is already this run's.
    assert run(samples, out, CONFIG, problems=str(problems), merge=True)["totals"] == merged["totals"]


def test_a_merge_refuses_a_missing_slice_or_score_naming_it(s3_bucket: str) -> None:
    samples = publish_samples(_rows()[:27], f"{s3_bucket}/samples")
    out, work = f"{s3_bucket}/judged", f"{s3_bucket}/judged.work"
    with pytest.raises(MergeIncompleteError, match="no slice has judged"):
        run(samples, out, CONFIG, merge=True)
    for i in (0, 2):
        run(samples, out, CONFIG, slice_spec=f"{i}/3")
    with pytest.raises(MergeIncompleteError, match=r"1 of 3 slices have left no part \(1/3\)"):
        run(samples, out, CONFIG, merge=True)
    run(samples, out, CONFIG, slice_spec="1/3")
    # Parts of other settings do not count: the merge asks for the slices of these.
    with pytest.raises(MergeIncompleteError, match="no slice has judged"):
        run(samples, out, load_config(JudgeConfig, "tiny", ["verifier.timeout_s=4.0"]), merge=True)
    # A part whose scores are gone: the samples no slice judged are named with their slice.
    lost = next(rel for rel in storage.list_files(f"{work}/_scores") if rel.endswith(".parquet"))
    lost_rows = pq.read_table(pa.BufferReader(storage.read_bytes(f"{work}/_scores/{lost}"))).num_rows
    storage.delete(f"{work}/_scores/{lost}")
    with pytest.raises(MergeIncompleteError, match=r"samples were judged by no slice .*#\d \(slice \d/3\)"):
        run(samples, out, CONFIG, merge=True)
    assert not storage.exists(f"{out}/_MANIFEST.json")
    for i in range(3):  # rerun: each slice judges only what it lost
        run(samples, out, CONFIG, slice_spec=f"{i}/3")
    report = run(samples, out, CONFIG, merge=True)
    assert report["totals"]["samples"] == 27 and report["totals"]["reused"] == 27 - lost_rows
    assert storage.list_files(work) == []


def test_complete_count_picks_a_finished_set_of_parts() -> None:
    assert complete_count({2: {0: {}, 1: {}}, 3: {0: {}}}) == 2
    with pytest.raises(MergeIncompleteError, match=r"2 of 4 slices .*\(1/4, 3/4\)"):
        complete_count({4: {0: {}, 2: {}}, 3: {0: {}}})


def test_a_second_process_on_the_same_slice_is_refused(tmp_path: Path) -> None:
    rows = [sample_row(pid, 0, boxed("HANG" if slice_of(pid, 2) == 0 else "1"), math_record(pid, "1"))
            for pid in IDS]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    out = tmp_path / "judged"
    cmd = [sys.executable, "-m", "klear.cli", "judge", "--samples", samples, "--output", str(out), "--config", "tiny",
           "--set", "scorer=tests.judge.scorers:hostile", "--set", "math_budget_s=120", "--slice", "0/2"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=Path(__file__).parents[2])
    lease = tmp_path / "judged.work" / "slices" / "0-of-2" / "_LEASE.json"
    try:
        deadline = time.monotonic() + 60
        while not (lease.exists() and lease.stat().st_size) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None and lease.exists(), first.stderr.read().decode() if first.stderr else ""
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
        assert second.returncode != 0 and "slice 0/2" in second.stderr and "another pod" in second.stderr
        # Another slice runs beside it.
        assert run(samples, str(out), CONFIG, slice_spec="1/2")["samples"] == sum(slice_of(p, 2) == 1 for p in IDS)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()


def test_a_merge_after_slices_of_other_samples_names_the_mismatch(tmp_path: Path) -> None:
    from tests.commands import klear

    first = publish_samples(_rows()[:12], str(tmp_path / "first"))
    second = publish_samples(_rows()[12:24], str(tmp_path / "second"))
    out = str(tmp_path / "judged")
    for i in range(2):
        done = klear("judge", "--samples", first, "--output", out, "--slice", f"{i}/2", "--config", "tiny")
        assert done.returncode == 0, done.stderr
    merged = klear("judge", "--samples", second, "--output", out, "--merge", "--config", "tiny")
    assert merged.returncode == 2
    assert "the work area holds parts that do not match this merge (0/2 judged other samples or problems" in \
        merged.stderr
    assert "must be given the same --samples, --problems and settings" in merged.stderr
