"""Checkpoints by time as well as by steps (`save_minutes`): a preempted run loses the minutes since the last one."""

from __future__ import annotations

import json
from pathlib import Path

from klear.training.checkpoints import save_due
from tests.sft.test_refusals import CHAT, _jsonl, _sft


def test_save_due_counts_minutes_since_the_last_checkpoint() -> None:
    assert not save_due(59.0, 1.0) and save_due(60.0, 1.0)
    assert not save_due(10 ** 9, 0.0)  # 0: by save_steps only


def test_a_real_sft_run_checkpoints_by_time_between_step_checkpoints(tiny_model: str, tmp_path: Path) -> None:
    """save_steps far past the run's steps: without save_minutes only the last step's checkpoint is published; with
    a save due after a few milliseconds, one after every optimizer step, every rank agreeing (one process here; the 2-process
    DDP launch test runs it on gloo)."""
    data = _jsonl(tmp_path / "a.jsonl", [CHAT] * 8)
    steps_only = _sft(tiny_model, data, tmp_path / "steps", "num_epochs=2", "save_steps=1000", "save_minutes=0")
    assert steps_only.returncode == 0, steps_only.stderr[-3000:]
    report = json.loads((tmp_path / "steps" / "report.json").read_text())
    assert report["training"]["checkpoints_published"] == [report["training"]["global_step"]]

    timed = _sft(tiny_model, data, tmp_path / "timed", "num_epochs=2", "save_steps=1000", "save_minutes=0.00001",
                 "keep_checkpoints=100")
    assert timed.returncode == 0, timed.stderr[-3000:]
    report = json.loads((tmp_path / "timed" / "report.json").read_text())
    steps = report["training"]["global_step"]
    assert steps >= 2 and report["training"]["checkpoints_published"] == list(range(1, steps + 1))
