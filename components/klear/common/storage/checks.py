"""Output validation, before any work.

Before any work, a stage calls `check_writes` (or `check_output` for one output) with every location it will
write and every input and config file it reads, to fail in seconds on a location that would replace an input,
another stage's output or someone else's files. A published output belongs to the stage named in its manifest
(`meta.stage`): publishing replaces only an output of the same stage."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from klear.common.storage.files import exists, list_files, read_bytes, some_names
from klear.common.storage.manifest import Manifest
from klear.common.storage.pending import is_reserved, known_files, own_files, read_pending
from klear.common.storage.s3 import s3_client, s3_endpoint, s3_errors
from klear.common.storage.uri import MANIFEST_NAME, PROBE_PREFIX, InvalidOutputError, StorageError, Uri

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

    client = s3_client()
    with s3_errors(out, "checking output"):
        try:
            client.head_bucket(Bucket=out.bucket)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                raise StorageError(
                    f"checking output {out}: bucket {out.bucket!r} does not exist (endpoint {s3_endpoint()})"
                ) from None
            raise
        # Reading the bucket is not writing it: a read-only key fails here, not after the run's work.
        probe = out.join(f"{PROBE_PREFIX}{uuid.uuid4().hex}")
        client.put_object(Bucket=probe.bucket, Key=probe.path, Body=b"")
        client.delete_object(Bucket=probe.bucket, Key=probe.path)


def _stage_of(manifest_uri: Uri) -> str | None:
    return Manifest.from_json(read_bytes(manifest_uri), str(manifest_uri)).meta.get("stage")


def refuse_other_stage(out: Uri, stage: str | None, role: str) -> None:
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
        refuse_other_stage(out, stage, role)
        return
    names = list_files(out)
    records = read_pending(out, names)
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
    known = known_files(out, names, stage, records)
    foreign = [name for name in own_files(out, names) if not is_reserved(name) and not known.covers(name)]
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
