"""`klear sample --set backend=records --set max_prompts=N`: only the prompts sampled must ship a response."""

from __future__ import annotations

from pathlib import Path

import pytest

from klear.cli import main
from klear.sample.stage import iter_rows
from tests.sample.conftest import write_prompts


def test_max_prompts_requires_responses_of_the_sampled_prompts_only(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    traced = [{"id": f"t{i}", "prompt": f"q{i}", "response": f"<think>\nr{i}\n</think>\n\na{i}"} for i in range(3)]
    bare = [{"id": f"b{i}", "prompt": f"bare {i}"} for i in range(2)]  # no trace: beyond max_prompts
    prompts = write_prompts(tmp_path / "traces.jsonl", traced + bare)
    command = ["sample", "--prompts", prompts, "--output", str(tmp_path / "out"), "--config", "tiny",
               "--set", "backend=records", "--set", "n=1"]
    assert main([*command, "--set", "max_prompts=3"]) == 0
    assert sorted(row["id"] for row in iter_rows(str(tmp_path / "out"))) == ["t0", "t1", "t2"]
    # One prompt more reaches a row without a response: refused, naming its line.
    assert main([*command[:4], str(tmp_path / "out4"), *command[5:], "--set", "max_prompts=4"]) == 2
    assert "traces.jsonl:4: backend=records needs a response" in capsys.readouterr().err
