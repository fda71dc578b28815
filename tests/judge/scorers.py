"""Scorers for judge tests, loaded by the judge's workers as "tests.judge.scorers:NAME" (the pool passes the
caller's sys.path on). Each wraps the real scorer and misbehaves on a marker in the task."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

from klear.judge.scoring import score_task
from klear.verifiers.config import VerifierConfig

LOG_ENV = "KLEAR_TEST_SCORE_LOG"


def _log(task: dict[str, Any]) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(f"{task.get('answer') or task.get('problem_id')}\n")


def counting(task: dict[str, Any], verifier: VerifierConfig) -> dict[str, Any]:
    """The real scorer; each call appends the judged answer to $KLEAR_TEST_SCORE_LOG."""
    _log(task)
    return score_task(task, verifier)


def hostile(task: dict[str, Any], verifier: VerifierConfig) -> dict[str, Any]:
    """Math answers "CRASH": the worker dies; "HANG": the scorer never returns; "SPAWN": starts a child process,
    then never returns (both logged first); "KILL": kills the judge process (a crashed stage); anything else:
    counted and scored for real."""
    answer = task.get("answer")
    if answer == "CRASH":
        os._exit(3)
    if answer in ("HANG", "SPAWN"):
        if answer == "SPAWN":
            subprocess.Popen(["sleep", "600"])
        _log(task)
        while True:
            time.sleep(60)
    if answer == "KILL":
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(1)
    return counting(task, verifier)


def broken(task: dict[str, Any], verifier: VerifierConfig) -> dict[str, Any]:
    """A scorer that fails on every task, as one with a bad import or setting does."""
    raise RuntimeError("scorer misconfigured: no such reference column")
