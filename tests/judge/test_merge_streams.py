"""The judge streams its parts to the output: each judged/ part goes up as soon as it is closed and leaves the pod's
disk, the samples are read one published part at a time, the manifest last. Killed half-way, a merge leaves an
output readers refuse, which its rerun replaces, every sample once; a refusal found after parts went up withdraws
them. Runs the real `klear judge` against a real SeaweedFS S3 server on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import storage
from tests.commands import jsonl, klear
from tests.judge.samples import SAMPLE_SCHEMA, boxed, math_record, read_parquet_folder, sample_row
from tests.processes import kill_once_parts_are_up

IDS = [f"m{i:03d}" for i in range(60)]
SAMPLES = 3  # per problem: 180 rows


def _rows(extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Three samples of each problem, two right, one wrong, a few hundred bytes of reasoning each."""
    return [{**sample_row(pid, k, boxed(str(i + (k == 2)), f"Step {k} of problem {pid}. " * 20),
                          math_record(pid, str(i))), **(extra or {})}
            for i, pid in enumerate(IDS) for k in range(SAMPLES)]


def publish_parts(rows: list[dict[str, Any]], uri: str, per_part: int, schemas: list[pa.Schema] | None = None) -> str:
    """Publish rows as a `klear sample` output of several samples/ parts of `per_part` rows (part i with
    `schemas[i]`, given), manifest last."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp, "samples")
        folder.mkdir()
        for i, start in enumerate(range(0, len(rows), per_part)):
            schema = schemas[i] if schemas else SAMPLE_SCHEMA
            pq.write_table(pa.Table.from_pylist(rows[start:start + per_part], schema=schema),
                           folder / f"part-{i:05d}.parquet")
        Path(tmp, "report.json").write_text(json.dumps({"stage": "sample", "rows": len(rows)}))
        storage.publish_dir(tmp, uri, meta={"stage": "sample"})
    return uri


def _judge(samples: str, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "klear.cli", "judge", "--samples", samples, "--output", out, "--config", "tiny",
            "--set", "verifier.timeout_s=3.0", *extra]


def _parts(out: str) -> list[str]:
    return [name for name in storage.list_files(out) if name.startswith("judged/part-")]


def _slices(samples: str, out: str, count: int, *extra: str) -> None:
    for i in range(count):
        done = klear(*_judge(samples, out, "--slice", f"{i}/{count}", *extra)[3:])
        assert done.returncode == 0, done.stderr[-2000:]


def test_a_merge_killed_mid_upload_held_two_parts_and_its_rerun_publishes_the_rows_once(
        s3_bucket: str, tmp_path: Path) -> None:
    """Two slices judge 180 samples (read from 6 published parts); their merge, one row per part (180 parts), is
    killed once some parts are up: it held at most two of its parts and one of its input's on local disk, never all
    of them (staging the output whole held 180); the output has no manifest. The rerun (50 rows per part) publishes
    every sample once, row for row what an unsliced judge of the same samples publishes in one part."""
    samples = publish_parts(_rows(), f"{s3_bucket}/samples", per_part=30)
    whole, out = f"{s3_bucket}/whole", f"{s3_bucket}/judged"
    done = klear(*_judge(samples, whole, "--set", "rows_per_shard=1000")[3:])
    assert done.returncode == 0, done.stderr[-2000:]
    assert _parts(whole) == ["judged/part-00000.parquet"]  # staged whole: one part, shipped at the end
    _slices(samples, out, 2)

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    merge = subprocess.Popen(_judge(samples, out, "--merge", "--set", "rows_per_shard=1"),
                             env={**os.environ, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    kill_once_parts_are_up(merge, out, _parts, 8, time.monotonic() + 120)
    merge.communicate()
    staged = sorted(scratch.glob("klear-judge-*/judged/*.parquet"))
    assert 1 <= len(staged) <= 2, staged  # the part being written and the one going up, not the 180
    fetched = sorted(scratch.glob("klear-*/samples/*.parquet"))
    assert len(fetched) <= 1, fetched  # the input part being read, not the 6
    killed = sorted(scratch.glob("klear-*"))
    names = storage.list_files(out)
    assert storage.MANIFEST_NAME not in names
    records = [json.loads(storage.read_bytes(f"{out}/{name}")) for name in names
               if name.startswith(storage.PENDING_PREFIX)]
    assert set(_parts(out)) <= {f for record in records if record["stage"] == "judge" for f in record["files"]}

    rerun = subprocess.run(_judge(samples, out, "--merge", "--set", "rows_per_shard=50"),
                           env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    manifest = storage.read_manifest(out)
    assert _parts(out) == [f"judged/part-{i:05d}.parquet" for i in range(4)]  # the killed run's 8+ parts went
    assert sorted(storage.list_files(out)) == sorted([*manifest.files, storage.MANIFEST_NAME])
    assert manifest.meta["samples"] == len(IDS) * SAMPLES
    assert read_parquet_folder(out, "judged") == read_parquet_folder(whole, "judged")  # row for row, in order
    assert read_parquet_folder(out, "pass_rates") == read_parquet_folder(whole, "pass_rates")
    assert sorted(scratch.glob("klear-*")) == killed  # the rerun's staging and downloads went with it


def test_a_refusal_after_parts_went_up_publishes_nothing_and_leaves_no_part(s3_bucket: str, tmp_path: Path) -> None:
    """The slices judged against problems none of the samples matches: the merge finds it only once every row is
    written, after parts went up (one row per part); it refuses, naming the cause, and withdraws them: the output
    holds nothing, no part, no manifest, no pending record. An unsliced judge whose second input part has columns
    the first lacks refuses likewise, leaving only its resume store."""
    samples = publish_parts(_rows(), f"{s3_bucket}/samples", per_part=30)
    problems = jsonl(tmp_path / "problems.jsonl", [{"id": f"q{i}", "answer": "4"} for i in range(3)])
    out = f"{s3_bucket}/judged"
    _slices(samples, out, 2, "--problems", problems)
    merged = klear(*_judge(samples, out, "--merge", "--problems", problems, "--set", "rows_per_shard=1")[3:])
    assert merged.returncode == 2, merged.stderr[-2000:]
    assert "none of the 180 samples" in merged.stderr and "matches a problem" in merged.stderr, merged.stderr[-2000:]
    withdrew = [line for line in merged.stderr.splitlines() if "withdrew the" in line]
    assert withdrew and int(withdrew[0].split("withdrew the ")[1].split()[0]) >= 100, merged.stderr[-2000:]
    assert storage.list_files(out) == []
    assert storage.list_files(f"{out}.work")  # the slices' scores stay for a merge with the right problems

    # The second part lacks a column the first has (an output of another version beside it).
    mixed = publish_parts(_rows({"note": "x"}), f"{s3_bucket}/mixed", per_part=90,
                          schemas=[SAMPLE_SCHEMA.append(pa.field("note", pa.string())), SAMPLE_SCHEMA])
    plain = f"{s3_bucket}/plain"
    done = klear(*_judge(mixed, plain, "--set", "rows_per_shard=1")[3:])
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{mixed}/samples/part-00001.parquet: columns differ from the first batch's" in done.stderr, \
        done.stderr[-2000:]
    withdrew = [line for line in done.stderr.splitlines() if "withdrew the" in line]
    assert withdrew and int(withdrew[0].split("withdrew the ")[1].split()[0]) >= 80, done.stderr[-2000:]
    left = storage.list_files(plain)
    assert not [name for name in left if not name.startswith(("_scores/", storage.PENDING_PREFIX))], left
