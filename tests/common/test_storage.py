"""Storage against a real SeaweedFS S3 server on loopback, and on local paths."""

import hashlib
import os
import socket
from pathlib import Path

import pytest

from klear.common import storage
from klear.common.storage.s3 import s3_client


def _file(path: Path, size: int) -> str:
    chunk = os.urandom(1 << 20)
    digest = hashlib.sha256()
    with open(path, "wb") as fh:
        written = 0
        while written < size:
            block = chunk[: min(len(chunk), size - written)]
            fh.write(block)
            digest.update(block)
            written += len(block)
    return digest.hexdigest()


def test_uri_parsing() -> None:
    assert storage.Uri.parse("s3://bucket/a/b").join("c", "d.json") == storage.Uri("s3", "bucket", "a/b/c/d.json")
    assert storage.Uri.parse("file:///tmp/x").path == "/tmp/x"
    assert str(storage.Uri.parse("s3://bucket/key")) == "s3://bucket/key"
    with pytest.raises(storage.StorageError, match="unsupported URI scheme"):
        storage.Uri.parse("gs://bucket/key")
    with pytest.raises(storage.StorageError, match="without a bucket"):
        storage.Uri.parse("s3:///key")


def test_multipart_roundtrip_50mb(s3_bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    digest = _file(source, 52 * 1024 * 1024 + 123)
    uri = f"{s3_bucket}/blobs/big.bin"
    storage.upload_file(source, uri)
    loc = storage.Uri.parse(uri)
    head = s3_client().head_object(Bucket=loc.bucket, Key=loc.path)
    assert "-" in head["ETag"], "a 52 MB upload must go through multipart"
    assert head["ContentLength"] == source.stat().st_size
    target = tmp_path / "back.bin"
    storage.download_file(uri, target)
    assert storage.sha256_file(target) == digest


@pytest.mark.parametrize("where", ["s3", "local"])
def test_publish_then_read_verifies_checksums(where: str, s3_bucket: str, tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    (staging / "part").mkdir(parents=True)
    (staging / "part" / "a.txt").write_text("alpha")
    (staging / "b.txt").write_text("beta")
    dest = f"{s3_bucket}/out" if where == "s3" else str(tmp_path / "out")
    manifest = storage.publish_dir(staging, dest, meta={"stage": "test"})
    assert set(manifest.files) == {"part/a.txt", "b.txt"}
    with storage.fetch_published(dest) as (local, read_back):
        assert (local / "part" / "a.txt").read_text() == "alpha"
        assert read_back.meta == {"stage": "test"}  # as given: a lineage is the publisher's to hand over
    # Overwrite a listed file behind the manifest's back: the reader must notice.
    storage.write_bytes(storage.Uri.parse(dest).join("b.txt"), b"tampered")
    with pytest.raises(storage.StorageError, match="differs from the manifest"):
        with storage.fetch_published(dest):
            pass


@pytest.mark.parametrize("where", ["s3", "local"])
def test_reader_refuses_unpublished_output(where: str, s3_bucket: str, tmp_path: Path) -> None:
    dest = storage.Uri.parse(f"{s3_bucket}/half" if where == "s3" else str(tmp_path / "half"))
    storage.write_bytes(dest.join("data.parquet"), b"not finished")
    with pytest.raises(storage.UnpublishedOutputError, match="has no _MANIFEST.json"):
        storage.read_manifest(dest)


def test_failed_publish_leaves_no_manifest(s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    for name in ("1.txt", "2.txt", "3.txt"):
        (staging / name).write_text(name)
    dest = f"{s3_bucket}/crashy"
    storage.publish_dir(staging, dest)  # a complete earlier version
    real_upload = storage.upload_file
    calls = []

    def failing_upload(local, uri):
        calls.append(uri)
        if len(calls) == 2:
            raise storage.StorageError("connection lost")
        real_upload(local, uri)

    monkeypatch.setattr(storage.publish, "upload_file", failing_upload)  # where publish_dir looks it up
    with pytest.raises(storage.StorageError, match="connection lost"):
        storage.publish_dir(staging, dest)
    # The old manifest went first, so the half-overwritten output is refused, not half-trusted.
    with pytest.raises(storage.UnpublishedOutputError):
        storage.read_manifest(dest)


def test_wrong_credentials_are_a_clear_error(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_bytes(f"{s3_bucket}/k", b"x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(storage.StorageError, match=r"access denied by http://127\.0\.0\.1:\d+.*AWS_SECRET_ACCESS_KEY"):
        storage.read_bytes(f"{s3_bucket}/k")


def test_missing_bucket_and_object(s3_env: dict[str, str]) -> None:
    with pytest.raises(storage.StorageError, match="bucket 'no-such-bucket' does not exist"):
        storage.write_bytes("s3://no-such-bucket/k", b"x")


def test_unreachable_endpoint_fails_after_bounded_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("KLEAR_S3_MAX_ATTEMPTS", "2")
    with pytest.raises(storage.StorageError, match=rf"cannot reach S3 endpoint http://127.0.0.1:{port} after 2 attempts"):
        storage.read_bytes("s3://bucket/key")


def test_listing_and_localize(s3_bucket: str) -> None:
    for name in ("d/x.txt", "d/sub/y.txt", "other.txt"):
        storage.write_bytes(f"{s3_bucket}/{name}", name.encode())
    assert storage.list_files(f"{s3_bucket}/d") == ["sub/y.txt", "x.txt"]
    assert storage.is_dir(f"{s3_bucket}/d") and not storage.is_dir(f"{s3_bucket}/other.txt")
    with storage.localize(f"{s3_bucket}/d") as local:
        assert (local / "sub" / "y.txt").read_text() == "d/sub/y.txt"
    assert not storage.exists(f"{s3_bucket}/d/missing")
