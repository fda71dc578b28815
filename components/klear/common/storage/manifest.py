"""What a published output holds: its manifest (`_MANIFEST.json`: every file with its size and sha256, and the
stage's metadata), the files' checksums, and a digest naming any content without downloading it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klear.common.storage.files import exists, is_dir, list_files, read_bytes
from klear.common.storage.s3 import s3_client, s3_errors
from klear.common.storage.uri import CHUNK, MANIFEST_NAME, StorageError, UnpublishedOutputError, Uri, is_bookkeeping


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """What a published output holds: relative path -> {"size", "sha256"}, plus free-form metadata."""

    files: dict[str, dict[str, Any]]
    meta: dict[str, Any]
    created: str
    run_id: str = ""  # the run that published it

    def to_json(self) -> bytes:
        body = {"format": 1, "created": self.created, "run_id": self.run_id, "meta": self.meta, "files": self.files}
        return json.dumps(body, indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, origin: str) -> Manifest:
        try:
            body = json.loads(data)
            return cls(files=dict(body["files"]), meta=dict(body.get("meta", {})), created=str(body["created"]),
                       run_id=str(body.get("run_id", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{origin}: corrupt manifest ({exc})") from None


def file_entry(path: Path) -> dict[str, Any]:
    """A manifest's entry of one file: {"size", "sha256"}."""
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def file_entries(root: Path) -> dict[str, dict[str, Any]]:
    """Relative path -> {"size", "sha256"} of every file under `root` (manifests, leases and pending records aside),
    sorted, as a manifest lists them."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and not is_bookkeeping(p.name))
    return {p.relative_to(root).as_posix(): file_entry(p) for p in files}


def read_manifest(uri: str | Uri) -> Manifest:
    """The manifest of a published output; UnpublishedOutputError if there is none."""
    loc = Uri.parse(uri)
    try:
        data = read_bytes(loc.join(MANIFEST_NAME))
    except FileNotFoundError:
        raise UnpublishedOutputError(
            f"{loc} has no {MANIFEST_NAME}: the output was never completed (or is not a stage output); refusing to read it"
        ) from None
    return Manifest.from_json(data, str(loc.join(MANIFEST_NAME)))


def check_file(path: Path, entry: dict[str, Any], origin: Uri) -> None:
    if not path.is_file():
        raise StorageError(f"{origin}: listed in the manifest but missing")
    if path.stat().st_size != entry["size"]:
        raise StorageError(f"{origin}: size {path.stat().st_size} differs from the manifest's {entry['size']}")
    if sha256_file(path) != entry["sha256"]:
        raise StorageError(f"{origin}: sha256 differs from the manifest (corrupt or overwritten)")


def content_digest(uri: str | Uri) -> str:
    """A sha256 naming the content at `uri`, without downloading it: a published output's manifest checksums,
    an S3 object's ETag and size, a local file's own sha256; a folder, the digests of its files. Resumable
    stages record it, so a restart can tell its inputs are the ones it started from."""
    loc = Uri.parse(uri)
    if exists(loc.join(MANIFEST_NAME)):
        files = read_manifest(loc).files
        return _digest(sorted((name, entry["sha256"]) for name, entry in files.items()))
    if is_dir(loc):
        return _digest([(name, content_digest(loc.join(name))) for name in list_files(loc)])
    if loc.is_s3:
        with s3_errors(loc, "checking"):
            head = s3_client().head_object(Bucket=loc.bucket, Key=loc.path)
        return _digest([head["ETag"], head["ContentLength"]])
    if not Path(loc.path).is_file():
        raise FileNotFoundError(f"input not found: {loc}")
    return sha256_file(loc.path)


def _digest(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
