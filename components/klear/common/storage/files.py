"""The basic operations, alike for local paths and S3 objects: exists, read, write, delete, upload, download, list,
and a local copy of any location (`localize`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from klear.common.storage.s3 import s3_client, s3_errors, transfer_config
from klear.common.storage.uri import Uri


def exists(uri: str | Uri) -> bool:
    loc = Uri.parse(uri)
    if not loc.is_s3:
        return Path(loc.path).exists()
    try:
        with s3_errors(loc, "checking"):
            s3_client().head_object(Bucket=loc.bucket, Key=loc.path)
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
    with s3_errors(loc, "reading"):
        return s3_client().get_object(Bucket=loc.bucket, Key=loc.path)["Body"].read()


def write_bytes(uri: str | Uri, data: bytes) -> None:
    """Write a whole object; local files are replaced atomically (temp file + rename)."""
    loc = Uri.parse(uri)
    if loc.is_s3:
        with s3_errors(loc, "writing"):
            s3_client().put_object(Bucket=loc.bucket, Key=loc.path, Body=data)
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
        with s3_errors(loc, "deleting"):
            s3_client().delete_object(Bucket=loc.bucket, Key=loc.path)
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
    with s3_errors(loc, "uploading to"):
        s3_client().upload_file(str(local), loc.bucket, loc.path, Config=transfer_config())


def download_file(uri: str | Uri, local: str | Path) -> None:
    loc = Uri.parse(uri)
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    if not loc.is_s3:
        if not Path(loc.path).is_file():
            raise FileNotFoundError(f"no such file: {loc}")
        shutil.copyfile(loc.path, local)
        return
    with s3_errors(loc, "downloading"):
        s3_client().download_file(loc.bucket, loc.path, str(local), Config=transfer_config())


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
    with s3_errors(loc, "listing"):
        paginator = s3_client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=loc.bucket, Prefix=prefix):
            names.extend(obj["Key"][len(prefix) :] for obj in page.get("Contents", []))
    return sorted(names)


def is_dir(uri: str | Uri) -> bool:
    loc = Uri.parse(uri)
    if not loc.is_s3:
        return Path(loc.path).is_dir()
    prefix = loc.path.rstrip("/") + "/"
    with s3_errors(loc, "listing"):
        page = s3_client().list_objects_v2(Bucket=loc.bucket, Prefix=prefix, MaxKeys=1)
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
