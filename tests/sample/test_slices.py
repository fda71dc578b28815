"""Sampling fanned out over slices (`--slice I/N`), then one merge (`--merge`): every unit exactly once, a killed
slice resumed, a reslice that samples nothing again, one pod per slice, and a merge that refuses while units
are missing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest

from klear.common import storage
from klear.common.slices import MergeIncompleteError
from klear.sample.stage import iter_rows, run
from klear.sample.store import WorkArea
from klear.sample.units import parse_slice, slice_of, unit_seed
from tests.sample.conftest import fast_config, write_prompts
from tests.sample.fake_server import FakeServer, expected_parts

PROMPTS, N = 40, 3
UNITS = PROMPTS * N


def _command(prompts: str, out: Path | str, url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "klear.cli", "sample", "--prompts", prompts, "--output", str(out),
            "--endpoint", url, "--served-model", "fake-teacher", "--config", "tiny",
            "--set", f"n={N}", "--set", "concurrency=2", "--set", "shard_size=3", "--set", "flush_seconds=0.2",
            "--set", "progress_seconds=0.5", *extra]


def _check_rows(rows: list[dict], ids: list[str]) -> None:
    keys = [(r["id"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == len(ids) * N  # no duplicates
    assert set(keys) == {(i, j) for i in ids for j in range(N)}  # no gaps
    assert set(Counter(r["id"] for r in rows).values()) == {N}
    for row in rows:
        assert row["seed"] == unit_seed(0, row["id"], row["sample"])
        reasoning, answer = expected_parts(row["prompt"], row["seed"])
        assert row["response"] == f"<think>\n{reasoning}\n</think>\n\n{answer}"


def test_slice_of_is_stable_and_partitions_the_ids() -> None:
    ids = [f"p{i}" for i in range(500)] + ["ünïcode", "", "a/b#c"]
    # Fixed values: the slice of an id must not change between runs, pods or releases.
    assert [slice_of(f"p{i}", 4) for i in range(8)] == [_expected(f"p{i}", 4) for i in range(8)]
    assert slice_of("p0", 1) == 0
    for count in (1, 2, 3, 4, 7, 16):
        slices = [slice_of(i, count) for i in ids]
        assert all(0 <= s < count for s in slices)  # each id in exactly one slice
        assert len(set(slices)) == count  # and every slice gets some (500 ids)
        assert slices == [slice_of(i, count) for i in ids]
    assert parse_slice("2/4") == (2, 4)
    for bad in ("4/4", "-1/4", "1", "a/b", "1/0", ""):
        with pytest.raises(ValueError, match="I/N"):
            parse_slice(bad)


def _expected(prompt_id: str, count: int) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "big") % count


def test_four_slices_one_killed_rerun_merge_then_three_slices_sample_nothing(tmp_path: Path) -> None:
    ids = [f"p{i}" for i in range(PROMPTS)]
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in ids])
    out = tmp_path / "out"
    victim = 2
    victim_units = N * sum(slice_of(i, 4) == victim for i in ids)
    with FakeServer(latency_s=0.05, keep_bodies=False) as server:
        # The victim goes one request at a time (concurrency is no sampling setting): seconds to kill it in.
        processes = {k: subprocess.Popen(_command(prompts, out, server.url, "--slice", f"{k}/4",
                                                  *(["--set", "concurrency=1"] if k == victim else [])),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(4)}
        # SIGKILL the victim once it has some units in shards and some still to go.
        area = WorkArea(str(out) + ".work")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and processes[victim].poll() is None:
            done = {key for key in area.scan().done if slice_of(key[0], 4) == victim} if area.read_settings() else set()
            if len(done) >= 3:
                break
            time.sleep(0.02)
        processes[victim].send_signal(signal.SIGKILL)
        processes[victim].communicate()
        for k, process in processes.items():
            _, stderr = process.communicate(timeout=120)
            assert k == victim or process.returncode == 0, stderr[-2000:]
        assert processes[victim].returncode == -signal.SIGKILL
        assert not (out / "_MANIFEST.json").exists()  # a slice never publishes

        # The merge refuses while the killed slice's units are missing, naming them; nothing published.
        refused = subprocess.run(_command(prompts, out, server.url, "--merge"), capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode != 0, refused.stderr[-2000:]
        assert "neither in a shard" in refused.stderr and "#" in refused.stderr
        assert not (out / "_MANIFEST.json").exists()

        rerun = subprocess.run(_command(prompts, out, server.url, "--slice", f"{victim}/4"), capture_output=True,
                               text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert json.loads(rerun.stdout.splitlines()[-1])["units"]["done_before"] >= 3  # resumed, not redone
        merged = subprocess.run(_command(prompts, out, server.url, "--merge", "--set", "keep_work=true"),
                                capture_output=True, text=True, timeout=120)
        assert merged.returncode == 0, merged.stderr[-2000:]
        requests = server.requests
        assert requests < UNITS + victim_units  # at most the killed slice's in-flight units twice

        # Resliced into three: every unit is found done; nothing is sampled again.
        for k in range(3):
            again = subprocess.run(_command(prompts, out, server.url, "--slice", f"{k}/3"), capture_output=True,
                                   text=True, timeout=120)
            assert again.returncode == 0, again.stderr[-2000:]
            assert json.loads(again.stdout.splitlines()[-1])["units"]["sampled"] == 0
        assert server.requests == requests
    _check_rows(list(iter_rows(str(out))), ids)
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] and report["units"]["total"] == UNITS and report["units"]["rows"] == UNITS
    assert sorted(report["slices"]) == ["0/4", "1/4", "2/4", "3/4"]
    assert sum(s["total"] for s in report["slices"].values()) == UNITS


def test_resliced_run_reuses_the_units_of_another_slice_count(tmp_path: Path) -> None:
    """Two of four slices done, then three slices: only the units the first two did not hold are sampled."""
    ids = [f"p{i}" for i in range(PROMPTS)]
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in ids])
    out = str(tmp_path / "out")
    with FakeServer(keep_bodies=False) as server:
        config = fast_config(f"n={N}")
        for k in (0, 1):
            run([prompts], out, config, endpoint=server.url, served_model="fake-teacher", slice_spec=f"{k}/4")
        first = server.requests
        sampled = sum(run([prompts], out, config, endpoint=server.url, served_model="fake-teacher",
                          slice_spec=f"{k}/3")["units"]["sampled"] for k in range(3))
        assert sampled == server.requests - first == N * sum(slice_of(i, 4) >= 2 for i in ids)
        assert Path(out + ".work", "settings.json").exists()  # slices never delete the work area
        report = run([prompts], out, fast_config(f"n={N}", "keep_work=false"), endpoint=server.url,
                     served_model="fake-teacher", merge=True)
    assert report["units"]["rows"] == UNITS
    _check_rows(list(iter_rows(out)), ids)
    assert not Path(out + ".work").exists()  # the merge removes it all (keep_work=false), the slices' files too


def test_a_slice_without_prompts_runs_in_a_work_area_with_shards(tmp_path: Path) -> None:
    """More slices than a slice has prompts: the empty slices sample nothing and succeed, and the merge publishes."""
    ids = ["a", "b", "c"]
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in ids])
    count = 10
    empty = [k for k in range(count) if all(slice_of(i, count) != k for i in ids)]
    full = sorted({slice_of(i, count) for i in ids})
    out = tmp_path / "out"
    with FakeServer(keep_bodies=False) as server:
        for k in [full[0], empty[0], *full[1:], *empty[1:]]:  # an empty slice after shards are there
            done = subprocess.run(_command(prompts, out, server.url, "--slice", f"{k}/{count}"), capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout.splitlines()[-1])["units"]["sampled"] == N * sum(
                slice_of(i, count) == k for i in ids)
        merged = subprocess.run(_command(prompts, out, server.url, "--merge"), capture_output=True, text=True,
                                timeout=120)
    assert merged.returncode == 0, merged.stderr
    _check_rows(list(iter_rows(str(out))), ids)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_truncated_shard_is_named_set_aside_and_its_units_sampled_again(where: str, s3_bucket: str,
                                                                           tmp_path: Path) -> None:
    ids = [f"p{i}" for i in range(12)]
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in ids])
    out = f"{s3_bucket}/out" if where == "s3" else str(tmp_path / "out")
    area = WorkArea(out + ".work")
    with FakeServer(keep_bodies=False) as server:
        def sample(*step: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(_command(prompts, out, server.url, *step), capture_output=True, text=True,
                                  timeout=120)

        for k in range(2):
            assert sample("--slice", f"{k}/2").returncode == 0
        victim = area.shard_names()[0]
        data = storage.read_bytes(area.uri.join("shards", f"{victim}.parquet"))
        storage.write_bytes(area.uri.join("shards", f"{victim}.parquet"), data[: len(data) // 2])
        merged = sample("--merge")
        assert merged.returncode == 2
        assert f"shards/{victim}.parquet: the shard cannot be read" in merged.stderr
        assert not storage.exists(f"{out}/{storage.MANIFEST_NAME}")
        assert victim not in area.shard_names()
        redone = [json.loads(sample("--slice", f"{k}/2").stdout.splitlines()[-1])["units"]["sampled"] for k in range(2)]
        assert sum(redone) == 3  # shard_size=3: the truncated shard's units, and only those
        assert sample("--merge").returncode == 0
    _check_rows(list(iter_rows(out)), ids)


def test_second_process_on_the_same_slice_refuses_at_once(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q {i}"} for i in range(8)])
    out = tmp_path / "out"
    area = WorkArea(str(out) + ".work")
    with FakeServer(keep_bodies=False) as server, storage.claim_output(area.slice_uri(1, 4)):
        started = time.monotonic()
        busy = subprocess.run(_command(prompts, out, server.url, "--slice", "1/4"), capture_output=True, text=True,
                              timeout=60)
        assert busy.returncode != 0 and "slice 1/4 of" in busy.stderr, busy.stderr[-2000:]
        assert "being sampled by another pod" in busy.stderr and "1-of-4" in busy.stderr
        assert time.monotonic() - started < 30 and server.requests == 0
        # Another slice of the same run is not held up by it.
        other = subprocess.run(_command(prompts, out, server.url, "--slice", "0/4"), capture_output=True, text=True,
                               timeout=60)
        assert other.returncode == 0, other.stderr[-2000:]


def test_slice_and_merge_exclude_each_other_and_merge_needs_slices(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "q"}])
    config = fast_config("n=1")
    with pytest.raises(ValueError, match="exclude each other"):
        run([prompts], str(tmp_path / "out"), config, endpoint="http://127.0.0.1:9/v1", served_model="m",
            slice_spec="0/2", merge=True)
    with pytest.raises(MergeIncompleteError, match="no slice"):
        run([prompts], str(tmp_path / "out"), config, endpoint="http://127.0.0.1:9/v1", served_model="m", merge=True)


def test_merge_refuses_other_sampling_settings(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q {i}"} for i in range(4)])
    out = str(tmp_path / "out")
    with FakeServer(keep_bodies=False) as server:
        run([prompts], out, fast_config("n=1"), endpoint=server.url, served_model="fake-teacher", slice_spec="0/1")
        with pytest.raises(ValueError, match="temperature"):
            run([prompts], out, fast_config("n=1", "temperature=0.1"), endpoint=server.url,
                served_model="fake-teacher", merge=True)
    assert not Path(out, "_MANIFEST.json").exists()


def test_slices_and_merge_on_s3(s3_bucket: str, tmp_path: Path) -> None:
    ids = [f"p{i}" for i in range(12)]
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in ids])
    out = f"{s3_bucket}/runs/r1/sample-teacher"
    area = WorkArea(out + ".work")
    with FakeServer(keep_bodies=False) as server:
        config = fast_config(f"n={N}")
        run([prompts], out, config, endpoint=server.url, served_model="fake-teacher", slice_spec="0/2")
        with pytest.raises(MergeIncompleteError, match=r"neither in a shard"):
            run([prompts], out, config, endpoint=server.url, served_model="fake-teacher", merge=True)
        # Another pod holds slice 1 (a thread here: a claim is re-entrant within one context, not across threads).
        with storage.claim_output(area.slice_uri(1, 2)), ThreadPoolExecutor(1) as pool, \
                pytest.raises(storage.OutputBusyError, match="slice 1/2"):
            pool.submit(run, [prompts], out, config, endpoint=server.url, served_model="fake-teacher",
                        slice_spec="1/2").result()
        run([prompts], out, config, endpoint=server.url, served_model="fake-teacher", slice_spec="1/2")
        report = run([prompts], out, fast_config(f"n={N}", "keep_work=false"), endpoint=server.url,
                     served_model="fake-teacher", merge=True)
        assert server.requests == len(ids) * N
    assert report["units"]["rows"] == len(ids) * N and report["complete"]
    _check_rows(list(iter_rows(out)), ids)
    assert storage.list_files(area.uri) == []


def _sample_files(out: str) -> dict[str, bytes]:
    with storage.fetch_published(out) as (local, manifest):
        return {rel: (local / rel).read_bytes() for rel in manifest.files if rel.startswith("samples/")}


def test_three_slices_then_merge_publish_the_bytes_of_the_unsliced_run(tmp_path: Path) -> None:
    """Rows in prompt order, then sample index, whatever slices and concurrent requests completed them in: the
    merge of three slices and the unsliced run publish the same files, byte for byte (sampling is seeded per
    unit), and a row of every prompt of every slice interleaves in the input's order."""
    ids = [f"p{i}" for i in range(PROMPTS)]
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in ids])
    config = fast_config(f"n={N}", "concurrency=4", "shard_size=2", "rows_per_part=50")
    with FakeServer(latency_s=0.01, keep_bodies=False) as server:
        for k in (2, 0, 1):  # the slice whose shards sort first is not the one of the first prompt
            run([prompts], str(tmp_path / "sliced"), config, endpoint=server.url, served_model="fake-teacher",
                slice_spec=f"{k}/3")
        run([prompts], str(tmp_path / "sliced"), config, endpoint=server.url, served_model="fake-teacher", merge=True)
        run([prompts], str(tmp_path / "whole"), config, endpoint=server.url, served_model="fake-teacher")
    sliced, whole = _sample_files(str(tmp_path / "sliced")), _sample_files(str(tmp_path / "whole"))
    assert len(sliced) == 3 and sliced == whole
    assert pa.default_memory_pool().backend_name == "system"  # freed Arrow buffers go back: see stage.run
    rows = list(iter_rows(str(tmp_path / "sliced")))
    assert [(r["id"], r["sample"]) for r in rows] == [(i, j) for i in ids for j in range(N)]
    _check_rows(rows, ids)


