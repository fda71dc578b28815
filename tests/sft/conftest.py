"""Shared, built once per session: one uninterrupted tiny-preset SFT run (tiny model and demo data: tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from klear.common.config import load_config
from klear.sft.config import SftConfig


@pytest.fixture(scope="session")
def tiny_config() -> SftConfig:
    return load_config(SftConfig, "tiny")


@pytest.fixture(scope="session")
def reference_run(tiny_model: str, demo_files: list[str], tiny_config: SftConfig,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny preset end to end, uninterrupted, on local storage: the baseline other tests compare with."""
    from klear.sft.stage import run

    root = tmp_path_factory.mktemp("reference")
    report = run(tiny_model, demo_files, str(root / "out"), tiny_config, work_dir=str(root / "work"))
    return {"report": report, "output": root / "out"}
