"""A scorer for RewardPool tests that does what its task asks: answer, hang, spawn a child, crash, raise.

Workers import it as "tests.gppo.hostile_scorers:act" (the pool passes the caller's sys.path on).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from klear.gppo.config import RewardConfig
from klear.gppo.rewards import RewardOutcome
from klear.verifiers.config import VerifierConfig


def _hang() -> None:
    while True:
        time.sleep(60)


def act(task: dict, cfg: RewardConfig, verifier: VerifierConfig) -> RewardOutcome:
    action = task["action"]
    if action == "hang":  # records this worker's pid first
        Path(task["pid_file"]).write_text(str(os.getpid()))
        _hang()
    if action == "spawn_and_hang":  # records the child's pid
        child = subprocess.Popen(["sleep", "600"])
        Path(task["pid_file"]).write_text(str(child.pid))
        _hang()
    if action == "crash":
        os._exit(3)
    if action == "raise":
        raise ValueError("scorer bug")
    if action == "env":
        return RewardOutcome(0.0, False, True, False, 0.0, " ".join(sorted(os.environ)))
    time.sleep(task.get("sleep", 0.0))  # "value": score `value`, tell which worker did
    return RewardOutcome(task["value"], False, True, False, task["value"], f"pid {os.getpid()}")
