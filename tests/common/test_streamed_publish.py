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


@pytest.mark.parametrize("where", WHERE)
def test_an_attempt_that_will_not_publish_withdraws_what_it_streamed(
        where: str, s3_bucket: str, tmp_path: Path) -> None:
    """v1 (3 parts) is published; an attempt streams 2 parts over it, then fails: its parts go, what v1 left stays
    named for the next publish, which replaces it. On a fresh output, a failed attempt leaves nothing at all."""
    dest = _dest(where, s3_bucket, tmp_path)
    storage.publish_dir(_staging(tmp_path / "v1", "v1", 3), dest, meta={"stage": "sample"})
    staging = _staging(tmp_path / "v2", "v2", 2)
    with storage.claim_output(dest) as lease:
        streamed = storage.StreamedFiles(lease, "sample")
        with pytest.raises(RuntimeError, match="refused"), streamed.withdrawn_on_error():
            for part in ("prompts/part-00000.parquet", "prompts/part-00001.parquet"):
                streamed.upload(staging / part, part)
            raise RuntimeError("refused after two parts went up")
        names = storage.list_files(dest)
        assert storage.MANIFEST_NAME not in names  # v1's went with the first part: its parts were replaced
        assert "prompts/part-00000.parquet" not in names and "prompts/part-00001.parquet" not in names
        assert {"prompts/part-00002.parquet", "report.json"} <= _pending_files(dest)  # v1's rest, still named
    storage.publish_dir(_staging(tmp_path / "v3", "v3", 1), dest, meta={"stage": "sample"})
    assert sorted(_assert_consistent(dest).files) == ["prompts/part-00000.parquet", "report.json"]

    fresh = _dest(where, s3_bucket, tmp_path, "fresh")
    with storage.claim_output(fresh) as lease:
        streamed = storage.StreamedFiles(lease, "sample")
        streamed.upload(_staging(tmp_path / "v4", "v4", 1) / "prompts" / "part-00000.parquet",
                        "prompts/part-00000.parquet")
        streamed.withdraw()
        assert [name for name in storage.list_files(fresh) if name != storage.LEASE_NAME] == []
    assert storage.list_files(fresh) == []


@pytest.mark.parametrize("where", WHERE)
def test_a_published_attempt_is_never_withdrawn(where: str, s3_bucket: str, tmp_path: Path) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    staging = _staging(tmp_path / "v1", "v1", 2)
    with storage.claim_output(dest) as lease:
        streamed = storage.StreamedFiles(lease, "sample")
        with pytest.raises(RuntimeError, match="after"), streamed.withdrawn_on_error():
            streamed.upload(staging / "prompts" / "part-00000.parquet", "prompts/part-00000.parquet")
            storage.publish_dir(staging, dest, meta={"stage": "sample"}, streamed=streamed)
            raise RuntimeError("a failure after the manifest")
    assert len(_assert_consistent(dest).files) == 3


@pytest.mark.parametrize("where", WHERE)
def test_files_held_after_streaming_began_and_streamed_ones_share_one_record(
        where: str, s3_bucket: str, tmp_path: Path) -> None:
    """A resumed judge holds its score folder only when it first saves a score, which may be after its first part
    went up: the record names both, whichever came first, so a crash leaves nothing the next run takes as foreign."""
    dest = _dest(where, s3_bucket, tmp_path)
    staging = _staging(tmp_path / "v1", "v1", 2)
    with storage.claim_output(dest) as lease:
        streamed = storage.StreamedFiles(lease, "judge")
        streamed.upload(staging / "prompts" / "part-00000.parquet", "prompts/part-00000.parquet")
        lease.hold("judge", "_scores/")
        storage.write_bytes(storage.Uri.parse(dest).join("_scores", "chunk-0.parquet"), b"scores")
        streamed.upload(staging / "prompts" / "part-00001.parquet", "prompts/part-00001.parquet")
        records = [json.loads(storage.read_bytes(storage.Uri.parse(dest).join(name)))
                   for name in storage.list_files(dest) if name.startswith(storage.PENDING_PREFIX)]
        assert len(records) == 1 and records[0]["prefixes"] == ["_scores/"]
        assert records[0]["files"] == ["prompts/part-00000.parquet", "prompts/part-00001.parquet"]
    # The crashed run's files are the stage's own: a new run of it may write there; another stage may not.
    storage.check_output(dest, stage="judge")
    with pytest.raises(storage.InvalidOutputError, match="unfinished 'judge' output"):
        storage.check_output(dest, stage="sample")


@pytest.mark.parametrize("where", WHERE)
def test_a_published_output_is_read_one_file_at_a_time(where: str, s3_bucket: str, tmp_path: Path) -> None:
    dest = _dest(where, s3_bucket, tmp_path)
    staging = _staging(tmp_path / "v1", "v1", 3)
    manifest = storage.publish_dir(staging, dest, meta={"stage": "sample"})
    parts = [f"prompts/part-{i:05d}.parquet" for i in range(3)]
    seen = []
    for rel, path in storage.iter_published(dest, manifest, parts):
        assert path.read_bytes() == (staging / rel).read_bytes()
        if where == "s3":  # downloaded: alone in its folder, gone once the next is asked for
            folder = path.parents[1]
            assert [p.name for p in folder.rglob("*") if p.is_file()] == [path.name]
            seen.append(path)
    assert [rel for rel, _ in storage.iter_published(dest, manifest, parts)] == parts
    assert not any(path.exists() for path in seen)
    with pytest.raises(storage.StorageError, match="report.md not listed"):
        list(storage.iter_published(dest, manifest, ["report.md"]))
    storage.write_bytes(storage.Uri.parse(dest).join(parts[1]), b"overwritten")
    with pytest.raises(storage.StorageError, match=rf"{parts[1]}: size 11 differs from the manifest's"):
        list(storage.iter_published(dest, manifest, parts))
