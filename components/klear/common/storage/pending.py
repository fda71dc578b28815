"""Pending records: which files of an output that no manifest lists yet are klear's own.

What a writer puts into an output before its manifest (the files of a publish under way, progress a
stage resumes from) it first names in a pending record, `_PENDING-<run id>.json` at the output's root:
its stage and the files (or folders) it writes. After a crash, those named files, and only those, are
known to be klear's own: the next run of the same stage may replace them. Anything else found in an
output without a manifest of the same stage is someone else's, and the output is refused."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from klear.common.storage.files import list_files, read_bytes, write_bytes
from klear.common.storage.manifest import read_manifest
from klear.common.storage.uri import (
    MANIFEST_NAME,
    PENDING_PREFIX,
    PROBE_PREFIX,
    StorageError,
    Uri,
    is_bookkeeping,
    is_pending_record,
    timestamp,
)

log = logging.getLogger("klear.storage")


def _nested_roots(names: Iterable[str]) -> set[str]:
    """Sub-folders that are outputs of their own (a manifest, lease or pending record inside), e.g.
    `checkpoints/step-N`: a publish of the folder above never removes their files."""
    roots = set()
    for name in names:
        folder, _, base = name.rpartition("/")
        if folder and is_bookkeeping(base):
            roots.add(folder)
    return roots


def own_files(loc: Uri, names: Sequence[str] | None = None) -> list[str]:
    """Files under `loc` that belong to it: all but those inside nested outputs, which have their own owner."""
    names = list_files(loc) if names is None else names
    nested = _nested_roots(names)
    if not nested:
        return list(names)
    return [name for name in names if not any(name.startswith(root + "/") for root in nested)]


def is_reserved(name: str) -> bool:
    """A file of an output that is never its content, so no publish lists or removes it."""
    # README.md: a model's card, written beside its manifest and outside its content (klear.common.model_card)
    return is_bookkeeping(name) or name == "README.md" or name.startswith(PROBE_PREFIX)


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
    body = {"format": 1, "stage": stage, "run_id": run_id, "time": timestamp(), "files": sorted(set(files)),
            "prefixes": sorted(set(prefixes))}
    write_bytes(Uri.parse(uri).join(f"{PENDING_PREFIX}{run_id}.json"), json.dumps(body).encode())


def read_pending(loc: Uri, names: Iterable[str]) -> list[tuple[str, Pending]]:
    """The pending records at `loc`'s root (name, record); one that cannot be read proves nothing and is skipped."""
    records = []
    for name in names:
        if "/" in name or not is_pending_record(name):
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


def known_files(loc: Uri, names: Sequence[str], stage: str | None,
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
    for _, record in read_pending(loc, names) if records is None else records:
        if record.stage == stage:
            files |= record.files
            prefixes += record.prefixes
    return Pending(stage, frozenset(files), tuple(prefixes))
