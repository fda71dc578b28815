"""One storage layer for plain paths, `file://` URIs and `s3://` URIs, with atomic publish.

S3 settings come from the standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, AWS_REGION). Transfers go through boto3's transfer manager (multipart,
parallel parts); transient failures are retried a bounded number of times by botocore.

Publishing: a stage writes its data files first and a manifest (`_MANIFEST.json`: every file
with its size and sha256) last. Readers trust only outputs that have a manifest, and only the
files it lists, so a run that crashed half-way never looks complete. Publishing also removes the
files the new manifest does not list, so an output folder holds exactly what its manifest says.

Ownership: one output has at most one writer. A writer holds the output's lease (`_LEASE.json`)
from before it changes anything until its manifest is written: on S3 a conditional create
(`If-None-Match: *`) renewed by a heartbeat, on local paths an flock the kernel drops when the
process dies. A second writer fails at once with OutputBusyError; see `claim_output`. A lease only
says who writes; it is never a licence to delete anything.

What a writer puts into an output before its manifest (the files of a publish under way, progress a
stage resumes from) it first names in a pending record, `_PENDING-<run id>.json` at the output's root:
its stage and the files (or folders) it writes. After a crash, those named files, and only those, are
known to be klear's own: the next run of the same stage may replace them. Anything else found in an
output without a manifest of the same stage is someone else's, and the output is refused.

Before any work, a stage calls `check_writes` (or `check_output` for one output) with every location it will
write and every input and config file it reads, to fail in seconds on a location that would replace an input,
another stage's output or someone else's files. A published output belongs to the stage named in its manifest (`meta.stage`):
publishing replaces only an output of the same stage.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import email.utils
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = [
    "LEASE_NAME",
    "MANIFEST_NAME",
    "PENDING_PREFIX",
    "InvalidOutputError",
    "LeaseLostError",
    "Manifest",
    "OutputBusyError",
    "OutputLease",
    "StorageError",
    "StreamedFiles",
    "UnpublishedOutputError",
    "Uri",
    "Write",
    "check_output",
    "check_writes",
    "claim_output",
    "download_file",
    "is_bookkeeping",
    "exists",
    "fetch_published",
    "iter_published",
    "list_files",
    "localize",
    "note_pending",
    "publish_dir",
    "read_bytes",
    "read_manifest",
    "upload_file",
    "withdraw",
    "write_bytes",
]

log = logging.getLogger("klear.storage")

MANIFEST_NAME = "_MANIFEST.json"
LEASE_NAME = "_LEASE.json"
PENDING_PREFIX = "_PENDING-"  # `_PENDING-<run id>.json`: what one writer is putting in an output before its manifest
PROBE_PREFIX = "_PROBE-"  # check_output's write probe, deleted at once
# This process's pipeline run, as the pipeline sets it (the pod's `pipeline/runid` label; klear.common.kfp_io reads
# it here): a retried task of the same run takes its earlier attempt's lease at once.
RUN_ID_ENV = "KLEAR_RUN_ID"
_CHUNK = 8 * 1024 * 1024


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


# --------------------------------------------------------------------------- S3 plumbing


def _max_attempts() -> int:
    return int(os.environ.get("KLEAR_S3_MAX_ATTEMPTS", "4"))


@functools.cache
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


def some_names(names: Sequence[str], shown: int = 3) -> str:
    """The first few of `names` for a message: "a, b, c and 7 more"."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def delete_files(uri: str | Uri, owned: Callable[[str], bool]) -> None:
    """Delete the files under `uri` whose relative path `owned` accepts, then, on a local disk, the folders this
    left empty (the folder itself included): another writer's files, and their folders, stay."""
    loc = Uri.parse(uri)
    for rel in list_files(loc):
        if owned(rel):
            delete(loc.join(rel))
    if not loc.is_s3:  # local folders outlive their files
        root = Path(loc.path)
        for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


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


# --------------------------------------------------------------------------- ownership (one writer per output)


def _lease_ttl() -> float:
    return float(os.environ.get("KLEAR_LEASE_TTL_S", "120"))


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _pid_space() -> str:
    """Where a pid names one process: this host and pid namespace (containers may share a hostname, not pids)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "unknown"
    return f"{socket.gethostname()} {namespace}"


def _pipeline_run() -> str:
    """The pipeline run this process works for (KLEAR_RUN_ID: on a cluster the pod's pipeline/runid label), or ""."""
    return os.environ.get(RUN_ID_ENV, "").strip()


def _holder_body(run_id: str, ttl_s: float, released: bool = False, task: str = "") -> bytes:
    holder = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "pid_space": _pid_space(),
              "ttl_s": ttl_s, "released": released, "time": _now(), "pipeline_run": _pipeline_run(), "task": task}
    return json.dumps(holder).encode()


