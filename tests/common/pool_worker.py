"""A worker module for WorkerPool tests that does what its item asks: answer, hang with a child, raise, exit.

Started as `python -m tests.common.pool_worker` (the pool passes the caller's sys.path on as PYTHONPATH).
Setup payload: a dict; {"fail": why} fails the start, {"sleep": s} delays it, anything else is echoed by "setup".
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klear.common.workers import serve


def make_handler(setup: dict) -> Callable[[dict], Any]:
    if "fail" in setup:
        raise ValueError(setup["fail"])
    time.sleep(setup.get("sleep", 0.0))

    def handle(item: dict) -> Any:
        action = item["action"]
        if action == "value":  # tells which worker answered
            time.sleep(item.get("sleep", 0.0))
            return item["value"], os.getpid()
        if action == "env":
            return dict(os.environ)
        if action == "setup":
            time.sleep(item.get("sleep", 0.0))
            return setup
        if action == "hang":  # records its own pid and a sleeping child's, then never answers
            child = subprocess.Popen(["sleep", "600"])
            Path(item["pid_file"]).write_text(f"{os.getpid()} {child.pid}")
            while True:
                time.sleep(60)
        if action == "raise":
            raise ValueError("handler bug")
        if action == "exit":
            os._exit(7)
        if action == "print":  # stray output must not reach the protocol pipe
            print("noise on stdout " * 100, flush=True)
            return os.readlink("/proc/self/fd/0")
        if action == "unpicklable":
            return lambda: None
        raise ValueError(f"unknown action {action!r}")

    return handle


if __name__ == "__main__":
    serve(make_handler)
