"""Bad input to the training stages: refused early, named, nothing published; a resume never mixes two runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from klear.common import storage
from klear.training.fingerprint import config_digest, differing_parts

CHAT = {"messages": [{"role": "user", "content": "What is 2 + 3?"},
                     {"role": "assistant", "content": "<think>\n2 + 3 = 5\n</think>\n\n\\boxed{5}"}]}


def _klear(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klear.cli", *args], capture_output=True, text=True, timeout=timeout)


def _sft(model: str, data: str, output: Path, *sets: str) -> subprocess.CompletedProcess:
    argv = ["sft", "--model", model, "--data", data, "--output", str(output), "--config", "tiny",
            "--work-dir", str(output.parent / f"work-{output.name}")]
    for item in sets:
        argv += ["--set", item]
    return _klear(*argv)


def _unpublished(output: Path) -> bool:
    return not (output / storage.MANIFEST_NAME).exists()


def _jsonl(path: Path, rows: list[dict], extra_line: str = "") -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra_line)
    return str(path)


def test_malformed_data_names_file_and_line(tiny_model: str, tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "bad.jsonl", [CHAT], "{not json\n")
    done = _sft(tiny_model, data, tmp_path / "out")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{data}:2: malformed JSON" in done.stderr
    assert "Traceback" not in done.stderr
    assert _unpublished(tmp_path / "out")


def test_empty_data_is_refused_by_name(tiny_model: str, tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "empty.jsonl", [])
    done = _sft(tiny_model, data, tmp_path / "out")
    assert done.returncode == 2 and f"no records in {data}" in done.stderr, done.stderr[-2000:]
    assert _unpublished(tmp_path / "out")


def test_corrupt_weights_name_the_file(tiny_model: str, tmp_path: Path) -> None:
    model = tmp_path / "plain-model"  # a plain Hugging Face folder: no manifest whose checksums would catch it
    shutil.copytree(tiny_model, model, ignore=shutil.ignore_patterns(storage.MANIFEST_NAME, "_LEASE.json"))
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    done = _sft(str(model), _jsonl(tmp_path / "d.jsonl", [CHAT]), tmp_path / "out")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "model.safetensors is not a readable safetensors file" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("stage", ["sft", "gppo"])
def test_output_equal_to_the_model_is_refused_before_work(stage: str, tiny_model: str, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    before = {p.name: p.stat().st_mtime_ns for p in model.iterdir()}
    done = _klear(stage, "--model", str(model), "--data", _jsonl(tmp_path / "d.jsonl", [CHAT]),
                  "--output", str(model), "--config", "tiny" if stage == "sft" else "tiny-math", timeout=120)
    assert done.returncode == 2 and "writing there would replace the input" in done.stderr, done.stderr[-2000:]
    assert {p.name: p.stat().st_mtime_ns for p in model.iterdir()} == before


def test_fingerprint_parts() -> None:
    base = {"model": "m", "data": "d", "config": "c"}
    assert differing_parts(base, dict(base)) == []
    assert differing_parts(base, {**base, "data": "other"}) == ["data"]
    assert differing_parts(None, base) == []  # a checkpoint written before fingerprints: nothing to compare
    # Keeping and logging settings may change between restarts; what is learned may not.
    assert config_digest({"lr": 1, "save_steps": 2}) == config_digest({"lr": 1, "save_steps": 9})
    assert config_digest({"lr": 1, "num_epochs": 1}) != config_digest({"lr": 1, "num_epochs": 2})


def test_resume_refuses_another_runs_checkpoints(tiny_model: str, tmp_path: Path) -> None:
    """Data B after data A, or other epochs, into one output: refused, never a model trained on both."""
    rows_a = [CHAT] * 4
    rows_b = [{"messages": [CHAT["messages"][0], {"role": "assistant", "content": "<think>\nno\n</think>\n\n7"}]}] * 4
    data_a, data_b = _jsonl(tmp_path / "a.jsonl", rows_a), _jsonl(tmp_path / "b.jsonl", rows_b)
    output = tmp_path / "out"
    first = _sft(tiny_model, data_a, output, "num_epochs=1", "save_steps=1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert storage.list_files(str(output / "checkpoints")), "the first run left checkpoints"

    other_data = _sft(tiny_model, data_b, output, "num_epochs=1", "save_steps=1")
    assert other_data.returncode == 2, other_data.stderr[-3000:]
    assert "holds checkpoints of another run: its data differ" in other_data.stderr

    other_config = _sft(tiny_model, data_a, output, "num_epochs=2", "save_steps=1")
    assert other_config.returncode == 2 and "its config differ" in other_config.stderr, other_config.stderr[-3000:]

    # Same run again: resumes (its own checkpoints), publishes.
    again = _sft(tiny_model, data_a, output, "num_epochs=1", "save_steps=1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from checkpoint" in again.stderr

    # Asked to start afresh: the old checkpoints go, the new run trains from step 0 and publishes.
    fresh = _sft(tiny_model, data_b, output, "num_epochs=1", "save_steps=1", "resume=false")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    report = json.loads((output / "report.json").read_text())
    assert report["training"]["resumed_from_step"] == 0
    assert report["data"]["read"] == len(rows_b)
