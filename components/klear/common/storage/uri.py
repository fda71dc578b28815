"""Locations, and what every part of the storage layer shares: the errors, `Uri` (a plain path, `file://` or
`s3://`), the file names of an output's bookkeeping (manifest, lease, pending records) and the time they record."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

MANIFEST_NAME = "_MANIFEST.json"
LEASE_NAME = "_LEASE.json"
PENDING_PREFIX = "_PENDING-"  # `_PENDING-<run id>.json`: what one writer is putting in an output before its manifest
PROBE_PREFIX = "_PROBE-"  # check_output's write probe, deleted at once
CHUNK = 8 * 1024 * 1024  # an S3 multipart part, and a block of a checksum read


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI and, for S3, the endpoint."""


class UnpublishedOutputError(StorageError):
    """An output location has no manifest: it was never completed, or is not a stage output."""


class InvalidOutputError(StorageError):
    """An output location that no run may write: malformed, unsupported, or overlapping an input."""


class OutputBusyError(StorageError):
    """Another run holds the output's lease: two runs must never both publish to one output."""


class LeaseLostError(StorageError):
    """This run's lease was taken over (it expired or was broken): the run must not publish."""


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
            parsed = urlparse(text)
            # file://host/x would silently mean /x on this machine.
            if parsed.netloc not in ("", "localhost"):
                raise StorageError(f"file URI with a host {parsed.netloc!r}: {text!r}; write file:///absolute/path")
            text = parsed.path
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


def timestamp() -> str:
    """Now, in UTC to the second: when a lease, pending record or manifest was written."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def is_pending_record(base: str) -> bool:
    """A pending record's file name (`_PENDING-<run id>.json`)."""
    return base.startswith(PENDING_PREFIX) and base.endswith(".json")


def is_bookkeeping(base: str) -> bool:
    """A manifest, lease or pending record (by file name): an output's bookkeeping, never its content."""
    return base in (MANIFEST_NAME, LEASE_NAME) or is_pending_record(base)