def test_a_writer_index_per_writer_replaces_the_shard_indexes(tmp_path: Path) -> None:
    """Every `compact_every` shards a writer indexes them in one segment and deletes their own indexes, every
    `compact_every` segments it writes one index of all it wrote instead: a restart reads a bounded number of
    objects per writer, plus the few shards a killed writer wrote since."""
    from tests.sample.test_store import _done, _prompt

    work = tmp_path / "work"
    first = WorkArea(str(work), compact_every=2)
    first.writer = "20260101T000000-aaaa"
    for i in range(7):
        first.write_shard([_done(_prompt(i), 0, "a"), _done(_prompt(i), 1, "b")])
    assert sorted(p.name for p in (work / "index").iterdir()) == [
        f"{first.writer}-000006.json", f"{first.writer}.000004.parquet", f"{first.writer}.parquet"]
    first.compact(final=True)
    assert [p.name for p in (work / "index").iterdir()] == [f"{first.writer}.parquet"]
    killed = WorkArea(str(work), compact_every=3)  # killed before its first segment: two shard indexes
    killed.writer = "20260101T000001-bbbb"
    killed.write_shard([_done(_prompt(7), 0, "a")])
    killed.write_shard([_done(_prompt(0), 0, "second copy"), _done(_prompt(8), 0, "a")])
    scan = WorkArea(str(work)).scan()
    assert scan.objects == 3 and len(scan.shards) == 9 and scan.repaired == 0
    assert set(scan.done) == {(f"p{i}", j) for i in range(7) for j in (0, 1)} | {("p7", 0), ("p0", 0), ("p8", 0)}
    assert scan.done[("p0", 0)][1].startswith(first.writer) and scan.duplicates == 1
    # A writer index naming a shard deleted since is no error; what it lists of the others still counts.
    (work / "shards" / f"{first.writer}-000000.parquet").unlink()
    assert ("p0", 1) not in WorkArea(str(work)).scan().done


