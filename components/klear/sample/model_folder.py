"""A model given by URI, as a local folder: checked, fingerprinted and its chat template read, without torch."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from klear.common import storage
from klear.sample.backends.base import BackendError
from klear.sample.units import canonical_hash

_SMALL = 16 * 1024 * 1024  # files hashed in full when fingerprinting an unpublished folder


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


def fingerprint(path: Path, manifest: storage.Manifest | None) -> str:
    """What the model is, independent of where it lies: a published model's checksums; for a plain folder,
    small files by content and large ones (weights) by size, which is cheap and tells checkpoints apart."""
    if manifest is not None:
        return canonical_hash({rel: entry["sha256"] for rel, entry in manifest.files.items()})
    entries: dict[str, str | int] = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name != storage.MANIFEST_NAME):
        size = file.stat().st_size
        rel = file.relative_to(path).as_posix()
        entries[rel] = hashlib.sha256(file.read_bytes()).hexdigest() if size <= _SMALL else size
    return canonical_hash(entries)
