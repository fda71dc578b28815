"""The compiled recipe and the chart's values the plan tests read, compiled afresh once per session (a compiled file
left from an earlier checkout would carry its parameters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPILED = ROOT / "pipelines" / "compiled" / "klear-reasoner.yaml"
CHART = ROOT / "charts" / "klear-reasoner" / "values.yaml"


@pytest.fixture(scope="session", autouse=True)
def compiled() -> None:
    subprocess.run([sys.executable, "-m", "pipelines.compile"], cwd=ROOT, check=True, timeout=300,
                   capture_output=True)