def test_the_merge_orders_rows_the_same_when_buckets_spill_to_disk(tmp_path: Path) -> None:
    """Shards in any order, from racing writers: the samples written with tiny buckets and a memory bound that
    spills every bucket are those of the in-memory assembly, in position order, the first copy of each unit."""
    import pyarrow.parquet as pq

    from klear.sample.coordinator import choose, write_in_order
    from klear.sample.units import Plan
    from tests.sample.test_store import _done, _prompt

    prompts = [_prompt(i) for i in range(30)]
    a, b = WorkArea(str(tmp_path / "work")), WorkArea(str(tmp_path / "work"))
    a.writer, b.writer = "20260101T000000-aaaa", "20260101T000001-bbbb"
    order = [(i * 7) % 30 for i in range(30)]  # scattered over the shards
    for start in range(0, 30, 4):
        a.write_shard([_done(prompts[i], j, f"a{i}") for i in order[start:start + 4] for j in (1, 0)])
    b.write_shard([_done(prompts[i], 0, f"b{i}") for i in (0, 29, 13)])  # second copies: never kept
    plan = Plan.of(prompts, [2] * 30)
    written = {}
    for name, options in {"memory": {}, "spilled": {"bucket_rows": 3, "memory_bytes": 1}}.items():
        result = write_in_order(a, choose(plan, a.scan()), tmp_path / name, 25, **options)
        assert result.rows == 60 and result.dropped == 3 and result.completion_tokens == 240
        written[name] = pq.read_table(tmp_path / name / "samples").to_pylist()
        assert not [p for p in (tmp_path / name).iterdir() if p.name != "samples"]  # the spill folder is gone
    assert written["memory"] == written["spilled"]
    assert [(r["id"], r["sample"], r["final"]) for r in written["memory"]] == \
        [(f"p{i}", j, f"a{i}") for i in range(30) for j in (0, 1)]


