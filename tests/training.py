"""Helpers for the training-stage tests (sft, gppo)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from klear.training import checkpoints


def kill_after_first_checkpoint(process: subprocess.Popen, output: str, log: Path, timeout_s: float = 240) -> int:
    """SIGKILL a training run as soon as a checkpoint is published under `output`; returns the newest published step."""
    deadline = time.monotonic() + timeout_s
    while not checkpoints.published_steps(output):
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint published in time"
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    return checkpoints.published_steps(output)[-1]
