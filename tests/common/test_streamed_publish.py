"""Files streamed to an output ahead of its manifest (storage.StreamedFiles, a merge's parts): listed as staged files
are, each named in a pending record before it goes up, the earlier manifest gone before the first, an earlier
publish's leftovers removed, and nothing uploaded by a writer that lost its lease.

Against a real SeaweedFS S3 server on loopback and on local folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klear.common import storage
from tests.common.test_publish_ownership import WHERE, _assert_consistent, _dest, _staging, take_lease_of


def _pending_files(dest: str) -> set[str]:
    loc = storage.Uri.parse(dest)
    return {name for rel in storage.list_files(loc) if rel.startswith(storage.PENDING_PREFIX)
            for name in json.loads(storage.read_bytes(loc.join(rel)))["files"]}


@pytest.mark.parametrize("where", WHERE)
def test_streamed_files_are_listed_as_staged_ones_and_replace_an_earlier_publish(
        where: str, s3_bucket: str, tmp_path: Path) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    storage.publish_dir(_staging(tmp_path / "v1", "v1", 3), dest, meta={"stage": "sample"})  # 3 parts, replaced by 2
    whole = storage.publish_dir(_staging(tmp_path / "whole", "v2", 2), _dest(where, s3_bucket, tmp_path, "whole"),
                                meta={"stage": "sample"})
    staging = _staging(tmp_path / "v2", "v2", 2)
    with storage.claim_output(dest) as lease:
        streamed = storage.StreamedFiles(lease, "sample")
        first = staging / "prompts" / "part-00000.parquet"
        streamed.upload(first, "prompts/part-00000.parquet")
        assert not first.exists()  # the local copy went once it was up
        names = storage.list_files(dest)
        assert storage.MANIFEST_NAME not in names  # no half-replaced output that readers take as complete
        # Named before it went up, beside v1's files (a crash now leaves files the next publish knows as its own).
        assert {"prompts/part-00000.parquet", "prompts/part-00002.parquet", "report.json"} <= _pending_files(dest)
        streamed.upload(staging / "prompts" / "part-00001.parquet", "prompts/part-00001.parquet")
        with pytest.raises(storage.StorageError, match="already uploaded"):
            streamed.upload(staging / "report.json", "prompts/part-00001.parquet")
        manifest = storage.publish_dir(staging, dest, meta={"stage": "sample"}, streamed=streamed)
    assert manifest.files == whole.files  # the same entries (size, sha256) as a publish of the whole folder
    assert _assert_consistent(dest).files == whole.files  # v1's third part is gone, the pending records too
    assert not any(name.startswith(storage.PENDING_PREFIX) for name in storage.list_files(dest))


def test_a_streaming_writer_that_lost_its_lease_uploads_nothing_more(
        s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = f"{s3_bucket}/out"
    staging = _staging(tmp_path / "v2", "v2", 2)
    with storage.claim_output(dest, ttl_s=1) as first:
        streamed = storage.StreamedFiles(first, "sample")
        streamed.upload(staging / "prompts" / "part-00000.parquet", "prompts/part-00000.parquet")
        take_lease_of(first, dest, monkeypatch)
        with pytest.raises(storage.LeaseLostError, match=rf"{dest}: this run .* lost its lease"):
            streamed.upload(staging / "prompts" / "part-00001.parquet", "prompts/part-00001.parquet")
        with pytest.raises(storage.LeaseLostError):
            storage.publish_dir(staging, dest, meta={"stage": "sample"}, streamed=streamed)
    assert "prompts/part-00001.parquet" not in storage.list_files(dest)
    assert (staging / "prompts" / "part-00001.parquet").exists()