def test_unit_keys_are_held_in_a_few_bytes_each_and_looked_up_in_batches(tmp_path: Path, monkeypatch) -> None:
    """What a paper-scale coordinator and merge hold per unit: a writer's own index and a scan's keys code names
    (shard, id, prompt hash) as dictionaries, a few bytes per unit, not a string per row; an index written by an
    earlier version (plain strings) still reads; looking the keys up in batches chooses what one lookup does."""
    import numpy as np
    import pyarrow.parquet as pq

    from klear.sample import coordinator
    from klear.sample.store import SCHEMA, WRITER_INDEX_SCHEMA
    from klear.sample.units import Plan
    from tests.sample.test_store import _done, _prompt

    prompts = [_prompt(i) for i in range(60)]
    work = tmp_path / "work"
    area = WorkArea(str(work), compact_every=3)
    area.writer = "20260101T000000-aaaa"
    for start in range(0, 60, 4):  # 15 shards of 64 units: segments, then one index of all
        area.write_shard([_done(prompts[i], j, "a") for i in range(start, start + 4) for j in range(16)])
    area.compact(final=True)
    held = sum(table.nbytes for table in area._written)
    assert held / 960 < 24  # a shard name per row alone is 28 bytes here
    other = WorkArea(str(work))
    other.writer = "20260101T000001-bbbb"
    other.write_shard([_done(prompts[0], 0, "second copy"), _done(prompts[59], 16, "beyond n")])
    # An earlier version's writer index: names as plain strings.
    earlier = pa.table({"shard": ["20251231T000000-cccc-000000"] * 2, "row": pa.array([0, 1], pa.int32()),
                        "id": ["p60", "p60"], "sample": pa.array([0, 1], pa.int32()),
                        "prompt_hash": [_prompt(60).hash] * 2}, schema=WRITER_INDEX_SCHEMA)
    pq.write_table(earlier, work / "index" / "20251231T000000-cccc.parquet")
    WorkArea(str(work)).write_table("20251231T000000-cccc-000000",
                                    pa.Table.from_pylist([_row(_done(_prompt(60), j, "old")) for j in (0, 1)],
                                                         schema=SCHEMA))
    (work / "index" / "20251231T000000-cccc-000000.json").unlink()  # covered by the writer index
    scan = WorkArea(str(work)).scan()
    assert scan.keys.num_rows == 964 and scan.keys.nbytes / scan.keys.num_rows < 28
    assert pa.types.is_dictionary(scan.keys.schema.field("id").type)
    assert ("p60", 1) in scan.done and scan.duplicates == 1 and scan.objects == 5  # 3 of a, the earlier, b's shard
    plan = Plan.of([*prompts, _prompt(60)], [16] * 61)
    whole = coordinator.choose(plan, scan)
    monkeypatch.setattr(coordinator, "LOCATE_ROWS", 7)
    batched = coordinator.choose(plan, scan)
    for field in ("positions", "shard", "row"):
        assert np.array_equal(getattr(whole, field), getattr(batched, field))
    assert len(whole.positions) == 962 and (whole.dropped, whole.duplicates) == (2, 1)
    assert whole.shards[int(whole.shard[0])].startswith(area.writer)  # the first copy by shard name


