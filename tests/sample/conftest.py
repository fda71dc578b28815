"""Fixtures of the sample tests: prompt files, the fault-injecting server, a config for fast runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from klear.common.config import load_config
from klear.sample.config import SampleConfig
from tests.sample.fake_server import FakeServer


def write_prompts(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def fast_config(*overrides: str) -> SampleConfig:
    """The tiny preset with retries that wait milliseconds, not seconds."""
    return load_config(SampleConfig, "tiny", ["backoff_initial_s=0.01", "backoff_max_s=0.05", "request_timeout_s=2.0",
                                              *overrides])


@pytest.fixture()
def fake_server() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server
