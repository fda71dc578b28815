"""Helpers for the training-stage tests (sft, gppo)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from klear.training import checkpoints


def kill_after_checkpoint(runs: Sequence[tuple[subprocess.Popen[bytes], Path]], output: str, newer_than: int = 0,
                          timeout_s: float = 300) -> int:
    """SIGKILL a training job ((process, log) of each node or pod) as soon as a checkpoint newer than step
    `newer_than` is published under `output`; returns the newest published step."""
    deadline = time.monotonic() + timeout_s
    while not [step for step in checkpoints.published_steps(output) if step > newer_than]:
        assert all(process.poll() is None for process, _ in runs), "\n".join(log.read_text()[-3000:] for _, log in runs)
        assert time.monotonic() < deadline, "no checkpoint published in time"
        time.sleep(0.1)
    kill(runs)
    assert [process.returncode for process, _ in runs] == [-signal.SIGKILL] * len(runs)
    return checkpoints.published_steps(output)[-1]


def kill_after_first_checkpoint(process: subprocess.Popen[bytes], output: str, log: Path, timeout_s: float = 240) -> int:
    """kill_after_checkpoint of a single training process."""
    return kill_after_checkpoint([(process, log)], output, timeout_s=timeout_s)


def kill(runs: Sequence[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """SIGKILL each process and every process under it, as a pod dies (torch's elastic agent starts the training
    processes in sessions of their own: a process-group kill would leave them training)."""
    for process, _ in runs:
        with contextlib.suppress(psutil.NoSuchProcess):
            tree = psutil.Process(process.pid)
            for member in [tree, *tree.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.kill()
        process.wait()
