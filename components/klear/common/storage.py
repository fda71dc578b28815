"""One storage layer for plain paths, `file://` URIs and `s3://` URIs, with atomic publish.

S3 settings come from the standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, AWS_REGION). Transfers go through boto3's transfer manager (multipart,
parallel parts); transient failures are retried a bounded number of times by botocore.

Publishing: a stage writes its data files first and a manifest (`_MANIFEST.json`: every file
with its size and sha256) last. Readers trust only outputs that have a manifest, and only the
files it lists, so a run that crashed half-way never looks complete.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = [
    "MANIFEST_NAME",
    "Manifest",
    "StorageError",
    "UnpublishedOutputError",
    "Uri",
    "download_file",
    "exists",
    "list_files",
    "localize",
    "publish_dir",
    "read_bytes",
    "read_manifest",
    "fetch_published",
    "upload_file",
    "write_bytes",
]

MANIFEST_NAME = "_MANIFEST.json"
_CHUNK = 8 * 1024 * 1024


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI and, for S3, the endpoint."""


class UnpublishedOutputError(StorageError):
    """An output location has no manifest: it was never completed, or is not a stage output."""


@dataclass(frozen=True)
class Uri:
    """A parsed location: `scheme` is "file" or "s3"; `path` is a local path or an S3 key."""

    scheme: str
    bucket: str
    path: str

    @classmethod
    def parse(cls, uri: str | os.PathLike[str] | Uri) -> Uri:
        if isinstance(uri, Uri):
            return uri
        text = os.fspath(uri)
        if text.startswith("s3://"):
            parsed = urlparse(text)
            if not parsed.netloc:
                raise StorageError(f"S3 URI without a bucket: {text!r}")
            return cls("s3", parsed.netloc, parsed.path.lstrip("/"))
        if text.startswith("file://"):
            text = urlparse(text).path
        elif "://" in text:
            raise StorageError(f"unsupported URI scheme in {text!r}: use a path, file:// or s3://")
        return cls("file", "", str(Path(text).absolute()))

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def join(self, *parts: str) -> Uri:
        path = self.path.rstrip("/")
        for part in parts:
            part = part.strip("/")
            path = f"{path}/{part}" if path else part
        return Uri(self.scheme, self.bucket, path)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.path}" if self.is_s3 else self.path


# --------------------------------------------------------------------------- S3 plumbing


def _max_attempts() -> int:
    return int(os.environ.get("KLEAR_S3_MAX_ATTEMPTS", "4"))


@functools.lru_cache(maxsize=None)
def _client_for(endpoint: str | None, key_id: str | None, secret: str | None, region: str | None, attempts: int) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": attempts, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"},
        max_pool_connections=32,
    )
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint, region_name=region or "us-east-1", config=config)


def _client() -> Any:
    # Keyed on the environment, so a test (or a stage) that changes credentials gets a new client.
    return _client_for(
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        os.environ.get("AWS_ACCESS_KEY_ID"),
        os.environ.get("AWS_SECRET_ACCESS_KEY"),
        os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        _max_attempts(),
    )


def _endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS default endpoint"


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=_CHUNK, multipart_chunksize=_CHUNK, max_concurrency=8)


