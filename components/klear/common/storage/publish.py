"""Publishing, and reading what was published.

A stage writes its data files first and a manifest (`_MANIFEST.json`: every file with its size and sha256) last.
Readers trust only outputs that have a manifest, and only the files it lists, so a run that crashed half-way never
looks complete. Publishing also removes the files the new manifest does not list, so an output folder holds exactly
what its manifest says."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from klear.common.storage.checks import refuse_other_stage
from klear.common.storage.files import delete, download_file, list_files, some_names, upload_file, write_bytes
from klear.common.storage.leases import OutputLease, claim_output
from klear.common.storage.manifest import Manifest, check_file, file_entries, file_entry, read_manifest
from klear.common.storage.pending import Pending, is_reserved, known_files, note_pending, own_files, read_pending
from klear.common.storage.s3 import s3_client, s3_errors
from klear.common.storage.uri import MANIFEST_NAME, LeaseLostError, StorageError, Uri, is_bookkeeping, is_pending_record, timestamp

log = logging.getLogger("klear.storage")


def _begin_publish(loc: Uri, lease: OutputLease, stage: str | None, files: Iterable[str]) -> Pending:
    """Before a publish changes anything in `loc`: its lease still held, no other stage's output there, a pending
    record naming `files` (what this writer uploads) and what an earlier publish or a crashed run of the stage left,
    then the earlier manifest deleted, so an overwrite cut short leaves an output that readers refuse and the next
    run of the stage may replace. Returns what the stage left there (its manifest's files, its pending records)."""
    lease.verify()  # a run whose lease was taken over during its work must not touch the output
    refuse_other_stage(loc, stage, "output")
    known = known_files(loc, list_files(loc), stage)
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
        later = known_files(loc, list_files(loc), stage) if complete is not None else Pending(stage)
        _remove_unlisted(loc, entries, Pending(stage, known.files | later.files | set(entries),
                                               known.prefixes + later.prefixes))
        lease.verify()  # a writer that lost its lease must not publish over its successor
        manifest = Manifest(files=entries, meta=dict(meta or {}), created=timestamp(), run_id=lease.run_id)
        write_bytes(loc.join(MANIFEST_NAME), manifest.to_json())
        if streamed is not None:
            streamed.published = True
        # The manifest names what is there now: the pending records (this writer's, other nodes', a crashed run's)
        # have served.
        _drop_pending(loc)
        lease.forget_named()
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
    records = read_pending(loc, names)
    if stage is None:  # no manifest (a deletion cut short before): the pending records say whose it is
        stage = next((record.stage for _, record in records), None)
    known = known_files(loc, names, stage, records)
    run_id = f"withdraw-{uuid.uuid4().hex}"
    note_pending(loc, run_id, stage, files=known.files, prefixes=known.prefixes)
    delete(loc.join(MANIFEST_NAME))
    _delete_names(loc, [name for name in own_files(loc, names) if known.covers(name) and not is_reserved(name)])
    _drop_pending(loc)


@contextlib.contextmanager
def fetch_published(uri: str | Uri) -> Iterator[tuple[Path, Manifest]]:
    """A local directory holding exactly the files a published output's manifest lists, checksums verified.

    The manifest is read first: an unpublished S3 folder is refused before anything is downloaded."""
    loc = Uri.parse(uri)
    manifest = read_manifest(loc)
    if not loc.is_s3:
        for rel, entry in manifest.files.items():
            check_file(Path(loc.path) / rel, entry, loc.join(rel))
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
            check_file(target, entry, loc.join(rel))
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
            check_file(Path(loc.path) / rel, manifest.files[rel], loc.join(rel))
            yield rel, Path(loc.path) / rel
        return
    with tempfile.TemporaryDirectory(prefix="klear-part-") as tmp:
        for rel in wanted:
            target = Path(tmp) / rel
            try:
                download_file(loc.join(rel), target)
                check_file(target, manifest.files[rel], loc.join(rel))
                yield rel, target
            finally:
                target.unlink(missing_ok=True)


def _unlisted(loc: Uri, listed: Iterable[str]) -> list[str]:
    keep = set(listed)
    return [name for name in own_files(loc) if name not in keep and not is_reserved(name)]


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
    _delete_names(loc, [name for name in list_files(loc) if "/" not in name and is_pending_record(name)])


def _delete_names(loc: Uri, names: Sequence[str]) -> None:
    if not names:
        return
    log.info("%s: removing %d files of this stage no manifest lists now", loc, len(names))
    if loc.is_s3:
        client = s3_client()
        for start in range(0, len(names), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": loc.join(name).path} for name in names[start : start + 1000]]
            with s3_errors(loc, "removing stale files from"):
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
