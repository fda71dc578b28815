"""`klear evaluate --model`: sampling through klear.sample (the tiny model on CPU, transformers), then scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klear.cli import main


@pytest.mark.slow
def test_model_is_sampled_then_scored(tiny_model: str, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    overrides = ["only=[aime24]", "benchmarks.aime24.k=2", "sampling.max_tokens=16"]
    assert main(["evaluate", "--model", f"tiny={tiny_model}", "--output", str(out), "--config", "tiny",
                 *[a for o in overrides for a in ("--set", o)]]) == 0
    report = json.loads((out / "report.json").read_text())
    block = report["models"]["tiny"]["benchmarks"]["aime24"]
    assert (block["k"], block["problems"], block["samples"]) == (2, 30, 60)
    assert block["mean_response_tokens"] is not None and block["mean_response_tokens"] <= 16
    (source,) = report["settings"]["samples"]["tiny"]
    assert source["uri"] == f"{out}.samples/math-k2" and source["check"] == "matches the protocol"
    assert source["sampling"]["max_tokens"] == 16 and source["sampling"]["temperature"] == 0.6
    assert report["models"]["tiny"]["not_sampled"] == []