@contextlib.contextmanager
def _s3_errors(uri: Uri, action: str) -> Iterator[None]:
    """Turn botocore's exceptions into errors that name the URI, the endpoint and the cause."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        yield
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("404", "NoSuchKey", "NotFound"):
            raise FileNotFoundError(f"{action} {uri}: no such object (endpoint {_endpoint()})") from None
        if code == "NoSuchBucket":
            raise StorageError(f"{action} {uri}: bucket {uri.bucket!r} does not exist (endpoint {_endpoint()})") from None
        if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            raise StorageError(
                f"{action} {uri}: access denied by {_endpoint()} ({code or status}); check AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY"
            ) from None
        raise StorageError(f"{action} {uri}: S3 error {code or status} from {_endpoint()}: {exc}") from None
    except S3UploadFailedError as exc:
        raise StorageError(f"{action} {uri}: upload to {_endpoint()} failed: {exc}") from None
    except NoCredentialsError:
        raise StorageError(f"{action} {uri}: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)") from None
    except BotoCoreError as exc:
        raise StorageError(
            f"{action} {uri}: cannot reach S3 endpoint {_endpoint()} after {_max_attempts()} attempts: {exc}"
        ) from None


# --------------------------------------------------------------------------- basic operations


def exists(uri: str | Uri) -> bool:
    loc = Uri.parse(uri)
    if not loc.is_s3:
        return Path(loc.path).exists()
    try:
        with _s3_errors(loc, "checking"):
            _client().head_object(Bucket=loc.bucket, Key=loc.path)
        return True
    except FileNotFoundError:
        return False


def read_bytes(uri: str | Uri) -> bytes:
    loc = Uri.parse(uri)
    if not loc.is_s3:
        try:
            return Path(loc.path).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"no such file: {loc}") from None
    with _s3_errors(loc, "reading"):
        return _client().get_object(Bucket=loc.bucket, Key=loc.path)["Body"].read()


def write_bytes(uri: str | Uri, data: bytes) -> None:
    """Write a whole object; local files are replaced atomically (temp file + rename)."""
    loc = Uri.parse(uri)
    if loc.is_s3:
        with _s3_errors(loc, "writing"):
            _client().put_object(Bucket=loc.bucket, Key=loc.path, Body=data)
        return
    target = Path(loc.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def delete(uri: str | Uri) -> None:
    loc = Uri.parse(uri)
    if loc.is_s3:
        with _s3_errors(loc, "deleting"):
            _client().delete_object(Bucket=loc.bucket, Key=loc.path)
    else:
        Path(loc.path).unlink(missing_ok=True)


def upload_file(local: str | Path, uri: str | Uri) -> None:
    loc = Uri.parse(uri)
    if not loc.is_s3:
        target = Path(loc.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(local).resolve() != target.resolve():
            tmp = target.with_name(f".{target.name}.partial")
            shutil.copyfile(local, tmp)
            os.replace(tmp, target)
        return
    with _s3_errors(loc, "uploading to"):
        _client().upload_file(str(local), loc.bucket, loc.path, Config=_transfer_config())


def download_file(uri: str | Uri, local: str | Path) -> None:
    loc = Uri.parse(uri)
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    if not loc.is_s3:
        if not Path(loc.path).is_file():
            raise FileNotFoundError(f"no such file: {loc}")
        shutil.copyfile(loc.path, local)
        return
    with _s3_errors(loc, "downloading"):
        _client().download_file(loc.bucket, loc.path, str(local), Config=_transfer_config())


def list_files(uri: str | Uri) -> list[str]:
    """Relative paths of all files under a directory URI (recursive), sorted."""
    loc = Uri.parse(uri)
    if not loc.is_s3:
        root = Path(loc.path)
        if not root.is_dir():
            return []
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    prefix = loc.path.rstrip("/") + "/" if loc.path else ""
    names: list[str] = []
    with _s3_errors(loc, "listing"):
        paginator = _client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=loc.bucket, Prefix=prefix):
            names.extend(obj["Key"][len(prefix) :] for obj in page.get("Contents", []))
    return sorted(names)


def is_dir(uri: str | Uri) -> bool:
    loc = Uri.parse(uri)
    if not loc.is_s3:
        return Path(loc.path).is_dir()
    prefix = loc.path.rstrip("/") + "/"
    with _s3_errors(loc, "listing"):
        page = _client().list_objects_v2(Bucket=loc.bucket, Prefix=prefix, MaxKeys=1)
    return bool(page.get("KeyCount"))


@contextlib.contextmanager
def localize(uri: str | Uri) -> Iterator[Path]:
    """A local path with the content of `uri` (file or directory); S3 content is downloaded to a temp dir."""
    loc = Uri.parse(uri)
    if not loc.is_s3:
        if not Path(loc.path).exists():
            raise FileNotFoundError(f"no such file or directory: {loc}")
        yield Path(loc.path)
        return
    with tempfile.TemporaryDirectory(prefix="klear-") as tmp:
        if is_dir(loc):
            target = Path(tmp) / loc.name
            for name in list_files(loc):
                download_file(loc.join(name), target / name)
        else:
            target = Path(tmp) / loc.name
            download_file(loc, target)
        yield target


# --------------------------------------------------------------------------- publish / manifest


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """What a published output holds: relative path -> {"size", "sha256"}, plus free-form metadata."""

    files: dict[str, dict[str, Any]]
    meta: dict[str, Any]
    created: str

    def to_json(self) -> bytes:
        body = {"format": 1, "created": self.created, "meta": self.meta, "files": self.files}
        return json.dumps(body, indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, origin: str) -> Manifest:
        try:
            body = json.loads(data)
            return cls(files=dict(body["files"]), meta=dict(body.get("meta", {})), created=str(body["created"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{origin}: corrupt manifest ({exc})") from None


def publish_dir(local_dir: str | Path, dest: str | Uri, meta: dict[str, Any] | None = None) -> Manifest:
    """Publish every file under `local_dir` to `dest`, then the manifest, last.

    An earlier manifest at `dest` is removed first, so an overwrite that fails half-way leaves
    an output that readers refuse rather than a mix of old and new files that looks complete.
    """
    root = Path(local_dir)
    loc = Uri.parse(dest)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)
    delete(loc.join(MANIFEST_NAME))
    entries: dict[str, dict[str, Any]] = {}
    for path in files:
        rel = path.relative_to(root).as_posix()
        entries[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
        upload_file(path, loc.join(rel))
    manifest = Manifest(
        files=entries, meta=dict(meta or {}), created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    )
    write_bytes(loc.join(MANIFEST_NAME), manifest.to_json())
    return manifest


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


@contextlib.contextmanager
def fetch_published(uri: str | Uri) -> Iterator[tuple[Path, Manifest]]:
    """A local directory holding exactly the files a published output's manifest lists, checksums verified."""
    loc = Uri.parse(uri)
    manifest = read_manifest(loc)
    if not loc.is_s3:
        for rel, entry in manifest.files.items():
            _check_file(Path(loc.path) / rel, entry, loc.join(rel))
        yield Path(loc.path), manifest
        return
    with tempfile.TemporaryDirectory(prefix="klear-") as tmp:
        for rel, entry in manifest.files.items():
            target = Path(tmp) / rel
            download_file(loc.join(rel), target)
            _check_file(target, entry, loc.join(rel))
        yield Path(tmp), manifest


def _check_file(path: Path, entry: dict[str, Any], origin: Uri) -> None:
    if not path.is_file():
        raise StorageError(f"{origin}: listed in the manifest but missing")
    if path.stat().st_size != entry["size"]:
        raise StorageError(f"{origin}: size {path.stat().st_size} differs from the manifest's {entry['size']}")
    if sha256_file(path) != entry["sha256"]:
        raise StorageError(f"{origin}: sha256 differs from the manifest (corrupt or overwritten)")