def _row(completion):
    from klear.sample.store import completion_row

    return completion_row(completion)


def test_a_retried_slice_takes_its_own_lease_at_once_and_another_run_waits(s3_bucket: str, tmp_path: Path) -> None:
    """On S3, slice 1/4 of pipeline run A is still held (its pod deleted but in its grace period, or on a node that
    stopped answering: its lease is 120 s from expiring). Another run's pod on that slice is refused at once; the
    retry of run A's own task (same KLEAR_RUN_ID, same slice, a new process) takes the lease over at once and
    samples the slice; the earlier attempt then finds its lease gone. The merge holds every unit exactly once.
    The earlier attempt is frozen (SIGSTOP) while the others run, as a node that stopped answering is: on a loaded
    machine it could otherwise finish its slice before the retry starts."""
    import os
    import signal

    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q {i}"} for i in range(16)])
    out = f"{s3_bucket}/runs/run-a/sample-teacher"
    env = {**os.environ, "KLEAR_LEASE_TTL_S": "120"}
    with FakeServer(latency_s=0.3, keep_bodies=False) as server:
        first = subprocess.Popen(_command(prompts, out, server.url, "--slice", "1/4", "--set", "concurrency=1"),
                                 env={**env, "KLEAR_RUN_ID": "run-a"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        lease = storage.Uri.parse(f"{out}.work/slices/1-of-4/{storage.LEASE_NAME}")
        deadline = time.monotonic() + 60
        while not storage.exists(lease) and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert storage.exists(lease) and first.poll() is None, first.communicate()[1][-2000:]
        os.kill(first.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            other = subprocess.run(_command(prompts, out, server.url, "--slice", "1/4"), capture_output=True, text=True,
                                   env={**env, "KLEAR_RUN_ID": "run-b"}, timeout=60)
            assert other.returncode != 0 and "being sampled by another pod" in other.stderr, other.stderr[-2000:]
            assert "run-b" not in storage.read_bytes(lease).decode()

            retry = subprocess.run(_command(prompts, out, server.url, "--slice", "1/4"), capture_output=True, text=True,
                                   env={**env, "KLEAR_RUN_ID": "run-a"}, timeout=120)
            assert retry.returncode == 0, retry.stderr[-2000:]
            assert "earlier attempt of this task (slice 1/4, sampled) in pipeline run run-a" in retry.stderr
            assert time.monotonic() - started < 60  # not the 120 s the lease had left
        finally:
            os.kill(first.pid, signal.SIGCONT)
        first.communicate(timeout=120)
        for k in (0, 2, 3):
            done = subprocess.run(_command(prompts, out, server.url, "--slice", f"{k}/4"), capture_output=True,
                                  text=True, env={**env, "KLEAR_RUN_ID": "run-a"}, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
        merged = subprocess.run(_command(prompts, out, server.url, "--merge"), capture_output=True, text=True,
                                env={**env, "KLEAR_RUN_ID": "run-a"}, timeout=120)
        assert merged.returncode == 0, merged.stderr[-2000:]
    _check_rows(list(iter_rows(out)), [f"p{i}" for i in range(16)])
