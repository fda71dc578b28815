"""Output validation before any work (storage.check_output), against a real SeaweedFS server; and reading
an unpublished S3 folder, which must be refused before its objects are downloaded."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest

from klear.common import storage
from klear.common.config import load_config
from klear.common.storage.s3 import s3_client
from klear.curate.config import CurateConfig
from klear.curate.stage import run as curate


def _refused(call: Callable[[], object], error: type[Exception], match: str, within_s: float = 5.0) -> None:
    started = time.monotonic()
    with pytest.raises(error, match=match):
        call()
    assert time.monotonic() - started < within_s, "refused, but not quickly"


def _objects(env: dict[str, str], bucket: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    return [obj["Key"] for obj in client.list_objects_v2(Bucket=bucket).get("Contents", [])]


@pytest.fixture()
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "prompt": f"what is {i} plus {i}"}) + "\n" for i in range(5)))
    return path


# --------------------------------------------------------------------------- check_output


def test_a_writable_s3_output_passes_and_leaves_nothing(s3_bucket: str, s3_env: dict[str, str]) -> None:
    assert storage.check_output(f"{s3_bucket}/run/out/", [f"{s3_bucket}/run/in.jsonl"]) == storage.Uri.parse(
        f"{s3_bucket}/run/out")
    assert _objects(s3_env, s3_bucket.removeprefix("s3://")) == []  # the write probe is gone


def test_missing_bucket_is_refused_quickly(s3_env: dict[str, str]) -> None:
    _refused(lambda: storage.check_output("s3://no-such-bucket-7/out"), storage.StorageError,
             r"checking output s3://no-such-bucket-7/out: bucket 'no-such-bucket-7' does not exist \(endpoint http")
    with pytest.raises(storage.StorageError, match="does not exist"):  # and was not created
        storage.list_files("s3://no-such-bucket-7/out")


def test_wrong_secret_is_refused_quickly(s3_bucket: str, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    _refused(lambda: storage.check_output(f"{s3_bucket}/out"), storage.StorageError,
             rf"checking output {s3_bucket}/out: access denied by http://127\.0\.0\.1:\d+ .*AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env["AWS_SECRET_ACCESS_KEY"])
    assert _objects(s3_env, s3_bucket.removeprefix("s3://")) == []


def test_unreachable_endpoint_is_refused_after_bounded_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("KLEAR_S3_MAX_ATTEMPTS", "2")
    _refused(lambda: storage.check_output("s3://bucket/out"), storage.StorageError,
             rf"checking output s3://bucket/out: cannot reach S3 endpoint http://127.0.0.1:{port} after 2 attempts")


@pytest.mark.parametrize(
    ("output", "match"),
    [
        ("gs://bucket/x", r"output 'gs://bucket/x': unsupported URI scheme"),
        ("s3:///x", r"output 's3:///x': S3 URI without a bucket"),
        ("s3://", r"output 's3://': S3 URI without a bucket"),
        ("s3://bucket", r"output 's3://bucket' is a whole bucket: name a folder in it"),
        ("s3://Bad_Bucket/x", r"'Bad_Bucket' is not a valid S3 bucket name"),
        ("file://otherhost/x", r"file URI with a host 'otherhost'"),
        ("", r"empty output location"),
    ],
)
def test_malformed_outputs_are_refused_without_io(output: str, match: str) -> None:
    _refused(lambda: storage.check_output(output), storage.InvalidOutputError, match, within_s=1.0)


def test_outputs_overlapping_inputs_are_refused(prompts: Path, tmp_path: Path) -> None:
    before = prompts.read_bytes()
    _refused(lambda: storage.check_output(str(prompts), [f"{prompts}#prompt=problem"]), storage.InvalidOutputError,
             rf"output {prompts} is input {prompts}: writing there would replace the input", within_s=1.0)
    _refused(lambda: storage.check_output(f"file://{tmp_path}", [str(prompts)]), storage.InvalidOutputError,
             rf"output {tmp_path} contains input {prompts}", within_s=1.0)
    _refused(lambda: storage.check_output(str(tmp_path / "data" / "out"), [str(tmp_path / "data")]),
             storage.InvalidOutputError, r"out lies inside input", within_s=1.0)
    _refused(lambda: storage.check_output("s3://bucket/data", ["s3://bucket/data/x.jsonl"]), storage.InvalidOutputError,
             r"output s3://bucket/data contains input s3://bucket/data/x.jsonl", within_s=1.0)
    assert prompts.read_bytes() == before


def test_a_local_output_blocked_by_a_file_is_refused(prompts: Path) -> None:
    _refused(lambda: storage.check_output(str(prompts / "out")), storage.InvalidOutputError,
             rf"output {prompts}/out: {prompts} is a file", within_s=1.0)


def test_a_local_output_is_not_created_by_the_check(tmp_path: Path) -> None:
    storage.check_output(str(tmp_path / "a" / "b"), [])
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("where", ["s3", "local"])
def test_a_folder_of_foreign_files_is_refused(where: str, s3_bucket: str, tmp_path: Path) -> None:
    out = storage.Uri.parse(f"{s3_bucket}/out" if where == "s3" else str(tmp_path / "out"))
    storage.write_bytes(out.join("my-notes.txt"), b"not a klear output")
    refusal = r"out already holds 1 files that are not this stage's \(my-notes.txt\): .* choose an empty location"
    _refused(lambda: storage.check_output(str(out)), storage.InvalidOutputError, refusal)
    # Neither a checkpoint of the stage nor a lease anywhere makes someone else's file the stage's own.
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "state.bin").write_bytes(b"weights")
    storage.publish_dir(checkpoint, out.join("checkpoints", "step-1"), meta={"stage": "sft"})
    storage.write_bytes(out.join(storage.LEASE_NAME), b"{}")
    storage.write_bytes(out.join("x.work", "slices", "0-of-2", storage.LEASE_NAME), b"{}")
    _refused(lambda: storage.check_output(str(out), stage="sft"), storage.InvalidOutputError, refusal)
    assert "my-notes.txt" in storage.list_files(out)
    storage.delete(out.join("my-notes.txt"))
    storage.check_output(str(out), stage="sft")  # a checkpoint of its own, a lease: nothing foreign


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_crashed_publish_is_the_stages_own_and_no_one_elses(where: str, s3_bucket: str, tmp_path: Path) -> None:
    out = storage.Uri.parse(f"{s3_bucket}/out" if where == "s3" else str(tmp_path / "out"))
    # What publish_dir leaves when it dies half-way: its pending record first, then some of its files.
    storage.note_pending(out, "dead-run", "curate", files=["prompts/part-00000.parquet"], prefixes=["_scores/"])
    storage.write_bytes(out.join("prompts", "part-00000.parquet"), b"partial")
    storage.write_bytes(out.join("_scores", "k", "chunk-1.parquet"), b"progress")
    storage.check_output(str(out), stage="curate")
    _refused(lambda: storage.check_output(str(out), stage="judge"), storage.InvalidOutputError,
             r"holds an unfinished 'curate' output \(_PENDING-dead-run.json\) and this is 'judge'")
    storage.write_bytes(out.join("notes.txt"), b"mine")  # beside the crashed files: someone else's
    _refused(lambda: storage.check_output(str(out), stage="curate"), storage.InvalidOutputError,
             r"already holds 1 files that are not this stage's \(notes.txt\)")
    staging = tmp_path / "staging"
    (staging / "prompts").mkdir(parents=True)
    (staging / "prompts" / "part-00000.parquet").write_bytes(b"complete")
    storage.publish_dir(staging, out, meta={"stage": "curate"})
    # The crash's files go, the stranger's stays, no pending record is left.
    assert sorted(storage.list_files(out)) == [storage.MANIFEST_NAME, "notes.txt", "prompts/part-00000.parquet"]


# --------------------------------------------------------------------------- wired into klear curate


def _tiny() -> CurateConfig:
    return load_config(CurateConfig, "tiny", [])


def test_curate_refuses_its_own_input_as_output_before_reading(prompts: Path) -> None:
    before = prompts.read_bytes()
    _refused(lambda: curate([str(prompts)], str(prompts), _tiny()), storage.InvalidOutputError,
             rf"output {prompts} is input {prompts}", within_s=2.0)
    assert prompts.read_bytes() == before and not (prompts.parent / storage.MANIFEST_NAME).exists()


def test_curate_refuses_an_s3_output_with_wrong_credentials_before_the_work(
    prompts: Path, s3_bucket: str, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    _refused(lambda: curate([str(prompts)], f"{s3_bucket}/out", _tiny()), storage.StorageError,
             rf"checking output {s3_bucket}/out: access denied")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env["AWS_SECRET_ACCESS_KEY"])
    assert _objects(s3_env, s3_bucket.removeprefix("s3://")) == []


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("s3://no-such-bucket-9/out", "checking output s3://no-such-bucket-9/out: bucket 'no-such-bucket-9' does not exist"),
        ("gs://bucket/x", "output 'gs://bucket/x': unsupported URI scheme"),
    ],
)
def test_curate_command_names_a_bad_output_first(output: str, message: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    # The input does not exist either: the output is checked first, so the output is what is named.
    done = subprocess.run(
        [sys.executable, "-m", "klear.cli", "curate", "--input", str(tmp_path / "missing.jsonl"), "--output", output,
         "--config", "tiny"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"klear curate: error: {message}" in done.stderr


# --------------------------------------------------------------------------- unpublished S3 folders


@pytest.fixture()
def unpublished_prefix(s3_bucket: str) -> str:
    """A prefix of 60 objects with no manifest: a run that crashed before publishing, say."""
    prefix = f"{s3_bucket}/half-done"
    for i in range(60):
        storage.write_bytes(f"{prefix}/part-{i:05d}.jsonl", b'{"prompt": "x"}\n' * 100)
    return prefix


@pytest.fixture()
def object_gets() -> Iterator[list[str]]:
    """The keys of every GetObject request this process's storage client sends."""
    seen: list[str] = []
    events = s3_client().meta.events

    def count(params: dict, **_: object) -> None:
        seen.append(params.get("Key", ""))

    events.register("before-parameter-build.s3.GetObject", count)
    try:
        yield seen
    finally:
        events.unregister("before-parameter-build.s3.GetObject", count)


def test_fetching_an_unpublished_s3_folder_downloads_nothing(unpublished_prefix: str, object_gets: list[str]) -> None:
    _refused(lambda: storage.fetch_published(unpublished_prefix).__enter__(), storage.UnpublishedOutputError,
             rf"{unpublished_prefix} has no _MANIFEST.json")
    assert object_gets == [f"half-done/{storage.MANIFEST_NAME}"]


def test_reading_an_unpublished_s3_folder_as_a_source_downloads_nothing(
    unpublished_prefix: str, object_gets: list[str]
) -> None:
    from klear.common.records import Source, iter_chunks

    with pytest.raises(storage.UnpublishedOutputError, match=unpublished_prefix):
        list(iter_chunks(Source.parse(unpublished_prefix)))
    assert object_gets == []
