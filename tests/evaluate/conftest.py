"""One planted evaluation per session, shared by the score tests and the report tests."""

from __future__ import annotations

from typing import Any

import pytest

from klear.evaluate.samples import parse_sample_specs
from klear.evaluate.stage import run
from tests.evaluate.helpers import publish_samples, write_jsonl
from tests.evaluate.test_scores import GOLD, _benchmark, _config, _right, planted_rows


@pytest.fixture(scope="session")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Labels sft (a published sample output, planted 8/4/1/0 of 8) and rl (a plain JSONL file, all correct)."""
    tmp = tmp_path_factory.mktemp("planted")
    sft = publish_samples(planted_rows(), str(tmp / "sft-samples"))
    rl = write_jsonl([_right(pid, k) for pid in GOLD for k in range(8)], tmp / "rl.jsonl")
    out = tmp / "eval"
    report = run(parse_sample_specs([f"sft={sft}", f"rl={rl}"]), str(out), _config(), [_benchmark(tmp)])
    return {"report": report, "out": out, "tmp": tmp}
