"""The serving pod's copy of a published model (`python -m klear.serve.fetch`, the InferenceService's init container)
against a real S3 server: exactly the files the manifest lists, verified, resumable; not the training run's
checkpoints, card or stale shards beside them; nothing from a folder that is not a published model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from klear.common import storage
from klear.serve.fetch import fetch_model
from klear.serve.manifest import ServeSpec, inference_service

MODEL_FILES = {"config.json": b'{"model_type": "qwen3"}', "tokenizer.json": b"{}", "model.safetensors": b"w" * 4096,
               "logs/history.jsonl": b"{}\n"}


def _publish_model(tmp_path: Path, uri: str) -> None:
    """A model folder as sft/gppo leave it: the model published, a checkpoint (its own output) and the card beside."""
    for root, files in ((tmp_path / "model", MODEL_FILES), (tmp_path / "step", {"optimizer.pt": b"o" * 8192,
                                                                               "model.safetensors": b"c" * 4096})):
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
    storage.publish_dir(tmp_path / "model", uri, meta={"stage": "gppo"})
    storage.publish_dir(tmp_path / "step", f"{uri}/checkpoints/step-000000002", meta={"stage": "gppo"})
    storage.write_bytes(f"{uri}/README.md", b"# model card")
    # A shard an earlier, larger model left under the prefix: vLLM would load every *.safetensors of the folder.
    storage.write_bytes(f"{uri}/model-00002-of-00002.safetensors", b"stale")


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_init_containers_command_copies_exactly_the_listed_files(s3_bucket: str, tmp_path: Path) -> None:
    uri = f"{s3_bucket}/runs/run-1/gppo-code"
    _publish_model(tmp_path, uri)
    target = tmp_path / "served"
    spec = ServeSpec(name="klear-rl", model_uri=uri, server_image="g", fetch_image="c")
    (fetch,) = inference_service(spec)["spec"]["predictor"]["initContainers"]
    command = [sys.executable, *fetch["command"][1:-1], str(target)]  # this interpreter, this folder for /model
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert done.returncode == 0, done.stderr
    copied = _files(target)
    assert {rel: data for rel, data in copied.items() if rel != storage.MANIFEST_NAME} == MODEL_FILES
    assert json.loads(copied[storage.MANIFEST_NAME])["files"].keys() == MODEL_FILES.keys()


def test_a_restarted_copy_keeps_what_is_verified_and_replaces_the_rest(s3_bucket: str, tmp_path: Path) -> None:
    uri = f"{s3_bucket}/rl"
    _publish_model(tmp_path, uri)
    target = tmp_path / "served"
    assert fetch_model(uri, target)["fetched"] == len(MODEL_FILES)
    (target / "model.safetensors").write_bytes(b"x" * 4096)  # same size, other bytes: a file of another model
    (target / "extra.safetensors").write_bytes(b"old")
    (target / storage.MANIFEST_NAME).unlink()
    counts = fetch_model(uri, target)
    assert (counts["kept"], counts["fetched"], counts["removed"]) == (len(MODEL_FILES) - 1, 1, 1)
    assert (target / "model.safetensors").read_bytes() == MODEL_FILES["model.safetensors"]
    assert not (target / "extra.safetensors").exists() and (target / storage.MANIFEST_NAME).is_file()


def test_what_is_not_a_published_model_is_refused_before_any_copy(s3_bucket: str, tmp_path: Path) -> None:
    target = tmp_path / "served"
    storage.write_bytes(f"{s3_bucket}/half/model.safetensors", b"w")  # a publish that never finished
    with pytest.raises(storage.UnpublishedOutputError, match="half has no _MANIFEST.json"):
        fetch_model(f"{s3_bucket}/half", target)
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "rows.parquet").write_bytes(b"p")
    storage.publish_dir(tmp_path / "samples", f"{s3_bucket}/samples", meta={"stage": "sample"})
    with pytest.raises(storage.StorageError, match="lists no config.json, tokenizer files .* weights"):
        fetch_model(f"{s3_bucket}/samples", target)
    assert not target.exists() or not any(target.iterdir())


def test_a_manifest_cannot_write_outside_the_folder(tmp_path: Path) -> None:
    source = tmp_path / "model"
    source.mkdir()
    manifest = storage.Manifest(files={"../escape.safetensors": {"size": 1, "sha256": "0" * 64}}, meta={}, created="")
    (source / storage.MANIFEST_NAME).write_bytes(manifest.to_json())
    with pytest.raises(storage.StorageError, match="not a file inside the folder"):
        fetch_model(str(source), tmp_path / "served")
    assert not (tmp_path / "escape.safetensors").exists()
