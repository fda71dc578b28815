"""The shipped AIME24/AIME25/HMMT25 sets, through the `klear evaluate` command: a hand-made correct and a wrong
response for every item; and the prompts the protocol samples."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from klear import testsets
from klear.cli import main
from klear.common.config import load_config
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.stage import sample_overrides
from klear.sample.config import SampleConfig
from tests.evaluate.helpers import boxed, publish_samples, row

SHIPPED = ("aime24", "aime25", "hmmt_feb_2025")
K2 = [f"benchmarks.{name}.k=2" for name in SHIPPED] + [f"only=[{','.join(SHIPPED)}]"]


def _items() -> list[dict]:
    return [json.loads(line) for path in testsets.all_paths() for line in path.read_text().splitlines() if line.strip()]


def _wrong(answer: str) -> str:
    return str(int(answer) + 1) if answer.lstrip("-").isdigit() else "7"  # no shipped non-integer answer is 7


def test_every_shipped_item_right_and_wrong(tmp_path: Path) -> None:
    items = _items()
    assert len(items) == 90
    rows = [row(item["id"], 0, boxed(item["answer"])) for item in items]
    rows += [row(item["id"], 1, boxed(_wrong(item["answer"]))) for item in items]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    out = tmp_path / "eval"
    args = ["evaluate", "--samples", samples, "--output", str(out), "--config", "tiny"]
    assert main([*args, *[a for o in K2 for a in ("--set", o)]]) == 0
    report = json.loads((out / "report.json").read_text())
    for name in SHIPPED:
        block = report["benchmarks"][name]
        assert (block["problems"], block["correct"], block["pass@1"], block["stderr"], block["pass@k"]["2"]) == \
            (30, 30, 50.0, 0.0, 100.0), name
    assert report["paper"]["paper RL 32K"]["aime24"] == 83.2
    assert any("shipped AIME24, AIME25 and HMMT Feb 2025" in note for note in report["notes"])
    judged = pq.read_table(out / "judged.parquet").to_pylist()
    wrongly = [(r["id"], r["sample"], r["verdict"]) for r in judged if r["correct"] != (r["sample"] == 0)]
    assert not wrongly, wrongly


def test_evaluate_prompts(tmp_path: Path) -> None:
    out = tmp_path / "prompts"
    assert main(["evaluate-prompts", "--output", str(out), "--config", "paper"]) == 0
    listing = json.loads((out / "report.json").read_text())["groups"]
    overrides = listing["math-k64"].pop("sample_overrides")
    assert listing == {"math-k64": {"file": "math-k64.jsonl", "config": "sampling-math-k64.yaml", "kind": "math",
                                    "n": 64, "prompts": 90}}
    # The overrides give the sample stage the protocol whatever its own preset (its tiny one: n 4, 32 tokens).
    protocol = load_config(EvaluateConfig, "paper").sampling_for(64)
    pinned = load_config(SampleConfig, "tiny", overrides)
    assert pinned.sampling_settings() == protocol.sampling_settings() and pinned.n == 64
    yarn = load_config(EvaluateConfig, "paper-64k").sampling_for(8)
    pinned = load_config(SampleConfig, "tiny", sample_overrides(yarn))
    assert pinned.engine_kwargs["hf_overrides"]["rope_parameters"]["factor"] == 2.5 and pinned.max_tokens == 65536
    prompts = [json.loads(line) for line in (out / "math-k64.jsonl").read_text().splitlines()]
    first = _items()[0]
    # the paper preset asks the raw problem, as the released benchmark rows and RL prompts do
    assert prompts[0] == {"id": first["id"], "benchmark": first["benchmark"], "prompt": first["problem"]}
    sampling = (out / "sampling-math-k64.yaml").read_text()
    for line in ("n: 64", "temperature: 0.6", "top_p: 0.95", "max_tokens: 32768"):
        assert line in sampling.splitlines(), line
