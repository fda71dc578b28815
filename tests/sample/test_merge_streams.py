"""A merge streams its parts to the output: each Parquet part goes up as soon as it is written and leaves the
pod's disk, the manifest last. Killed half-way, it leaves an output readers refuse, which the next merge of the
stage replaces, every unit exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from klear.common import storage
from klear.sample.stage import iter_rows, run
from tests.processes import kill_once_parts_are_up
from tests.sample.conftest import fast_config, write_prompts
from tests.sample.fake_server import FakeServer
from tests.sample.test_slices import N, _check_rows, _command


def _parts(out: str) -> list[str]:
    return [name for name in storage.list_files(out) if name.startswith("samples/part-")]


def _staged_parts(scratch: Path) -> list[Path]:
    """The Parquet parts a merge holds in its staging folder (under its TMPDIR)."""
    return sorted(scratch.glob("klear-sample-*/samples/*.parquet"))


def test_a_merge_killed_after_some_parts_went_up_leaves_no_manifest_and_its_rerun_publishes_once(
        s3_bucket: str, tmp_path: Path) -> None:
    """v1 (30 prompts, 2 parts) is published. The merge of v2 (60 prompts, one row per part: 180 parts) is killed
    once some of its parts are up: it held at most two parts on local disk, never all of them; the output has no
    manifest (readers refuse it), its pending record names what went up. The rerun (50 rows per part) publishes:
    every unit once, and none of the parts the killed merge or v1 left."""
    ids = [f"p{i}" for i in range(60)]
    prompts = tmp_path / "p.jsonl"
    out = f"{s3_bucket}/runs/r1/sample-teacher"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with FakeServer(keep_bodies=False) as server:
        write_prompts(prompts, [{"id": i, "prompt": f"question {i}"} for i in ids[:30]])
        run([str(prompts)], out, fast_config(f"n={N}", "rows_per_part=50"), endpoint=server.url,
            served_model="fake-teacher")
        assert len(_parts(out)) == 2
        write_prompts(prompts, [{"id": i, "prompt": f"question {i}"} for i in ids])
        for k in (0, 1):
            run([str(prompts)], out, fast_config(f"n={N}"), endpoint=server.url, served_model="fake-teacher",
                slice_spec=f"{k}/2")

        merge = subprocess.Popen(_command(str(prompts), out, server.url, "--merge", "--set", "rows_per_part=1"),
                                 env={**os.environ, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        kill_once_parts_are_up(merge, out, _parts, 8, time.monotonic() + 120)
        merge.communicate()
        # Each part left the pod's disk once it was up: the merge held the part being written (and the one going
        # up), not the 180 parts the publish of a whole staging folder holds.
        assert 1 <= len(_staged_parts(scratch)) <= 2, _staged_parts(scratch)
        names = storage.list_files(out)
        assert storage.MANIFEST_NAME not in names
        with pytest.raises(storage.UnpublishedOutputError, match="never completed"):
            list(iter_rows(out))
        killed = sorted(scratch.glob("klear-sample-*"))
        records = [json.loads(storage.read_bytes(storage.Uri.parse(out).join(name)))
                   for name in names if name.startswith(storage.PENDING_PREFIX)]
        named = {file for record in records if record["stage"] == "sample" for file in record["files"]}
        assert set(_parts(out)) <= named  # every part that went up was named before it did

        rerun = subprocess.run(_command(str(prompts), out, server.url, "--merge", "--set", "rows_per_part=50"),
                               env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True, text=True,
                               timeout=120)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
    manifest = storage.read_manifest(out)
    assert _parts(out) == [f"samples/part-{i:05d}.parquet" for i in range(4)]  # 180 rows: the killed run's went
    assert sorted(storage.list_files(out)) == sorted([*manifest.files, storage.MANIFEST_NAME])
    assert manifest.meta["rows"] == len(ids) * N
    _check_rows(list(iter_rows(out)), ids)  # fetch_published checks every part's size and sha256
    assert sorted(scratch.glob("klear-sample-*")) == killed  # the rerun's staging folder went with it


def test_spilled_buckets_leave_the_disk_as_they_are_written_and_each_part_is_shipped_when_closed(
        tmp_path: Path) -> None:
    """Every bucket spills (a memory bound of one byte) and parts are smaller than a bucket: each part reaches
    `ship` as soon as it is closed, in order, and when it does, the spill holds only buckets not yet written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from klear.sample.coordinator import choose, write_in_order
    from klear.sample.store import WorkArea
    from klear.sample.units import Plan
    from tests.sample.test_store import _done, _prompt

    prompts = [_prompt(i) for i in range(30)]
    area = WorkArea(str(tmp_path / "work"))
    order = [(i * 7) % 30 for i in range(30)]  # scattered over the shards: buckets wait, and spill
    for start in range(0, 30, 4):
        area.write_shard([_done(prompts[i], j, f"a{i}") for i in order[start:start + 4] for j in (1, 0)])
    staging = tmp_path / "staging"
    shipped: list[pa.Table] = []
    spill_seen: list[int] = []

    def ship(path: Path) -> None:
        shipped.append(pq.read_table(path))
        path.unlink()
        written = sum(t.num_rows for t in shipped)  # position of a row = its index in the output
        waiting = [int(p.name.split("-")[0]) for p in staging.glob("assemble-*/*.arrow")]
        spill_seen.append(len(waiting))
        assert all(k > (written - 1) // 3 for k in waiting), (written, sorted(waiting))

    result = write_in_order(area, choose(Plan.of(prompts, [2] * 30), area.scan()), staging, 7, bucket_rows=3,
                            memory_bytes=1, ship=ship)
    assert result.rows == 60 and len(shipped) == 9 and any(spill_seen)
    assert [(r["id"], r["sample"]) for r in pa.concat_tables(shipped).to_pylist()] == \
        [(f"p{i}", j) for i in range(30) for j in (0, 1)]
    assert not list(staging.rglob("*.parquet")) and not list(staging.rglob("*.arrow"))
