"""Shared, built once per session: the tiny model, demo data, and one uninterrupted tiny-preset SFT run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from klear.common.config import load_config
from klear.demo.generate import generate
from klear.sft.config import SftConfig
from klear.tiny_model.build import build

DEMO_FILES = ("math.jsonl", "code.jsonl")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("tiny-model") / "model"
    build(str(out))
    return str(out)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "data"
    generate(str(out), math_count=120, code_count=8, seed=0)
    return out


@pytest.fixture(scope="session")
def demo_files(demo: Path) -> list[str]:
    return [str(demo / name) for name in DEMO_FILES]


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
