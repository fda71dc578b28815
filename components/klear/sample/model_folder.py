"""A model given by URI, as a local folder: checked, fingerprinted and its chat template read, without torch."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from klear.common import storage
from klear.sample.backends.base import BackendError
from klear.sample.units import canonical_hash

log = logging.getLogger("klear.sample")


def local_model(uri: str, stack: contextlib.ExitStack) -> tuple[Path, storage.Manifest | None]:
    """A published model (checksums verified) or a plain Hugging Face folder, checked to be a model."""
    loc = storage.Uri.parse(uri)
    manifest = None
    try:
        if storage.exists(loc.join(storage.MANIFEST_NAME)):
            path, manifest = stack.enter_context(storage.fetch_published(loc))
        else:
            path = stack.enter_context(storage.localize(loc))
    except FileNotFoundError:
        raise BackendError(f"--model {uri}: no such folder") from None
    check_model_folder(path, uri)
    return path, manifest


def check_model_folder(path: Path, uri: str) -> None:
    if not path.is_dir():
        raise BackendError(f"--model {uri}: a file, not a model folder")
    config = path / "config.json"
    if not config.is_file():
        raise BackendError(f"--model {uri}: no config.json; expected a Hugging Face model folder "
                           f"(files present: {sorted(p.name for p in path.iterdir())[:20]})")
    try:
        body = json.loads(config.read_text())
    except ValueError as exc:
        raise BackendError(f"--model {uri}: config.json is not JSON ({exc})") from None
    if not isinstance(body, dict) or not (body.get("model_type") or body.get("architectures")):
        raise BackendError(f"--model {uri}: config.json names no model_type or architectures")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise BackendError(f"--model {uri}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise BackendError(f"--model {uri}: no weights (*.safetensors or *.bin)")
    if chat_template(path) is None:
        raise BackendError(f"--model {uri}: the tokenizer has no chat template; prompts are chats")


def chat_template(path: Path) -> str | None:
    """The chat template the tokenizer applies: chat_template.jinja, else tokenizer_config.json's."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    with contextlib.suppress(OSError, ValueError):
        template = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template")
        if isinstance(template, str):
            return template
        if isinstance(template, list):  # named templates: the default one
            return next((t.get("template") for t in template if t.get("name") == "default"), None)
    return None


def fingerprint(path: Path, manifest: storage.Manifest | None, cache: bool = True) -> str:
    """What the model is, independent of where it lies: the sha256 of every file, by relative path. A published
    model's manifest holds them already (fetching it verified them); a plain folder's files are hashed, each
    digest cached beside the folder (`cache`) so that a folder sampled again is not read again."""
    if manifest is not None:
        return canonical_hash({rel: entry["sha256"] for rel, entry in manifest.files.items()})
    return canonical_hash(folder_digests(path, digest_cache_path(path) if cache else None))


def model_identity(uri: str, path: Path, manifest: storage.Manifest | None) -> dict[str, Any]:
    """The backend identity of a model: its content and the chat template it applies. An S3 folder was
    downloaded to a temporary copy: nothing to cache there."""
    return {"engine": "model", "model": fingerprint(path, manifest, cache=not storage.Uri.parse(uri).is_s3),
            "chat_template": canonical_hash(chat_template(path))}


# --------------------------------------------------------------------------- content digests of a plain folder

DIGEST_CACHE_SUFFIX = ".klear-sha256.json"
_CACHE_FORMAT = 1


def digest_cache_path(folder: Path) -> Path | None:
    """Where the digests of a plain model folder are cached: a hidden file beside the folder, never inside it,
    so it is no file of the model (not listed, fingerprinted, published or copied with it). None where that
    would put a file into a published output (its manifest would not list it) or the folder has no parent."""
    folder = folder.resolve()
    if folder.parent == folder:
        return None
    if any((above / storage.MANIFEST_NAME).exists() for above in folder.parents):
        return None
    return folder.parent / f".{folder.name}{DIGEST_CACHE_SUFFIX}"


def stat_key(stat: os.stat_result) -> list[int]:
    """What must be unchanged for a cached digest to hold: size, mtime and also ctime and inode, which a
    copy that keeps the mtime (cp -p, rsync -a, tar) cannot keep."""
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def cached_digest(entry: Any, key: list[int]) -> str | None:
    """The cached sha256 when the entry was recorded for a file in this state, else None."""
    if isinstance(entry, dict) and entry.get("stat") == key and isinstance(entry.get("sha256"), str):
        return str(entry["sha256"])
    return None


def model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and not storage.is_bookkeeping(p.name))


def folder_digests(folder: Path, cache_file: Path | None) -> dict[str, str]:
    """Relative path -> sha256 of every file of a plain folder, the manifest's form. Digests are taken from
    `cache_file` where the file's stat_key is unchanged; a cache that cannot be read or written is skipped."""
    cached = _read_cache(cache_file)
    digests: dict[str, str] = {}
    entries: dict[str, dict[str, Any]] = {}
    for file in model_files(folder):
        rel = file.relative_to(folder).as_posix()
        key = stat_key(file.stat())
        digest = cached_digest(cached.get(rel), key)
        if digest is None:
            digest = storage.sha256_file(file)
            # A file written while it was read is hashed again next time.
            if stat_key(file.stat()) != key:
                key = []
        digests[rel] = digest
        entries[rel] = {"stat": key, "sha256": digest}
    if cache_file is not None and entries != cached:
        _write_cache(cache_file, entries)
    return digests


def _read_cache(cache_file: Path | None) -> dict[str, Any]:
    if cache_file is None:
        return {}
    try:
        body = json.loads(cache_file.read_bytes())
    except (OSError, ValueError):
        return {}
    files = body.get("files") if isinstance(body, dict) and body.get("format") == _CACHE_FORMAT else None
    return files if isinstance(files, dict) else {}


def _write_cache(cache_file: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Written whole and renamed into place: a reader sees the old cache or the new, never half of one."""
    tmp = cache_file.with_name(f"{cache_file.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"format": _CACHE_FORMAT, "files": entries}, sort_keys=True))
        os.replace(tmp, cache_file)
    except OSError as exc:  # a read-only location: the digests are simply taken again next time
        log.debug("not caching the digests of %s: %s", cache_file, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
