"""Copy a published model folder to the server's volume, as the InferenceService's init container does:

    python -m klear.serve.fetch s3://bucket/runs/<run id>/gppo-code /model

Exactly the files the output's manifest lists, each checked against its size and sha256: not the model card, the
checkpoints or the logs of the training run beside them, nor a folder without a manifest (unfinished, or being
re-published). Resumable: a file already there with the listed checksum is kept, each download goes to a temporary
name and is renamed when verified, files the manifest does not list (an older model in a reused volume: vLLM would
load every *.safetensors it finds) are removed, and the manifest is written last: a folder holding it holds the model.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from klear.common import storage

log = logging.getLogger("klear.serve")


def relative_path(rel: str, origin: str) -> PurePosixPath:
    """A manifest's file name as a path inside the target: relative, without '..' (a manifest cannot write outside)."""
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or ".." in path.parts or path.name in ("", "."):
        raise storage.StorageError(f"{origin}: the manifest lists {rel!r}, not a file inside the folder")
    return path


def check_model_listing(names: Iterable[str], origin: str) -> None:
    """Refuse a published output that is not a Hugging Face model folder before anything is copied or served."""
    top = {name for name in names if "/" not in name}
    missing = [what for what, found in (
        ("config.json", "config.json" in top),
        ("tokenizer files (tokenizer.json / tokenizer_config.json)", bool(top & {"tokenizer.json", "tokenizer_config.json"})),
        ("weights (*.safetensors)", any(name.endswith(".safetensors") for name in top))) if not found]
    if missing:
        raise storage.StorageError(f"{origin} lists no {', '.join(missing)}: not a model folder "
                                   f"(listed: {storage.some_names(sorted(top), 8)})")


def matches(path: Path, entry: Mapping[str, Any]) -> bool:
    """Whether a local file is the listed one: its size, then (only then) its sha256."""
    return path.is_file() and path.stat().st_size == entry["size"] and storage.sha256_file(path) == entry["sha256"]


def unlisted_files(root: Path, listed: set[PurePosixPath]) -> list[Path]:
    """Files under `root` that are not listed (the manifest's own copy aside): what a copy of the model must not hold."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root) != Path(storage.MANIFEST_NAME)
                  and PurePosixPath(p.relative_to(root).as_posix()) not in listed)


def fetch_model(uri: str, target: str | os.PathLike[str]) -> dict[str, int]:
    """Make `target` hold exactly the published output at `uri`; returns the files kept, fetched and removed."""
    loc = storage.Uri.parse(uri)
    manifest = storage.read_manifest(loc)  # refuses a folder without one, naming it
    origin = str(loc.join(storage.MANIFEST_NAME))
    files = {relative_path(rel, origin): entry for rel, entry in manifest.files.items()}
    check_model_listing(manifest.files, origin)
    root = Path(target)
    root.mkdir(parents=True, exist_ok=True)
    (root / storage.MANIFEST_NAME).unlink(missing_ok=True)  # back last, once every file is there
    counts = {"kept": 0, "fetched": 0, "removed": 0, "bytes": 0}
    for stale in unlisted_files(root, set(files)):
        log.info("removing %s: not in %s", stale, origin)
        stale.unlink()
        counts["removed"] += 1
    for rel, entry in sorted(files.items()):
        local = root / rel
        if matches(local, entry):
            counts["kept"] += 1
            continue
        partial = local.with_name(f".{local.name}.partial")
        storage.download_file(loc.join(str(rel)), partial)
        if not matches(partial, entry):
            partial.unlink()
            raise storage.StorageError(f"{loc.join(str(rel))}: size or sha256 differs from {origin} (overwritten "
                                       "since it was published, or corrupt)")
        os.replace(partial, local)
        counts["fetched"] += 1
        counts["bytes"] += int(entry["size"])
        log.info("fetched %s (%d bytes)", rel, entry["size"])
    storage.write_bytes(str(root / storage.MANIFEST_NAME), manifest.to_json())
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m klear.serve.fetch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("uri", help="the published model folder (s3:// or a path)")
    parser.add_argument("target", help="the local folder the server reads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        counts = fetch_model(args.uri, args.target)
    except (OSError, storage.StorageError) as exc:
        print(f"klear.serve.fetch: error: {exc}", file=sys.stderr)
        return 2
    log.info("%s in %s: %s", args.uri, args.target, counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
