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


# --------------------------------------------------------------------------- which stages a test must cover, from
# the registry (klear.cli STAGES and COMMANDS) and the stages' code, so a new stage cannot be left out of a test

_PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "components"
# The contract's readers of sample rows: a stage that imports one reads sample rows (klear.common.sample_rows).
SAMPLE_ROW_READERS = {"klear.common.sample_rows": {"iter_sample_tables", "file_tables"}, "klear.judge.io": {"iter_judged"}}


def _stage_module(command: str) -> Path:
    from klear.cli import COMMANDS

    return _PACKAGE_ROOT / (COMMANDS[command].replace(".", "/") + ".py")


def _stages_on(skeleton: str) -> list[str]:
    """The registry's stages whose command's module builds its STAGE on `skeleton` (`STAGE = <skeleton>(...)`), in the
    recipe's order."""
    from klear.cli import STAGES

    return [name for name in STAGES
            if any(line.startswith(f"STAGE = {skeleton}(") for line in _stage_module(name).read_text().splitlines())]


def data_stages() -> list[str]:
    """The stages built on `klear.common.data_stage.DataStage`: the ones a real command runs in seconds on a few JSONL
    rows."""
    return _stages_on("DataStage")


def training_stages() -> list[str]:
    """The stages built on `klear.training.stage.TrainingStage`: they publish a trained model and its report."""
    return _stages_on("TrainingStage")


def sample_row_readers() -> list[str]:
    """The registry's stages whose package imports a reader of sample rows (SAMPLE_ROW_READERS), in the recipe's
    order."""
    import ast

    from klear.cli import STAGES

    def reads(package: Path) -> bool:
        for module in package.rglob("*.py"):
            for node in ast.walk(ast.parse(module.read_text())):
                if isinstance(node, ast.ImportFrom) and {a.name for a in node.names} & SAMPLE_ROW_READERS.get(
                        node.module or "", set()):
                    return True
        return False

    return [name for name in STAGES if reads(_stage_module(name).parent)]
