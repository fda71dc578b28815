"""Ownership: one output has at most one writer.

A writer holds the output's lease (`_LEASE.json`) from before it changes anything until its manifest is written: on
S3 a conditional create (`If-None-Match: *`) renewed by a heartbeat, on local paths an flock the kernel drops when
the process dies. A second writer fails at once with OutputBusyError; see `claim_output`. A lease only says who
writes; it is never a licence to delete anything."""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import email.utils
import fcntl
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from klear.common.storage.files import delete
from klear.common.storage.pending import Pending, note_pending
from klear.common.storage.s3 import s3_client, s3_errors
from klear.common.storage.uri import (
    LEASE_NAME,
    PENDING_PREFIX,
    InvalidOutputError,
    LeaseLostError,
    OutputBusyError,
    StorageError,
    Uri,
    timestamp,
)

log = logging.getLogger("klear.storage")

# This process's pipeline run, as the pipeline sets it (the pod's `pipeline/runid` label; klear.common.kfp_io reads
# it here): a retried task of the same run takes its earlier attempt's lease at once.
RUN_ID_ENV = "KLEAR_RUN_ID"


def _lease_ttl() -> float:
    return float(os.environ.get("KLEAR_LEASE_TTL_S", "120"))


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
              "ttl_s": ttl_s, "released": released, "time": timestamp(), "pipeline_run": _pipeline_run(), "task": task}
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

    def forget_named(self) -> None:
        """After a manifest: the pending records went with it, so a later write ahead of a manifest names its files
        anew."""
        self._named.clear()

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

    with s3_errors(uri, action):
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
        with s3_errors(key, "reading lease"):
            response = s3_client().get_object(Bucket=key.bucket, Key=key.path)
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
            put = _conditional(key, "renewing lease", lambda: s3_client().put_object(
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
                    _conditional(key, "releasing lease", lambda: s3_client().delete_object(
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
    client = s3_client()
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
