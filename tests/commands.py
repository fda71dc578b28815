"""Running the real `klear` command from tests, and writing the small JSONL inputs they feed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def klear(*args: str, env: Mapping[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`klear ARGS...` in a fresh interpreter (this one's environment plus `env`); output captured as text."""
    return subprocess.run([sys.executable, "-m", "klear.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> str:
    """Write `rows` as JSONL (parent folders created); returns the path as a string, as commands take it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)
