"""The gppo stage end to end: checkpoints on the real SeaweedFS S3 server, SIGKILL and resume, stuck rewards, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from klear.common import storage
from klear.common.config import load_config
from klear.gppo.config import GppoConfig
from klear.gppo.stage import GppoError, run
from klear.training import checkpoints
from tests.training import kill_after_first_checkpoint

DIGITS = "reward.scorer=tests.gppo.toy_scorers:digit_fraction"


def _gppo(tiny_model: str, data: str, output: str, work: Path, log: Path, *sets: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "klear.cli", "gppo", "--model", tiny_model, "--data", data, "--output", output,
           "--config", "tiny-math", "--work-dir", str(work)]
    for item in sets:
        cmd += ["--set", item]
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume(tiny_model: str, demo_files: list[str], s3_bucket: str,
                                                tmp_path: Path) -> None:
    output = f"{s3_bucket}/gppo"
    sets = (DIGITS, "max_steps=8", "save_steps=2")
    first = _gppo(tiny_model, demo_files[0], output, tmp_path / "pod-1", tmp_path / "first.log", *sets)
    killed_at = kill_after_first_checkpoint(first, output, tmp_path / "first.log")
    assert killed_at < 8 and not storage.exists(f"{output}/{storage.MANIFEST_NAME}"), "the first run had finished"
    state = json.loads(storage.read_bytes(f"{checkpoints.checkpoint_uri(output, killed_at)}/gppo_state.json"))
    assert state["refill"]["position"] > 0  # over-sampling drew extra prompts; where it stopped is saved

    second = _gppo(tiny_model, demo_files[0], output, tmp_path / "pod-2", tmp_path / "second.log", *sets)
    assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    log = (tmp_path / "second.log").read_text()
    assert "resuming from checkpoint checkpoint-" in log
    assert f"refill stream resumed at position {state['refill']['position']}" in log
    report = json.loads(storage.read_bytes(f"{output}/report.json"))
    assert killed_at - 2 <= report["training"]["resumed_from_step"] <= killed_at
    assert report["training"]["global_step"] == 8
    with storage.fetch_published(output) as (local, manifest):
        assert (local / "model.safetensors").is_file() and (local / "logs").is_dir()
        assert manifest.meta["stage"] == "gppo"
    assert checkpoints.published_steps(output)[-1] == 8
    # Per-step metrics in TensorBoard, continued across the restart.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with storage.fetch_published(output) as (local, _):
        events = EventAccumulator(str(local / "logs")).Reload()
        tags = set(events.Tags()["scalars"])
        assert {"train/reward", "train/accuracy", "train/clip_frac_low", "train/clip_frac_high", "train/entropy",
                "train/grad_norm", "train/groups_filtered_frac", "train/reward_timeouts",
                "train/completions/mean_length"} <= tags
        steps = [e.step for e in events.Scalars("train/grad_norm")]
    assert min(steps) <= report["training"]["resumed_from_step"] and max(steps) == 8


def test_a_hanging_reward_is_killed_counted_and_training_goes_on(tiny_model: str, demo_files: list[str],
                                                                 tmp_path: Path) -> None:
    config = load_config(GppoConfig, "tiny-math", ["reward.scorer=tests.gppo.toy_scorers:sometimes_hang",
                                                   "reward.budget_s=1", "max_steps=2", "save_steps=100"])
    started = time.monotonic()
    report = run(tiny_model, demo_files[:1], str(tmp_path / "out"), config, work_dir=str(tmp_path / "work"))
    assert report["training"]["global_step"] == 2
    assert report["training"]["reward_timeouts"] > 0
    assert report["metrics"]["reward_timeouts"] == report["training"]["reward_timeouts"]
    assert time.monotonic() - started < 120


def test_prompts_without_answers_are_reported_by_file_and_line(tiny_model: str, tmp_path: Path) -> None:
    data = tmp_path / "rl.jsonl"
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)] + [{"problem": "No answer"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = load_config(GppoConfig, "tiny-math")
    with pytest.raises(GppoError, match=r"rl.jsonl:4: no_answer"):
        run(tiny_model, [str(data)], str(tmp_path / "out"), config, work_dir=str(tmp_path / "work"))
    assert not (tmp_path / "out").exists()  # nothing published