def _parse_holder(data: bytes) -> dict[str, Any]:
    try:
        holder = json.loads(data)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _busy_message(uri: Uri, holder: dict[str, Any], way_out: str) -> str:
    task = (f"pipeline run {holder['pipeline_run']}, " if holder.get("pipeline_run") else "") + (
        f"{holder['task']}, " if holder.get("task") else "")
    who = (f"run {holder.get('run_id', '?')} ({task}host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
           f"lease taken or renewed {holder.get('time', '?')})")
    return (f"{uri} is being written by another {who}: two runs must not publish to one output. "
            f"Wait for it to finish or choose another output; {way_out}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_reason(holder: dict[str, Any], age_s: float, task: str = "") -> str | None:
    """Why an S3 lease may be taken over (None: its holder may still be writing). `task`: what the claimant does
    there (a slice, a stage): a holder of the same pipeline run and task is an earlier attempt of the claimant's own
    task, which KFP retries only once that attempt's pod has failed or been deleted: taken over at once, not after
    its ttl. If that pod still runs (a deleted pod's grace period), its next renewal finds the lease gone and it
    publishes nothing (verify)."""
    run_id = holder.get("run_id")
    if holder.get("released"):
        return "its run failed and released it"
    if task and _pipeline_run() and (holder.get("pipeline_run"), holder.get("task")) == (_pipeline_run(), task):
        return f"it is an earlier attempt of this task ({task}) in pipeline run {_pipeline_run()}, retried"
    ttl = float(holder.get("ttl_s") or _lease_ttl())
    if age_s > ttl:
        return f"not renewed for {age_s:.0f} s (lease {ttl:.0f} s)"
    if run_id and os.environ.get("KLEAR_BREAK_LEASE") == run_id:
        return "KLEAR_BREAK_LEASE names it"
    pid = holder.get("pid")
    if holder.get("pid_space") == _pid_space() and isinstance(pid, int) and pid != os.getpid() and not _pid_alive(pid):
        return f"its process {pid} on this host is gone"
    return None


class OutputLease:
    """One run's exclusive right to publish one output; get it from `claim_output`.

    A stage that writes files into its output before publishing (progress it resumes from) calls `hold` first, so
    that a crashed run's files are known to be klear's own (by name, in a pending record) and the next run of the
    stage may replace them; the lease itself proves nothing about the folder it sits in."""

    def __init__(self, uri: Uri, run_id: str, inherited: bool) -> None:
        self.uri = uri
        self.run_id = run_id
        self.inherited = inherited  # taken over from a run that crashed, failed or was declared dead
        self._named: dict[str | None, Pending] = {}  # what this run's pending record names, by stage

    def hold(self, stage: str | None, prefix: str) -> None:
        """Record, before writing there, that this run of `stage` writes the files under `prefix` (a folder of the
        output, "name/") without a manifest listing them yet; the next publish to the output removes them."""
        self.name(stage, prefixes=[prefix])

    def name(self, stage: str | None, files: Iterable[str] = (), prefixes: Iterable[str] = (),
             dropped: Iterable[str] = ()) -> Pending:
        """Name `files` and folders (`prefixes`, "name/") in this run's pending record (note_pending) before writing
        them, beside everything the run named before: one record per run, whichever part of it writes ahead of the
        manifest (a resume store, streamed parts), so neither drops what the other named. `dropped`: files the run
        deleted again. Written when it changes, deleted when it names nothing; returns what it names."""
        before = self._named.get(stage)
        held = before or Pending(stage)
        now = Pending(stage, (held.files | frozenset(files)) - frozenset(dropped),
                      tuple(sorted({*held.prefixes, *prefixes})))
        if now == before:
            return now
        self._named[stage] = now
        if now.files or now.prefixes:
            note_pending(self.uri, self.run_id, stage, files=now.files, prefixes=now.prefixes)
        else:
            delete(self.uri.join(f"{PENDING_PREFIX}{self.run_id}.json"))
        return now

    def verify(self) -> None:
        """Raise LeaseLostError unless this run still holds the lease (checked right before the manifest)."""
        raise NotImplementedError

    def release(self) -> None:
        """Give the output up, whether the run succeeded or failed: the lease is deleted."""
        raise NotImplementedError


class _LocalLease(OutputLease):
    """An flock on `<output>/_LEASE.json`: exclusive between processes and threads, dropped by the kernel
    when its process dies, so a crash never leaves the output locked."""

    def __init__(self, uri: Uri, run_id: str, fd: int, created_dir: bool, inherited: bool) -> None:
        super().__init__(uri, run_id, inherited)
        self._fd = fd
        self._created_dir = created_dir

    @property
    def path(self) -> Path:
        return Path(self.uri.path) / LEASE_NAME

    def verify(self) -> None:
        if self._fd < 0 or not _same_file(self.path, self._fd):
            raise LeaseLostError(f"{self.uri}: this run's lease {self.path} was removed or replaced; not publishing")

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            if _same_file(self.path, self._fd):
                self.path.unlink()  # while still locked: a waiter that opened the old file sees it is gone
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
        if self._created_dir:
            with contextlib.suppress(OSError):  # not empty: something was published (or is pending) there
                os.rmdir(self.uri.path)


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _rewrite_fd(fd: int, data: bytes) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _acquire_local(uri: Uri, run_id: str) -> _LocalLease:
    folder = Path(uri.path)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InvalidOutputError(f"output {uri}: a file is in the way; an output is a folder") from None
    path = folder / LEASE_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _parse_holder(os.pread(fd, 1 << 16, 0))
            os.close(fd)
            raise OutputBusyError(_busy_message(uri, holder, "if it is stuck, stop it: its lock goes when it exits")) from None
        if _same_file(path, fd):
            break
        os.close(fd)  # its holder removed the file between our open and our lock: lock the new one
    previous = os.pread(fd, 1 << 16, 0)  # left by a run that crashed or failed while publishing
    if previous:
        log.info("%s: taking over from run %s", uri, _parse_holder(previous).get("run_id", "?"))
    _rewrite_fd(fd, _holder_body(run_id, 0))
    return _LocalLease(uri, run_id, fd, created, inherited=bool(previous))


def _precondition_failed(exc: Any) -> bool:
    code = exc.response.get("Error", {}).get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict")


def _conditional(uri: Uri, action: str, call: Callable[[], Any]) -> Any | None:
    """`call()`'s response, or None when S3 refused it because its If-Match / If-None-Match did not hold."""
    from botocore.exceptions import ClientError

    with _s3_errors(uri, action):
        try:
            return call()
        except ClientError as exc:
            if _precondition_failed(exc):
                return None
            raise


def _read_lease_s3(key: Uri) -> tuple[dict[str, Any], str, float] | None:
    """(holder, ETag, seconds since last renewal) of an S3 lease, None if there is none. The age is measured
    on the server's clock (its Date header against LastModified), so clock skew between writers does not matter."""
    try:
        with _s3_errors(key, "reading lease"):
            response = _client().get_object(Bucket=key.bucket, Key=key.path)
    except FileNotFoundError:
        return None
    body = response["Body"].read()
    date = response["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
    server_now = email.utils.parsedate_to_datetime(date) if date else dt.datetime.now(dt.UTC)
    age = (server_now - response["LastModified"]).total_seconds()
    return _parse_holder(body), response["ETag"], age


class _S3Lease(OutputLease):
    """`<output>/_LEASE.json` created with If-None-Match: *, renewed every ttl/4 by a heartbeat thread with
    If-Match on its ETag; a lease not renewed for its ttl may be taken over (a crashed run's lease expires)."""

    def __init__(self, uri: Uri, run_id: str, etag: str, ttl_s: float, inherited: bool, task: str = "") -> None:
        super().__init__(uri, run_id, inherited)
        self.ttl_s = ttl_s
        self.task = task
        self._etag = etag
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease {uri}", daemon=True)
        self._thread.start()

    @property
    def key(self) -> Uri:
        return self.uri.join(LEASE_NAME)

    def _put(self, body: bytes) -> bool:
        """Replace the lease if it is still ours; False if it is not."""
        key = self.key
        try:
            put = _conditional(key, "renewing lease", lambda: _client().put_object(
                Bucket=key.bucket, Key=key.path, Body=body, IfMatch=self._etag))
        except FileNotFoundError:  # deleted by the run that took it over and finished
            return False
        if put is None:
            return False
        self._etag = put["ETag"]
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(max(self.ttl_s / 4, 0.2)):
            with self._lock:
                try:
                    if not self._put(_holder_body(self.run_id, self.ttl_s, task=self.task)):
                        self._lost = "another run took the lease over"
                        return
                except StorageError as exc:
                    # Transient: the next beat may get through; verify() decides before publishing.
                    log.warning("%s: lease renewal failed: %s", self.uri, exc)

    def verify(self) -> None:
        with self._lock:
            current = None if self._lost else _read_lease_s3(self.key)
            if current is None or current[1] != self._etag:
                holder = current[0] if current else {}
                raise LeaseLostError(
                    f"{self.uri}: this run (run {self.run_id}) lost its lease "
                    f"({self._lost or 'now held by run ' + str(holder.get('run_id', 'none'))}); not publishing"
                )

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        key = self.key
        with self._lock:
            if self._lost:
                return
            try:
                try:
                    _conditional(key, "releasing lease", lambda: _client().delete_object(
                        Bucket=key.bucket, Key=key.path, IfMatch=self._etag))
                    return  # deleted, or (precondition failed) no longer ours to delete
                except FileNotFoundError:
                    return
                except StorageError as exc:  # a store without conditional deletes: mark it released instead
                    log.info("%s: conditional delete of the lease refused (%s); marking it released", self.uri, exc)
                self._put(_holder_body(self.run_id, self.ttl_s, released=True, task=self.task))
            except (StorageError, FileNotFoundError) as exc:
                # Do not hide the run's own outcome; an unreleased lease expires after its ttl.
                log.warning("%s: could not release the lease (it expires in %.0f s): %s", self.uri, self.ttl_s, exc)


def _acquire_s3(uri: Uri, run_id: str, ttl_s: float, task: str = "") -> _S3Lease:
    key = uri.join(LEASE_NAME)
    client = _client()
    body = _holder_body(run_id, ttl_s, task=task)
    for _ in range(5):  # each round: the lease changed under us; look again
        put = _conditional(key, "claiming", lambda: client.put_object(
            Bucket=key.bucket, Key=key.path, Body=body, IfNoneMatch="*"))
        if put is not None:
            return _S3Lease(uri, run_id, put["ETag"], ttl_s, inherited=False, task=task)
        current = _read_lease_s3(key)
        if current is None:
            continue
        holder, etag, age = current
        if holder.get("run_id") == run_id:  # our own create, retried by botocore after a lost response
            return _S3Lease(uri, run_id, etag, ttl_s, inherited=False, task=task)
        reason = _stale_reason(holder, age, task)
        if reason is None:
            ttl = float(holder.get("ttl_s") or ttl_s)
            raise OutputBusyError(_busy_message(
                uri, holder, f"if that run is dead, its lease expires {max(ttl - age, 0):.0f} s from now, "
                f"or set KLEAR_BREAK_LEASE={holder.get('run_id', '?')} to take over at once"))
        # Compare-and-swap on the stale lease's ETag: of several runs taking over, exactly one wins.
        put = _conditional(key, "taking over", lambda: client.put_object(
            Bucket=key.bucket, Key=key.path, Body=body, IfMatch=etag))  # noqa: B023 (called at once)
        if put is not None:
            log.warning("%s: took over the lease of run %s: %s", uri, holder.get("run_id", "?"), reason)
            return _S3Lease(uri, run_id, put["ETag"], ttl_s, inherited=True, task=task)
    raise OutputBusyError(f"{uri}: other runs keep changing its lease; two runs must not publish to one output")


_CLAIMS: contextvars.ContextVar[tuple[OutputLease, ...]] = contextvars.ContextVar("klear_claims", default=())


def _same_location(a: Uri, b: Uri) -> bool:
    return (a.scheme, a.bucket, a.path.rstrip("/")) == (b.scheme, b.bucket, b.path.rstrip("/"))


@contextlib.contextmanager
def claim_output(output: str | Uri, ttl_s: float | None = None, task: str = "") -> Iterator[OutputLease]:
    """Hold `output` for this run: every `publish_dir` to it inside the block (same thread) publishes under this
    lease; another run claiming or publishing it meanwhile gets OutputBusyError naming it.

    Wrap a stage's whole run in it, so a second run fails in its first seconds rather than after the work.
    Re-entrant within one context. On S3 the lease expires `ttl_s` (KLEAR_LEASE_TTL_S, default 120) seconds
    after a crash; KLEAR_BREAK_LEASE=<run id> takes over a dead run's lease at once. `task` names what this
    process does there (a slice, a stage): a retry of the same task in the same pipeline run (KLEAR_RUN_ID) takes
    the lease of its earlier attempt at once (_stale_reason)."""
    loc = Uri.parse(output)
    held = next((lease for lease in _CLAIMS.get() if _same_location(lease.uri, loc)), None)
    if held is not None:
        yield held
        return
    run_id = uuid.uuid4().hex
    lease: OutputLease = (_acquire_s3(loc, run_id, ttl_s or _lease_ttl(), task) if loc.is_s3
                          else _acquire_local(loc, run_id))
    token = _CLAIMS.set((*_CLAIMS.get(), lease))
    try:
        yield lease
    finally:
        _CLAIMS.reset(token)
        lease.release()


def _is_pending(base: str) -> bool:
    return base.startswith(PENDING_PREFIX) and base.endswith(".json")


def is_bookkeeping(base: str) -> bool:
    """A manifest, lease or pending record (by file name): an output's bookkeeping, never its content."""
    return base in (MANIFEST_NAME, LEASE_NAME) or _is_pending(base)


def _nested_roots(names: Iterable[str]) -> set[str]:
    """Sub-folders that are outputs of their own (a manifest, lease or pending record inside), e.g.
    `checkpoints/step-N`: a publish of the folder above never removes their files."""
    roots = set()
    for name in names:
        folder, _, base = name.rpartition("/")
        if folder and is_bookkeeping(base):
            roots.add(folder)
    return roots


def _own_files(loc: Uri, names: Sequence[str] | None = None) -> list[str]:
    """Files under `loc` that belong to it: all but those inside nested outputs, which have their own owner."""
    names = list_files(loc) if names is None else names
    nested = _nested_roots(names)
    if not nested:
        return list(names)
    return [name for name in names if not any(name.startswith(root + "/") for root in nested)]


def _reserved(name: str) -> bool:
    # README.md: a model's card, written beside its manifest and outside its content (klear.common.model_card)
    return is_bookkeeping(name) or name == "README.md" or name.startswith(PROBE_PREFIX)


def _unlisted(loc: Uri, listed: Iterable[str]) -> list[str]:
    keep = set(listed)
    return [name for name in _own_files(loc) if name not in keep and not _reserved(name)]


@dataclass(frozen=True)
class Pending:
    """What writers of one stage put in an output before its manifest: exact files and whole folders ("x/")."""

    stage: str | None
    files: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def covers(self, name: str) -> bool:
        return name in self.files or name.startswith(self.prefixes)


def note_pending(uri: str | Uri, run_id: str, stage: str | None, files: Iterable[str] = (),
                 prefixes: Iterable[str] = ()) -> None:
    """Record, before writing them, the files (and folders, "name/") that run `run_id` of `stage` puts into the
    output `uri` ahead of its manifest: after a crash, they are what the next run of the stage may replace."""
    body = {"format": 1, "stage": stage, "run_id": run_id, "time": _now(), "files": sorted(set(files)),
            "prefixes": sorted(set(prefixes))}
    write_bytes(Uri.parse(uri).join(f"{PENDING_PREFIX}{run_id}.json"), json.dumps(body).encode())


def _read_pending(loc: Uri, names: Iterable[str]) -> list[tuple[str, Pending]]:
    """The pending records at `loc`'s root (name, record); one that cannot be read proves nothing and is skipped."""
    records = []
    for name in names:
        if "/" in name or not _is_pending(name):
            continue
        try:
            body = json.loads(read_bytes(loc.join(name)))
            files, prefixes = body.get("files", []), body.get("prefixes", [])
            if not (isinstance(files, list) and isinstance(prefixes, list)):
                raise TypeError("files and prefixes must be lists")
            records.append((name, Pending(body.get("stage"), frozenset(map(str, files)),
                                          tuple(str(p) for p in prefixes if str(p).endswith("/")))))
        except (FileNotFoundError, ValueError, TypeError, AttributeError) as exc:
            log.warning("%s: ignoring unreadable pending record (%s): it proves nothing", loc.join(name), exc)
    return records


def _known_files(loc: Uri, names: Sequence[str], stage: str | None,
                 records: list[tuple[str, Pending]] | None = None) -> Pending:
    """Everything at `loc` that `stage` may replace: what its manifest lists (if the stage published it) and what
    its pending records name (`records`: those already read from `names`)."""
    files: set[str] = set()
    prefixes: list[str] = []
    if MANIFEST_NAME in names:
        try:
            manifest = read_manifest(loc)
        except StorageError:
            manifest = None  # a corrupt manifest lists nothing
        if manifest is not None and manifest.meta.get("stage") == stage:
            files |= set(manifest.files)
    for _, record in _read_pending(loc, names) if records is None else records:
        if record.stage == stage:
            files |= record.files
            prefixes += record.prefixes
    return Pending(stage, frozenset(files), tuple(prefixes))


def _remove_unlisted(loc: Uri, listed: Iterable[str], known: Pending) -> None:
    """Delete what an earlier version (or a crashed run) of this stage left that the new manifest does not list:
    only files its manifest or pending records name; anything else is left alone."""
    unlisted = _unlisted(loc, listed)
    stale = [name for name in unlisted if known.covers(name)]
    strangers = [name for name in unlisted if not known.covers(name)]
    if strangers:
        log.warning("%s: leaving %d files that no manifest or pending record of this stage names (%s)", loc,
                    len(strangers), some_names(strangers))
    _delete_names(loc, stale)


def _drop_pending(loc: Uri) -> None:
    """Delete the pending records at `loc`'s root: its manifest (or its deletion) has served them."""
    _delete_names(loc, [name for name in list_files(loc) if "/" not in name and _is_pending(name)])


def _delete_names(loc: Uri, names: Sequence[str]) -> None:
    if not names:
        return
    log.info("%s: removing %d files of this stage no manifest lists now", loc, len(names))
    if loc.is_s3:
        client = _client()
        for start in range(0, len(names), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": loc.join(name).path} for name in names[start : start + 1000]]
            with _s3_errors(loc, "removing stale files from"):
                response = client.delete_objects(Bucket=loc.bucket, Delete={"Objects": batch, "Quiet": True})
            if response.get("Errors"):
                first = response["Errors"][0]
                raise StorageError(f"removing stale files from {loc}: {first.get('Key')}: {first.get('Message')}")
        return
    root = Path(loc.path)
    for name in names:
        (root / name).unlink(missing_ok=True)
    # Folders the removals emptied go too (only those: a nested output may be creating its own right now).
    for folder in sorted({(root / name).parent for name in names}, key=lambda p: -len(p.parts)):
        while folder != root and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


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


def _begin_publish(loc: Uri, lease: OutputLease, stage: str | None, files: Iterable[str]) -> Pending:
    """Before a publish changes anything in `loc`: its lease still held, no other stage's output there, a pending
    record naming `files` (what this writer uploads) and what an earlier publish or a crashed run of the stage left,
    then the earlier manifest deleted, so an overwrite cut short leaves an output that readers refuse and the next
    run of the stage may replace. Returns what the stage left there (its manifest's files, its pending records)."""
    lease.verify()  # a run whose lease was taken over during its work must not touch the output
    _refuse_other_stage(loc, stage, "output")
    known = _known_files(loc, list_files(loc), stage)
    lease.name(stage, files=[*known.files, *files], prefixes=known.prefixes)
    delete(loc.join(MANIFEST_NAME))
    return known


class StreamedFiles:
    """Files of one publish uploaded as soon as each is complete, their local copies deleted (a merge's Parquet parts):
    the output never sits on local disk whole. `publish_dir(..., streamed=)` lists them in the manifest beside the
    files it uploads itself, with the same entries (size, sha256).

    The first upload begins the publish as publish_dir does (_begin_publish: the earlier manifest goes); from then
    on, until the manifest, the output is one readers refuse and the next run of the stage may replace. Every file
    is named in this writer's pending record before it goes up, and each upload checks the lease first: a writer
    whose lease was taken over stops before it replaces a file of its successor's. The manifest is the commit point:
    an attempt that will not publish (a refusal found after its first upload) withdraws what it uploaded
    (`withdraw`, `withdrawn_on_error`); one killed leaves them to the next run, which replaces them."""

    def __init__(self, lease: OutputLease, stage: str | None) -> None:
        self.lease = lease
        self.stage = stage
        self.entries: dict[str, dict[str, Any]] = {}  # relative path -> its manifest entry, of the files up
        self.published = False  # set by publish_dir once its manifest lists them: never withdrawn then
        self._begun = False  # the first upload began the publish (_begin_publish)
        self._sent: list[str] = []  # every file whose upload began (one cut short may have left an object)

    def upload(self, local: Path, rel: str) -> None:
        """Upload the finished file `local` as `rel` of the output, keep its manifest entry, delete `local`."""
        loc = self.lease.uri
        if rel in self.entries:
            raise StorageError(f"{loc.join(rel)}: already uploaded by this publish; a file goes up once")
        if is_bookkeeping(rel.rpartition("/")[2]):
            raise StorageError(f"{loc.join(rel)}: a manifest, lease or pending record's name, never an output's file")
        if not self._begun:
            _begin_publish(loc, self.lease, self.stage, [rel])
            self._begun = True
        else:
            self.lease.verify()
            self.lease.name(self.stage, files=[rel])
        entry = file_entry(local)
        self._sent.append(rel)
        upload_file(local, loc.join(rel))
        self.entries[rel] = entry
        local.unlink()

    def withdraw(self) -> None:
        """Delete the files this publish uploaded, when it will not publish (a refusal found after its first upload):
        the output keeps no part of an attempt that failed. The earlier output's manifest went with the first upload,
        so what is left is an output readers refuse; this writer's pending record keeps naming what the earlier
        publish or a crashed run left (the next run of the stage replaces it), and goes when it names nothing.
        Nothing is deleted once published, nor by a writer whose lease was taken over: the files are its successor's."""
        if self.published or not self._begun:
            return
        loc = self.lease.uri
        try:
            self.lease.verify()
        except LeaseLostError as exc:
            log.warning("%s: not withdrawing the %d files this run uploaded: %s", loc, len(self._sent), exc)
            return
        sent = sorted(set(self._sent))
        _delete_names(loc, sent)
        log.info("%s: withdrew the %d files this unpublished attempt had uploaded (%s)", loc, len(sent),
                 some_names(sent))
        self.lease.name(self.stage, dropped=sent)
        self.entries.clear()
        self._sent.clear()

    @contextlib.contextmanager
    def withdrawn_on_error(self) -> Iterator[StreamedFiles]:
        """The block's uploads withdrawn (`withdraw`) if it raises before they are published; the error goes on."""
        try:
            yield self
        except BaseException:
            try:
                self.withdraw()
            except (StorageError, FileNotFoundError, OSError) as exc:  # the run's own error matters more
                log.warning("%s: could not withdraw this attempt's files (the next run of the stage replaces "
                            "them; its pending record names them): %s", self.lease.uri, exc)
            raise


def publish_dir(local_dir: str | Path, dest: str | Uri, meta: dict[str, Any] | None = None,
                complete: Callable[[dict[str, dict[str, Any]]], dict[str, dict[str, Any]]] | None = None,
                streamed: StreamedFiles | None = None) -> Manifest:
    """Publish every file under `local_dir` to `dest`, then the manifest, last. Files an earlier publish or a
    crashed run of the same stage left (its manifest or pending records name them) and the new manifest does not
    list are removed; nothing else is (nested outputs, such as checkpoints with their own manifest, stay).
    `complete`, once this writer's files are up, gets their entries and returns what the manifest lists: with
    the files other writers uploaded into `dest` (the other nodes of a multi-node checkpoint); it may wait or raise.
    `streamed`: the files this publish already uploaded (StreamedFiles, under the same lease), listed too.
    `meta` goes into the manifest as given: its `lineage` is the caller's to make (klear.common.lineage.record).

    Runs under the lease of an enclosing `claim_output(dest)`, else claims `dest` for its own duration: a
    concurrent writer fails with OutputBusyError, never publishes beside this one. A pending record naming every
    file it writes goes first, then the earlier manifest is removed, so an overwrite that fails half-way leaves
    an output that readers refuse and the next run of the stage may replace.
    """
    root = Path(local_dir)
    loc = Uri.parse(dest)
    stage = (meta or {}).get("stage")
    local = file_entries(root)
    up = dict(streamed.entries) if streamed is not None else {}
    twice = sorted(set(local) & set(up))
    if twice:
        raise StorageError(f"{loc}: {some_names(twice)} both uploaded already and staged in {root}")
    entries = dict(sorted({**local, **up}.items()))
    with claim_output(loc) as lease:  # re-enters the caller's claim when there is one
        if up and streamed is not None and streamed.lease.run_id != lease.run_id:
            raise LeaseLostError(f"{loc}: its files were uploaded under run {streamed.lease.run_id}'s lease, and "
                                 f"this publish holds run {lease.run_id}'s; not publishing")
        # Of a streamed publish, `known` includes this writer's own pending record: the earlier manifest's files.
        known = _begin_publish(loc, lease, stage, entries)
        for rel in local:
            upload_file(root / rel, loc.join(rel))
        if complete is not None:
            entries = complete(entries)
        # The pending records the other writers (a multi-node checkpoint's nodes) left meanwhile count too.
        later = _known_files(loc, list_files(loc), stage) if complete is not None else Pending(stage)
        _remove_unlisted(loc, entries, Pending(stage, known.files | later.files | set(entries),
                                               known.prefixes + later.prefixes))
        lease.verify()  # a writer that lost its lease must not publish over its successor
        manifest = Manifest(files=entries, meta=dict(meta or {}), created=_now(), run_id=lease.run_id)
        write_bytes(loc.join(MANIFEST_NAME), manifest.to_json())
        if streamed is not None:
            streamed.published = True
        # The manifest names what is there now: the pending records (this writer's, other nodes', a crashed run's)
        # have served.
        _drop_pending(loc)
        lease._named.clear()  # its record is gone: a later write ahead of a manifest names its files anew
    return manifest


def withdraw(uri: str | Uri) -> None:
    """Delete a published output (an old checkpoint): a pending record naming its files first, then its manifest, then
    the files its manifest or pending records name, the records last. A deletion cut short leaves an output that
    readers refuse and whose files its stage still knows as its own; files nothing names stay."""
    loc = Uri.parse(uri)
    names = list_files(loc)
    try:
        stage = read_manifest(loc).meta.get("stage") if MANIFEST_NAME in names else None
    except StorageError:
        stage = None
    records = _read_pending(loc, names)
    if stage is None:  # no manifest (a deletion cut short before): the pending records say whose it is
        stage = next((record.stage for _, record in records), None)
    known = _known_files(loc, names, stage, records)
    run_id = f"withdraw-{uuid.uuid4().hex}"
    note_pending(loc, run_id, stage, files=known.files, prefixes=known.prefixes)
    delete(loc.join(MANIFEST_NAME))
    _delete_names(loc, [name for name in _own_files(loc, names) if known.covers(name) and not _reserved(name)])
    _drop_pending(loc)


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
        with _s3_errors(loc, "checking"):
            head = _client().head_object(Bucket=loc.bucket, Key=loc.path)
        return _digest([head["ETag"], head["ContentLength"]])
    if not Path(loc.path).is_file():
        raise FileNotFoundError(f"input not found: {loc}")
    return sha256_file(loc.path)


def _digest(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


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
    """A local directory holding exactly the files a published output's manifest lists, checksums verified.

    The manifest is read first: an unpublished S3 folder is refused before anything is downloaded."""
    loc = Uri.parse(uri)
    manifest = read_manifest(loc)
    if not loc.is_s3:
        for rel, entry in manifest.files.items():
            _check_file(Path(loc.path) / rel, entry, loc.join(rel))
        extra = _unlisted(loc, manifest.files)
        if not extra:
            yield Path(loc.path), manifest
            return
        # Files beside the manifest (an older version's shards, say) must not leak into a folder read.
        log.warning("%s holds %d files its manifest does not list (%s, ...); reading only the listed ones",
                    loc, len(extra), extra[0])
        with tempfile.TemporaryDirectory(prefix="klear-") as tmp:
            for rel in manifest.files:
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(Path(loc.path) / rel, Path(tmp) / rel)
            yield Path(tmp), manifest
        return
    with tempfile.TemporaryDirectory(prefix="klear-") as tmp:
        for rel, entry in manifest.files.items():
            target = Path(tmp) / rel
            download_file(loc.join(rel), target)
            _check_file(target, entry, loc.join(rel))
        yield Path(tmp), manifest


def iter_published(uri: str | Uri, manifest: Manifest, files: Iterable[str]) -> Iterator[tuple[str, Path]]:
    """(relative path, local path) of each of `files`, listed in `manifest` (the published output at `uri`'s), one at
    a time, checksum verified: from S3 each is downloaded when its turn comes and deleted when the caller asks for
    the next, so local disk holds one file of the output, never all of it (fetch_published's copy). A local output's
    files are read where they are."""
    loc = Uri.parse(uri)
    wanted = list(files)
    unlisted = [rel for rel in wanted if rel not in manifest.files]
    if unlisted:
        raise StorageError(f"{loc}: {some_names(unlisted)} not listed in its {MANIFEST_NAME}")
    if not loc.is_s3:
        for rel in wanted:
            _check_file(Path(loc.path) / rel, manifest.files[rel], loc.join(rel))
            yield rel, Path(loc.path) / rel
        return
    with tempfile.TemporaryDirectory(prefix="klear-part-") as tmp:
        for rel in wanted:
            target = Path(tmp) / rel
            try:
                download_file(loc.join(rel), target)
                _check_file(target, manifest.files[rel], loc.join(rel))
                yield rel, target
            finally:
                target.unlink(missing_ok=True)


def _check_file(path: Path, entry: dict[str, Any], origin: Uri) -> None:
    if not path.is_file():
        raise StorageError(f"{origin}: listed in the manifest but missing")
    if path.stat().st_size != entry["size"]:
        raise StorageError(f"{origin}: size {path.stat().st_size} differs from the manifest's {entry['size']}")
    if sha256_file(path) != entry["sha256"]:
        raise StorageError(f"{origin}: sha256 differs from the manifest (corrupt or overwritten)")


# --------------------------------------------------------------------------- output validation, before any work

_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class Write:
    """One location a run writes. `role` is how the user named it (`--output`, `--work`); `stage` is the stage
    whose published output it becomes (the manifest's `meta.stage`); `published=False` for a work area, whose
    stage checks what may already be there."""

    role: str
    uri: str
    stage: str | None
    published: bool = True


def check_writes(writes: Sequence[Write], inputs: Sequence[str] = (), config_files: Sequence[str] = ()) -> list[Uri]:
    """Fail in seconds, before any work, if a run could not safely write every one of `writes`:

    - an unsupported scheme or malformed URI, a path blocked by a file or not writable, and for S3 an unreachable
      endpoint, a missing bucket or credentials that may not write there (one put and delete of a probe object);
    - a location that is, contains or lies inside one of `inputs` (URIs or source specs; a `#...` fragment is
      ignored) or of `config_files` (those the run's config was read from: `Provenance.files`), or that overlaps
      another of `writes`;
    - an output that holds another stage's published output (its manifest names the stage), a model, or files
      that are no klear output at all: publishing removes what its manifest does not list.

    Returns the parsed locations, in order. Writes nothing that outlives the check."""
    parsed = [_parse_output(w.uri, w.role) for w in writes]
    sources = [Uri.parse(spec.partition("#")[0]) for spec in (*inputs, *config_files)
               if spec.partition("#")[0].strip()]
    for write, out in zip(writes, parsed):
        for source in sources:
            relation = _overlap(out, source)
            if relation:
                raise InvalidOutputError(f"{write.role} {out} {relation} input {source}: writing there would "
                                         "replace the input; choose a location apart from every input")
    for i, (first, a) in enumerate(zip(writes, parsed)):
        for second, b in zip(writes[i + 1 :], parsed[i + 1 :]):
            relation = _overlap(a, b)
            if relation:
                raise InvalidOutputError(f"{first.role} {a} {relation} {second.role} {b}: one would replace the "
                                         "other; give them separate locations")
    for write, out in zip(writes, parsed):
        if out.is_s3:
            _probe_s3(out)
        else:
            _probe_local(out)
        if write.published:
            _refuse_foreign(out, write.stage, write.role)
    return parsed


def check_output(output: str, inputs: Sequence[str] = (), *, stage: str | None = None,
                 role: str = "output", config_files: Sequence[str] = ()) -> Uri:
    """`check_writes` for a run that writes one output: the published output of `stage`."""
    return check_writes([Write(role, output, stage)], inputs, config_files)[0]


def _parse_output(output: str, role: str = "output") -> Uri:
    if not str(output).strip():
        raise InvalidOutputError(f"empty {role} location")
    try:
        out = Uri.parse(output)
    except StorageError as exc:
        raise InvalidOutputError(f"{role} {output!r}: {exc}") from None
    if out.is_s3:
        if not _BUCKET_NAME.match(out.bucket):
            raise InvalidOutputError(f"{role} {output!r}: {out.bucket!r} is not a valid S3 bucket name")
        if not out.path.strip("/"):
            raise InvalidOutputError(
                f"{role} {output!r} is a whole bucket: name a folder in it (s3://{out.bucket}/FOLDER), since "
                "publishing removes every file of the output that its manifest does not list"
            )
        out = Uri("s3", out.bucket, out.path.strip("/"))
    return out


def _overlap(out: Uri, other: Uri) -> str | None:
    """How `out` overlaps `other`: "is", "lies inside", "contains", or None."""
    if (out.scheme, out.bucket) != (other.scheme, other.bucket):
        return None
    if out.is_s3:
        a, b = out.path.strip("/"), other.path.strip("/")
    else:
        a, b = os.path.realpath(out.path), os.path.realpath(other.path)
    if a == b:
        return "is"
    if a.startswith(b.rstrip("/") + "/") or not b:
        return "lies inside"
    if b.startswith(a.rstrip("/") + "/") or not a:
        return "contains"
    return None


def _probe_s3(out: Uri) -> None:
    from botocore.exceptions import ClientError

    client = _client()
    with _s3_errors(out, "checking output"):
        try:
            client.head_bucket(Bucket=out.bucket)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                raise StorageError(
                    f"checking output {out}: bucket {out.bucket!r} does not exist (endpoint {_endpoint()})"
                ) from None
            raise
        # Reading the bucket is not writing it: a read-only key fails here, not after the run's work.
        probe = out.join(f"{PROBE_PREFIX}{uuid.uuid4().hex}")
        client.put_object(Bucket=probe.bucket, Key=probe.path, Body=b"")
        client.delete_object(Bucket=probe.bucket, Key=probe.path)


def _stage_of(manifest_uri: Uri) -> str | None:
    return Manifest.from_json(read_bytes(manifest_uri), str(manifest_uri)).meta.get("stage")


def _refuse_other_stage(out: Uri, stage: str | None, role: str) -> None:
    """A published output is replaced only by a run of the stage that published it."""
    try:
        owner = _stage_of(out.join(MANIFEST_NAME))
    except FileNotFoundError:
        return
    if owner != stage:
        raise InvalidOutputError(
            f"{role} {out} holds a published {_stage_name(owner)} output and this is {_stage_name(stage)}: "
            "publishing would replace it; choose another location (only a stage's own output is replaced)")


def _stage_name(stage: str | None) -> str:
    return f"'{stage}'" if stage else "an unnamed stage's"


def _refuse_foreign(out: Uri, stage: str | None, role: str) -> None:
    """Publishing replaces what an output holds: refuse an output that another stage published (a model, say) or is
    publishing, and one holding files that neither a manifest of this stage at the output's root nor a pending
    record of this stage names (someone else's). Nested outputs (checkpoints) are their own: accepted when this
    stage's, never removed. A lease, anywhere, proves nothing."""
    if exists(out.join(MANIFEST_NAME)):
        _refuse_other_stage(out, stage, role)
        return
    names = list_files(out)
    records = _read_pending(out, names)
    for name, record in records:
        if record.stage != stage:
            raise InvalidOutputError(
                f"{role} {out} holds an unfinished {_stage_name(record.stage)} output ({name}) and this is "
                f"{_stage_name(stage)}: publishing would replace it; choose another location")
    for name in sorted(n for n in names if n.rpartition("/")[2] == MANIFEST_NAME):
        owner = _stage_of(out.join(name))
        if owner != stage:
            raise InvalidOutputError(
                f"{role} {out} holds a published {_stage_name(owner)} output ({name}) and this is "
                f"{_stage_name(stage)}: publishing would replace it; choose another location")
    known = _known_files(out, names, stage, records)
    foreign = [name for name in _own_files(out, names) if not _reserved(name) and not known.covers(name)]
    if foreign:
        raise InvalidOutputError(
            f"{role} {out} already holds {len(foreign)} files that are not this stage's ({some_names(foreign)}): "
            "no manifest or "
            "pending record of it names them, and publishing replaces what an output holds, so refusing to write "
            "there: choose an empty location or remove them")


def _probe_local(out: Uri) -> None:
    path = Path(out.path)
    if path.exists() and not path.is_dir():
        raise InvalidOutputError(f"output {out} is a file; an output is a folder")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise InvalidOutputError(f"output {out}: {existing} is a file, so the folder cannot be created")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidOutputError(f"output {out}: {existing} is not writable by this user")
