"""The judge stage end to end: published outputs (local and on the real SeaweedFS S3 server), resume after a
SIGKILL, no worker outliving a SIGKILL, bad input that publishes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from klear.common import storage
from klear.common.config import load_config
from klear.judge.config import JudgeConfig
from klear.judge.io import SampleInputError
from klear.judge.stage import run
from tests.judge.samples import (
    CORRECT,
    HALF,
    WRONG,
    boxed,
    code_record,
    math_record,
    publish_samples,
    read_parquet_folder,
    sample_row,
)
from tests.judge.scorers import LOG_ENV
from tests.processes import descendants, kill_tree, left_after_kill

CONFIG = load_config(JudgeConfig, "tiny", ["verifier.timeout_s=3.0"])


def _mixed_rows() -> list[dict]:
    rows = [sample_row("m1", k, boxed(a), math_record("m1", "12")) for k, a in enumerate(["12", "12", "13", "12"])]
    rows += [sample_row("m2", k, boxed("5"), math_record("m2", "6"), finish_reason=f) for k, f in enumerate(["stop", "length"])]
    record = code_record("c1", n_tests=4)
    rows += [sample_row("c1", k, text, record) for k, text in enumerate([CORRECT, HALF, WRONG])]
    return rows


def test_judge_stage_publishes_rows_pass_rates_and_report(tmp_path: Path) -> None:
    samples = publish_samples(_mixed_rows(), str(tmp_path / "samples"))
    report = run(samples, str(tmp_path / "judged"), CONFIG)
    out = str(tmp_path / "judged")
    rows = read_parquet_folder(out, "judged")
    assert len(rows) == 9
    by_key = {(r["id"], r["sample"]): r for r in rows}
    assert by_key[("m1", 2)]["verdict"] == "wrong" and by_key[("m1", 0)]["correct"] is True
    assert by_key[("m2", 1)]["verdict"] == "truncated"
    assert by_key[("c1", 1)]["score"] == 0.5 and (by_key[("c1", 1)]["passed"], by_key[("c1", 1)]["total"]) == (2, 4)
    assert by_key[("c1", 0)]["model"] == "teacher" and by_key[("c1", 0)]["record"]  # sample columns pass through
    rates = {r["id"]: r for r in read_parquet_folder(out, "pass_rates")}
    assert (rates["m1"]["samples"], rates["m1"]["correct"], rates["m1"]["pass_rate"]) == (4, 3, 0.75)
    assert rates["m2"]["pass_rate"] == 0.0 and rates["m2"]["truncated"] == 1
    assert rates["c1"]["pass_rate"] == pytest.approx(1 / 3) and rates["c1"]["mean_score"] == pytest.approx(0.5)
    assert report["totals"]["samples"] == 9 and report["totals"]["truncated"] == 1
    assert report["per_kind"]["math"]["accuracy"] == pytest.approx(3 / 6)
    with storage.fetch_published(out) as (local, manifest):
        assert manifest.meta["stage"] == "judge"
        assert (local / "pass_rate_hist.png").read_bytes()[:4] == b"\x89PNG"
        assert "Verdicts" in (local / "report.md").read_text()
        assert not any(name.startswith("_scores/") for name in manifest.files)
    assert not (tmp_path / "judged" / "_scores").exists()  # the resume store is gone once published


def test_judge_stage_on_s3(s3_bucket: str, tmp_path: Path) -> None:
    samples = publish_samples(_mixed_rows()[:4], f"{s3_bucket}/samples")
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps({"uid": "m1", "problem": "p", "solution": "13"}) + "\n")
    report = run(samples, f"{s3_bucket}/judged", CONFIG, problems=f"{problems}#id=uid&answer=solution")
    assert report["totals"]["correct"] == 1  # gold 13 from the problems file, not the record's 12
    assert [r["correct"] for r in read_parquet_folder(f"{s3_bucket}/judged", "judged")] == [False, False, True, False]
    assert storage.list_files(f"{s3_bucket}/judged/_scores") == []


def test_a_killed_run_resumes_and_judges_only_what_is_missing(tmp_path: Path) -> None:
    # 12 math samples, 4 per chunk; the 10th answer kills the stage process (a crashed pod) in the third chunk.
    answers = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "KILL", "11", "12"]
    rows = [sample_row(f"p{i}", 0, boxed(a), math_record(f"p{i}", a if a != "KILL" else "10")) for i, a in enumerate(answers)]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    out = tmp_path / "judged"
    log = tmp_path / "scored.log"

    def judge() -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "klear.cli", "judge", "--samples", samples, "--output", str(out), "--config", "tiny",
               "--set", "chunk_size=4", "--set", "scorer=tests.judge.scorers:hostile"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, LOG_ENV: str(log)})

    first = judge()
    assert first.returncode == -9, first.stderr[-2000:]
    assert not (out / storage.MANIFEST_NAME).exists()
    saved = sorted(p.name for p in (out / "_scores").rglob("*.parquet"))
    assert len(saved) == 2  # two complete chunks saved before the kill
    log.write_text("")
    # The sample stage re-ran the killer prompt: its response changed, so its fingerprint no longer matches.
    rows[9] = sample_row("p9", 0, boxed("10"), math_record("p9", "10"))
    publish_samples(rows, samples)

    second = judge()
    assert second.returncode == 0, second.stderr[-2000:]
    rescored = sorted(log.read_text().split())
    assert rescored == ["10", "11", "12", "9"]  # only the third chunk was judged again
    report = json.loads((out / "report.json").read_text())
    assert report["totals"]["reused"] == 8 and report["totals"]["samples"] == 12
    assert report["totals"]["correct"] == 12
    assert not (out / "_scores").exists()


def test_a_killed_stage_leaves_no_worker_behind(tmp_path: Path) -> None:
    # Both workers stuck in a sample (one scorer with a child process of its own) when the stage is SIGKILLed,
    # as a pod or a workstation run dies: nothing of the stage may go on running.
    rows = [sample_row(f"p{i}", 0, boxed(a), math_record(f"p{i}", "1")) for i, a in enumerate(["HANG", "SPAWN"])]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    log, errors = tmp_path / "scored.log", tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "klear.cli", "judge", "--samples", samples, "--output", str(tmp_path / "judged"),
           "--config", "tiny", "--set", "math_budget_s=600", "--set", "scorer=tests.judge.scorers:hostile"]
    with open(errors, "wb") as sink:
        stage = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, env={**os.environ, LOG_ENV: str(log)})
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while sorted(log.read_text().split() if log.exists() else []) != ["HANG", "SPAWN"]:
            assert stage.poll() is None and time.monotonic() < deadline, errors.read_text()[-2000:]
            time.sleep(0.1)
        tree = descendants(stage.pid)  # the two workers (and what they started), the scorer's child
        assert len(tree) >= 3, tree
        left = left_after_kill(stage, tree)
        assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    finally:
        kill_tree(stage, tree)


def test_bad_input_is_named_and_nothing_is_published(tmp_path: Path) -> None:
    empty = publish_samples([], str(tmp_path / "empty"))
    with pytest.raises(SampleInputError, match="no sample rows"):
        run(empty, str(tmp_path / "out-empty"), CONFIG)
    assert not (tmp_path / "out-empty" / storage.MANIFEST_NAME).exists()

    no_response = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "sample": 0, "text": "x"}]), no_response)
    with pytest.raises(SampleInputError, match=r"lack \['response'\]"):
        run(str(no_response), str(tmp_path / "out-cols"), CONFIG)
    assert not (tmp_path / "out-cols" / storage.MANIFEST_NAME).exists()

    unpublished = tmp_path / "unpublished"
    (unpublished / "samples").mkdir(parents=True)
    with pytest.raises(storage.UnpublishedOutputError):
        run(str(unpublished), str(tmp_path / "out-unpub"), CONFIG)


def test_sample_ids_missing_from_the_problems_are_counted(tmp_path: Path) -> None:
    rows = [sample_row("known", 0, boxed("1"), {}), sample_row("ghost", 0, boxed("1"), {}),
            sample_row("ghost", 1, boxed("1"), {})]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps({"id": "known", "problem": "p", "answer": "1"}) + "\n")
    report = run(samples, str(tmp_path / "out"), CONFIG, problems=str(problems))
    assert report["totals"]["unknown_problem"] == 2 and report["unknown_problem_ids"] == ["ghost"]
    assert report["totals"]["correct"] == 1
