"""One writer per output: concurrent publishers, crashed and dead leases, stale files beside a manifest.

Against a real SeaweedFS S3 server on loopback and on local folders."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from klear.common import storage

WHERE = ["s3", "local"]


def _dest(where: str, s3_bucket: str, tmp_path: Path, name: str = "out") -> str:
    return f"{s3_bucket}/{name}" if where == "s3" else str(tmp_path / name)


def _staging(root: Path, tag: str, shards: int, rows: int = 3) -> Path:
    """A stage's local output: `shards` Parquet shards of `rows` rows each, tagged, plus a report."""
    (root / "prompts").mkdir(parents=True)
    for shard in range(shards):
        table = pa.table({"id": [f"{tag}-{shard}-{i}" for i in range(rows)], "tag": [tag] * rows})
        pq.write_table(table, root / "prompts" / f"part-{shard:05d}.parquet")
    (root / "report.json").write_text(json.dumps({"tag": tag}))
    return root


def _assert_consistent(dest: str) -> storage.Manifest:
    """The output holds exactly what its manifest lists, with matching checksums."""
    manifest = storage.read_manifest(dest)
    on_store = [name for name in storage.list_files(dest) if name != storage.MANIFEST_NAME]
    assert sorted(on_store) == sorted(manifest.files)
    with storage.fetch_published(dest):  # verifies every size and sha256
        pass
    return manifest


def _s3_client(env: dict[str, str]):  # noqa: ANN202 - a boto3 client
    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")


# --------------------------------------------------------------------------- two writers, one output


