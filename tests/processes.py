"""Process checks the worker and reward tests share."""

from __future__ import annotations

import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def gone_soon(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)
