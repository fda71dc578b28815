"""One storage layer for plain paths, `file://` URIs and `s3://` URIs, with atomic publish and one writer per output.

Callers use the package (`from klear.common import storage`; `storage.publish_dir(...)`); its modules, each importing
only those listed above it:

- uri: the errors, `Uri`, the file names of an output's bookkeeping (manifest, lease, pending records);
- s3: the S3 client, transfer settings, botocore's errors turned into ones naming the URI and endpoint;
- files: exists, read, write, delete, upload, download, list and localize, for paths and S3 alike;
- manifest: `Manifest` (every file of a published output, with its size and sha256), checksums, `content_digest`;
- pending: pending records, naming what a writer puts into an output before its manifest;
- leases: `claim_output`, the lease that makes one run the only writer of an output;
- checks: `check_writes` / `check_output`, refusing a location that would replace someone's files before any work;
- publish: `publish_dir` (data files first, the manifest last), `StreamedFiles`, `withdraw`, and reading what was
  published (`fetch_published`, `iter_published`).
"""

from __future__ import annotations

from klear.common.storage.checks import Write, check_output, check_writes
from klear.common.storage.files import (
    delete,
    delete_files,
    download_file,
    exists,
    is_dir,
    list_files,
    localize,
    read_bytes,
    some_names,
    upload_file,
    write_bytes,
)
from klear.common.storage.leases import RUN_ID_ENV, OutputLease, claim_output
from klear.common.storage.manifest import Manifest, content_digest, file_entries, file_entry, read_manifest, sha256_file
from klear.common.storage.pending import Pending, note_pending
from klear.common.storage.publish import StreamedFiles, fetch_published, iter_published, publish_dir, withdraw
from klear.common.storage.uri import (
    LEASE_NAME,
    MANIFEST_NAME,
    PENDING_PREFIX,
    PROBE_PREFIX,
    InvalidOutputError,
    LeaseLostError,
    OutputBusyError,
    StorageError,
    UnpublishedOutputError,
    Uri,
    is_bookkeeping,
)

__all__ = [
    "LEASE_NAME",
    "MANIFEST_NAME",
    "PENDING_PREFIX",
    "PROBE_PREFIX",
    "RUN_ID_ENV",
    "InvalidOutputError",
    "LeaseLostError",
    "Manifest",
    "OutputBusyError",
    "OutputLease",
    "Pending",
    "StorageError",
    "StreamedFiles",
    "UnpublishedOutputError",
    "Uri",
    "Write",
    "check_output",
    "check_writes",
    "claim_output",
    "content_digest",
    "delete",
    "delete_files",
    "download_file",
    "exists",
    "fetch_published",
    "file_entries",
    "file_entry",
    "is_bookkeeping",
    "is_dir",
    "iter_published",
    "list_files",
    "localize",
    "note_pending",
    "publish_dir",
    "read_bytes",
    "read_manifest",
    "sha256_file",
    "some_names",
    "upload_file",
    "withdraw",
    "write_bytes",
]