@pytest.mark.parametrize("where", WHERE)
def test_two_concurrent_publishers_exactly_one_wins(
    where: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    stagings = [_staging(tmp_path / f"staging-{i}", f"run{i}", shards=3 + i) for i in (0, 1)]
    other_done = threading.Event()
    real_upload = storage.upload_file

    def held_upload(local: str | Path, uri: str | storage.Uri) -> None:
        # Whoever got to uploading waits until the other publisher has tried: the two surely overlap.
        other_done.wait(timeout=5)
        real_upload(local, uri)

    monkeypatch.setattr(storage.publish, "upload_file", held_upload)  # where publish_dir looks it up
    barrier = threading.Barrier(2)
    results: dict[int, object] = {}

    def publish(i: int) -> None:
        barrier.wait()
        try:
            results[i] = storage.publish_dir(stagings[i], dest, meta={"run": i})
        except storage.StorageError as exc:
            results[i] = exc
            other_done.set()

    threads = [threading.Thread(target=publish, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    winners = [i for i, result in results.items() if isinstance(result, storage.Manifest)]
    assert len(winners) == 1, f"expected exactly one successful publisher, got {results}"
    loser = results[1 - winners[0]]
    assert isinstance(loser, storage.OutputBusyError)
    assert str(storage.Uri.parse(dest)) in str(loser) and "being written by another run" in str(loser)
    manifest = _assert_consistent(dest)
    assert manifest.meta["run"] == winners[0]
    with storage.fetch_published(dest) as (local, _):
        tags = set(pq.read_table(local / "prompts").column("tag").to_pylist())
    assert tags == {f"run{winners[0]}"}
    assert not storage.exists(storage.Uri.parse(dest).join(storage.LEASE_NAME))


@pytest.mark.parametrize("where", WHERE)
def test_claim_blocks_a_second_writer_for_the_whole_run(where: str, s3_bucket: str, tmp_path: Path) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    other = _staging(tmp_path / "other", "other", 1)
    with storage.claim_output(dest) as lease:
        with storage.claim_output(dest + "/") as again:  # re-entrant in the claiming context
            assert again is lease
        failures: list[Exception] = []
        thread = threading.Thread(target=lambda: _publish_expecting_failure(other, dest, failures))
        thread.start()
        thread.join(timeout=60)
        assert len(failures) == 1 and isinstance(failures[0], storage.OutputBusyError), failures
        assert f"run {lease.run_id} (host {socket.gethostname()}, pid {os.getpid()}" in str(failures[0])
        storage.publish_dir(_staging(tmp_path / "mine", "mine", 2), dest)  # publishes under the claim
        assert storage.read_manifest(dest).run_id == lease.run_id
    _assert_consistent(dest)
    storage.publish_dir(_staging(tmp_path / "later", "later", 1), dest)  # released: a later run may write


def _publish_expecting_failure(staging: Path, dest: str, failures: list[Exception]) -> None:
    try:
        storage.publish_dir(staging, dest)
    except storage.StorageError as exc:
        failures.append(exc)


def test_a_dead_runs_s3_lease_expires_or_is_broken(
    s3_bucket: str, s3_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = f"{s3_bucket}/out"
    loc = storage.Uri.parse(dest)
    staging = _staging(tmp_path / "s", "x", 1)

    def plant(ttl_s: float) -> None:  # the lease of a run on another machine that died without releasing it
        body = {"run_id": "dead-run", "host": "elsewhere", "pid": 1, "ttl_s": ttl_s, "released": False, "time": "?"}
        _s3_client(s3_env).put_object(Bucket=loc.bucket, Key=f"{loc.path}/{storage.LEASE_NAME}", Body=json.dumps(body))

    plant(ttl_s=2)
    with pytest.raises(storage.OutputBusyError, match=r"s3://.*/out is being written .* run dead-run.*KLEAR_BREAK_LEASE=dead-run"):
        storage.publish_dir(staging, dest)
    time.sleep(3.5)  # the server's Date header has one-second resolution
    storage.publish_dir(staging, dest)
    _assert_consistent(dest)

    plant(ttl_s=3600)
    with pytest.raises(storage.OutputBusyError):
        storage.publish_dir(staging, dest)
    monkeypatch.setenv("KLEAR_BREAK_LEASE", "dead-run")
    storage.publish_dir(staging, dest)
    _assert_consistent(dest)


_HOLD = """
import sys, time
from klear.common import storage
with storage.claim_output(sys.argv[1]):
    print("claimed", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("where", WHERE)
def test_a_killed_writer_does_not_lock_the_output_forever(where: str, s3_bucket: str, tmp_path: Path) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    env = {**os.environ, "KLEAR_LEASE_TTL_S": "2"}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, dest], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        with pytest.raises(storage.OutputBusyError, match=rf"pid {holder.pid}"):
            storage.publish_dir(_staging(tmp_path / "a", "a", 1), dest)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # Local: the kernel dropped the lock with the process. S3 (same host): the holder's pid is gone.
    storage.publish_dir(_staging(tmp_path / "b", "b", 1), dest)
    _assert_consistent(dest)


def test_a_writer_that_lost_its_lease_does_not_publish(
    s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = f"{s3_bucket}/out"
    storage.publish_dir(_staging(tmp_path / "v1", "v1", 1), dest)
    with storage.claim_output(dest, ttl_s=1) as first:
        take_lease_of(first, dest, monkeypatch)
        with pytest.raises(storage.LeaseLostError, match=rf"{dest}: this run .* lost its lease"):
            storage.publish_dir(_staging(tmp_path / "v2", "v2", 2), dest)
    # v1's manifest (one shard) still stands: the loser (two shards) changed nothing.
    assert sorted(storage.read_manifest(dest).files) == ["prompts/part-00000.parquet", "report.json"]
    _assert_consistent(dest)


def _claim_briefly(dest: str, taken: list[str]) -> None:
    with storage.claim_output(dest) as lease:
        taken.append(lease.run_id)


def take_lease_of(lease: storage.OutputLease, dest: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator declares `lease`'s run dead (KLEAR_BREAK_LEASE) and another run takes `dest` over, briefly."""
    monkeypatch.setenv("KLEAR_BREAK_LEASE", lease.run_id)
    taken: list[str] = []
    thread = threading.Thread(target=lambda: _claim_briefly(dest, taken))
    thread.start()
    thread.join(timeout=30)
    assert len(taken) == 1


@pytest.mark.parametrize("where", WHERE)
def test_a_failed_publish_is_cleaned_up_by_the_next(
    where: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    real_upload = storage.upload_file
    calls: list[object] = []

    def failing_upload(local: str | Path, uri: str | storage.Uri) -> None:
        calls.append(uri)
        if len(calls) == 3:
            raise storage.StorageError("connection lost")
        real_upload(local, uri)

    monkeypatch.setattr(storage.publish, "upload_file", failing_upload)
    with pytest.raises(storage.StorageError, match="connection lost"):
        storage.publish_dir(_staging(tmp_path / "big", "big", 5), dest)
    monkeypatch.setattr(storage.publish, "upload_file", real_upload)
    with pytest.raises(storage.UnpublishedOutputError):
        storage.read_manifest(dest)
    # The failed run left a released lease: its partial files are klear's own, so the next run cleans them up.
    storage.publish_dir(_staging(tmp_path / "small", "small", 1), dest)
    assert sorted(_assert_consistent(dest).files) == ["prompts/part-00000.parquet", "report.json"]


# --------------------------------------------------------------------------- stale files outside the manifest


@pytest.mark.parametrize("where", WHERE)
def test_republishing_removes_files_the_new_manifest_does_not_list(where: str, s3_bucket: str, tmp_path: Path) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    v1 = _staging(tmp_path / "v1", "v1", shards=5, rows=30)
    (v1 / "removed").mkdir()
    (v1 / "removed" / "part-00000.parquet").write_bytes(b"v1 only")
    storage.publish_dir(v1, dest)
    storage.publish_dir(_staging(tmp_path / "v2", "v2", shards=1, rows=2), dest)
    assert sorted(_assert_consistent(dest).files) == ["prompts/part-00000.parquet", "report.json"]
    assert not storage.is_dir(storage.Uri.parse(dest).join("removed"))  # emptied folders go too
    with storage.fetch_published(dest) as (local, _):
        assert pq.read_table(local / "prompts").num_rows == 2
    if where == "local":  # even a reader that ignores the manifest sees only the new version
        assert pq.read_table(Path(dest) / "prompts").num_rows == 2


@pytest.mark.parametrize("where", WHERE)
def test_nested_outputs_survive_republishing(where: str, s3_bucket: str, tmp_path: Path) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    checkpoint = storage.Uri.parse(dest).join("checkpoints", "step-000000001")
    storage.publish_dir(_staging(tmp_path / "ckpt", "ckpt", 2), checkpoint)
    # An upload cut off by a crash, no manifest (named in its pending record, as publish_dir writes it first): the
    # step may be published again, and the partial file goes.
    cut_off = storage.Uri.parse(dest).join("checkpoints", "step-000000002")
    storage.note_pending(cut_off, "crashed-run", None, files=["model.safetensors"])
    storage.write_bytes(cut_off.join("model.safetensors"), b"partial upload")
    storage.publish_dir(_staging(tmp_path / "ckpt2", "ckpt2", 1), cut_off)
    assert "model.safetensors" not in _assert_consistent(cut_off).files
    storage.publish_dir(_staging(tmp_path / "final", "final", 1), dest)
    storage.publish_dir(_staging(tmp_path / "final2", "final2", 1), dest)
    _assert_consistent(checkpoint)  # a checkpoint has its own manifest: it is not the parent's stale file
    assert sorted(storage.read_manifest(dest).files) == ["prompts/part-00000.parquet", "report.json"]


def test_a_reader_of_a_dirty_local_output_sees_only_listed_files(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    storage.publish_dir(_staging(tmp_path / "v", "v", shards=1, rows=2), dest)
    # As an older klear left it: another version's shards beside the manifest.
    pq.write_table(pa.table({"id": ["old"] * 150, "tag": ["old"] * 150}), dest / "prompts" / "part-00001.parquet")
    with storage.fetch_published(dest) as (local, manifest):
        assert pq.read_table(local / "prompts").num_rows == 2
        assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) == sorted(manifest.files)


# --------------------------------------------------------------------------- the real command, twice at once


def _curate(source: str, output: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "klear.cli", "curate", "--input", source, "--output", output, "--config", "tiny"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _kept_ids(output: str) -> set[str]:
    with storage.fetch_published(output) as (local, _):
        return set(pq.read_table(local / "prompts").column("id").to_pylist())


def _jsonl(path: Path, prefix: str, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}-{i}", "prompt": f"{prefix} question number {i} about "
                                        f"primes and {i * 7} apples"}) + "\n" for i in range(count)))
    return path


def _feed(fifo: Path, data: bytes, reader: subprocess.Popen) -> None:
    """Write `data` into a FIFO once `reader` has it open (never block on a reader that died)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: no reader yet
            assert reader.poll() is None and time.monotonic() < deadline, "the reader never opened its input"
            time.sleep(0.1)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as feed:
        feed.write(data)


def test_two_curate_processes_on_one_output_one_fails(s3_bucket: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    output = f"{s3_bucket}/curated"
    fifo = tmp_path / "slow.jsonl"
    os.mkfifo(fifo)  # the first run blocks reading it, holding its claim, until this test feeds it
    first = _curate(str(fifo), output)
    try:
        deadline = time.monotonic() + 120
        while not storage.exists(f"{output}/{storage.LEASE_NAME}"):
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline, "the first run never claimed its output"
            time.sleep(0.2)
        second = _curate(str(_jsonl(tmp_path / "b.jsonl", "b", 20)), output)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert f"klear curate: error: {output} is being written by another run" in err
        _feed(fifo, _jsonl(tmp_path / "a.jsonl", "a", 30).read_bytes(), first)
        out, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    _assert_consistent(output)
    assert _kept_ids(output) == {f"a-{i}" for i in range(30)}


def test_two_curate_processes_started_together_never_both_succeed_mixed(
    s3_bucket: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    output = f"{s3_bucket}/curated"
    runs = {name: _curate(str(_jsonl(tmp_path / f"{name}.jsonl", name, 2000)), output) for name in ("a", "b")}
    results = {name: (run.communicate(timeout=300), run.returncode) for name, run in runs.items()}
    succeeded = [name for name, (_, code) in results.items() if code == 0]
    assert succeeded, results
    for (_, err), code in results.values():
        if code != 0:
            assert f"{output} is being written by another run" in err, err
    _assert_consistent(output)
    ids = _kept_ids(output)
    # One run's whole output, never a mix: the later one's if both ran, one after the other.
    assert ids in ({f"a-{i}" for i in range(2000)}, {f"b-{i}" for i in range(2000)})
    if len(succeeded) == 1:
        assert ids == {f"{succeeded[0]}-{i}" for i in range(2000)}


@pytest.mark.parametrize("where", WHERE)
def test_a_withdrawal_cut_short_leaves_files_the_stage_knows(where: str, s3_bucket: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An old checkpoint's deletion killed after its manifest went: the next run of the stage still takes the output
    (its pending record names the files), and the next withdrawal finishes it; a stranger's file stays."""
    dest = _dest(where, s3_bucket, tmp_path)
    checkpoint = storage.Uri.parse(dest).join("checkpoints", "step-000000001")
    storage.publish_dir(_staging(tmp_path / "ckpt", "ckpt", 2), checkpoint, meta={"stage": "sft"})

    def killed(loc: storage.Uri, names: list[str]) -> None:
        raise KeyboardInterrupt("the pod is gone")

    with monkeypatch.context() as patched:
        patched.setattr(storage.publish, "_delete_names", killed)
        with pytest.raises(KeyboardInterrupt):
            storage.withdraw(checkpoint)
    assert not storage.exists(checkpoint.join(storage.MANIFEST_NAME))
    storage.check_output(dest, stage="sft")  # the checkpoint's files are still the stage's own
    storage.write_bytes(checkpoint.join("notes.txt"), b"a stranger's")
    storage.withdraw(checkpoint)
    assert storage.list_files(checkpoint) == ["notes.txt"]  # every file of the checkpoint went, the stranger's stays
