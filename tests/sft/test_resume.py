"""Checkpoints on the real SeaweedFS S3 server: SIGKILL mid-run, restart, resume; incomplete or corrupt ones ignored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from klear.common import storage
from klear.training import checkpoints
from tests.training import kill_after_first_checkpoint


def _sft(tiny_model: str, demo_files: list[str], output: str, work: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "klear.cli", "sft", "--model", tiny_model, "--data", *demo_files,
           "--output", output, "--config", "tiny", "--work-dir", str(work)]
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume(tiny_model: str, demo_files: list[str], reference_run: dict[str, Any],
                                                s3_bucket: str, tmp_path: Path) -> None:
    output = f"{s3_bucket}/sft"
    first = _sft(tiny_model, demo_files, output, tmp_path / "pod-1", tmp_path / "first.log")
    killed_at = kill_after_first_checkpoint(first, output, tmp_path / "first.log")
    total = reference_run["report"]["training"]["global_step"]
    assert killed_at < total and not storage.exists(f"{output}/{storage.MANIFEST_NAME}"), "the first run had finished"
    # A later checkpoint whose upload was cut off (no manifest; its pending record, as publish_dir writes it first,
    # names the file) must be ignored.
    cut_off = f"{output}/checkpoints/step-{total - 1:09d}"
    storage.note_pending(cut_off, "cut-off", "sft", files=["model.safetensors"])
    storage.write_bytes(f"{cut_off}/model.safetensors", b"partial upload")

    second = _sft(tiny_model, demo_files, output, tmp_path / "pod-2", tmp_path / "second.log")  # a fresh pod
    assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    log = (tmp_path / "second.log").read_text()
    assert "resuming from checkpoint checkpoint-" in log
    report = json.loads(storage.read_bytes(f"{output}/report.json"))
    resumed = report["training"]["resumed_from_step"]
    assert killed_at - 10 <= resumed <= killed_at and resumed % 10 == 0  # the newest complete one (save_steps 10)
    assert report["training"]["global_step"] == total  # same optimizer steps as the uninterrupted run
    assert report["training"]["epochs"] == pytest.approx(4.0)
    # Same data order and RNG after the resume: the last logged loss equals the uninterrupted run's.
    assert report["metrics"]["final_loss"] == pytest.approx(reference_run["report"]["metrics"]["final_loss"], rel=1e-3)
    # Old checkpoints are pruned to `keep_checkpoints`, newest kept, the final one included.
    steps = checkpoints.published_steps(output)
    assert steps[-1] == total and len(steps) == 2
    # TensorBoard curves continue across the restart: the published logs hold steps from before the kill.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with storage.fetch_published(output) as (local, _):
        logged = [event.step for event in EventAccumulator(str(local / "logs")).Reload().Scalars("train/loss")]
    assert min(logged) <= resumed and max(logged) == total


def _fake_checkpoint(tmp_path: Path, output: str, step: int) -> None:
    local = tmp_path / f"ckpt-{step}"
    local.mkdir()
    (local / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    storage.publish_dir(local, checkpoints.checkpoint_uri(output, step))


def test_newest_complete_readable_checkpoint_wins(s3_bucket: str, tmp_path: Path) -> None:
    output = f"{s3_bucket}/run"
    assert checkpoints.newest_checkpoint(output, tmp_path / "t") is None  # nothing there: from scratch
    for step in (5, 10, 15):
        _fake_checkpoint(tmp_path, output, step)
    storage.write_bytes(f"{output}/checkpoints/step-000000020/trainer_state.json", b"{}")  # no manifest
    storage.write_bytes(f"{output}/checkpoints/step-000000015/trainer_state.json", b"corrupted")  # checksum fails
    found = checkpoints.newest_checkpoint(output, tmp_path / "t")
    assert found == tmp_path / "t" / "checkpoint-10"
    assert json.loads((found / "trainer_state.json").read_text())["global_step"] == 10
    assert not (found / storage.MANIFEST_NAME).exists()
    meta = json.loads((found / checkpoints.META_FILE).read_text())
    assert meta == {}  # publish_dir without meta records none: a lineage is the publisher's to hand over
    checkpoints.delete_checkpoint(output, 5)
    assert checkpoints.published_steps(output) == [10, 15]


def test_unreadable_checkpoint_prefix_means_from_scratch(s3_env: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="klear.sft"):
        assert checkpoints.newest_checkpoint("s3://no-such-bucket-klear/run", Path("/nonexistent")) is None
    assert "starting from scratch" in caplog.text


def test_other_process_count() -> None:
    assert checkpoints.world_size_problem(None, 4, deepspeed=True) is None  # older checkpoint: nothing known
    assert checkpoints.world_size_problem(8, 8, deepspeed=True) is None
    kind, message = checkpoints.world_size_problem(16, 8, deepspeed=True)
    assert kind == "error" and "--model <output>/checkpoints/step-N" in message
    assert checkpoints.world_size_problem(2, 1, deepspeed=False)[0] == "warning"


def test_new_run_from_a_checkpoints_weights(reference_run: dict[str, Any], demo_files: list[str], tmp_path: Path) -> None:
    """The documented way across process counts: a checkpoint is itself a published Hugging Face model folder."""
    from klear.common.config import load_config
    from klear.sft.config import SftConfig
    from klear.sft.stage import run

    step = checkpoints.published_steps(str(reference_run["output"]))[-1]
    source = str(checkpoints.checkpoint_uri(str(reference_run["output"]), step))
    config = load_config(SftConfig, "tiny", ["num_epochs=1", "save_steps=1000"])
    report = run(source, demo_files[:1], str(tmp_path / "out"), config, work_dir=str(tmp_path / "work"))
    # Starts where the reference ended: the loss is already low, far below a fresh model's ~6.8.
    assert report["training"]["resumed_from_step"] == 0 and report["metrics"]["first_loss"] < 3.0


def test_restart_at_an_epoch_boundary_trains_the_remaining_epochs(tiny_model: str, demo_files: list[str],
                                                                  reference_run: dict[str, Any], tmp_path: Path) -> None:
    from klear.common.config import load_config
    from klear.sft.config import SftConfig
    from klear.sft.stage import run

    per_epoch = reference_run["report"]["training"]["max_steps"] // 4
    config = load_config(SftConfig, "tiny", ["num_epochs=2", f"save_steps={per_epoch}"])
    output = str(tmp_path / "out")
    first = run(tiny_model, demo_files, output, config, work_dir=str(tmp_path / "w1"))
    assert checkpoints.published_steps(output) == [per_epoch, 2 * per_epoch]
    checkpoints.delete_checkpoint(output, 2 * per_epoch)  # as if the run died right after epoch 1's checkpoint
    second = run(tiny_model, demo_files, output, config, work_dir=str(tmp_path / "w2"))
    assert second["training"]["resumed_from_step"] == per_epoch
    assert second["training"]["global_step"] == 2 * per_epoch and second["training"]["epochs"] == pytest.approx(2.0)
    assert second["training"]["checkpoints_published"] == [2 * per_epoch]  # epoch 2 really ran
    assert second["metrics"]["final_loss"] == pytest.approx(first["metrics"]["final_loss"], rel=1e-4)


def test_rotation_removes_whole_checkpoint_folders(tmp_path: Path) -> None:
    """Rotating to keep_checkpoints=1 on local storage: an older checkpoint goes with its folders (its tensorboard/
    copy included), not only its files."""
    from types import SimpleNamespace

    from torch.utils.tensorboard import SummaryWriter

    output, trainer_dir = str(tmp_path / "out"), tmp_path / "trainer"
    writer = SummaryWriter(log_dir=str(tmp_path / "logs"))
    uploader = checkpoints.CheckpointUploader(output, tmp_path / "staging", keep=1, tensorboard=writer)
    for step in (10, 20):
        local = trainer_dir / f"checkpoint-{step}"
        local.mkdir(parents=True)
        (local / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        writer.add_scalar("train/loss", 1.0 / step, step)
        uploader.on_save(SimpleNamespace(output_dir=str(trainer_dir), world_size=1),
                         SimpleNamespace(global_step=step, is_world_process_zero=True), None)
        uploader.wait()
    writer.close()
    assert checkpoints.published_steps(output) == [20]
    assert [p.name for p in (tmp_path / "out" / checkpoints.CHECKPOINTS).iterdir()] == ["step-000000020"]
    assert any((tmp_path / "out" / checkpoints.CHECKPOINTS / "step-000000020" / checkpoints.TENSORBOARD).iterdir())
