"""GPPO's figures under one naming scheme, and validation during RL: the numbers (and the very samples) it logs for
the last step equal a separate `klear evaluate --model` of the published model under the same protocol."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from klear.cli import main
from klear.common import tracking
from klear.common.config import load_config
from klear.demo.tasks import benchmark_items
from klear.gppo.config import GppoConfig
from klear.gppo.metrics import gradient_kept_fraction
from klear.gppo.stage import run
from klear.gppo.validation import due, val_scores
from tests.deploy import katib

VAL = ["val_config=demo", "val_overrides=[sampling.max_tokens=24]"]


def test_gradient_kept_fraction_and_schedule() -> None:
    assert gradient_kept_fraction("gppo", 0.1, 0.05) == pytest.approx(0.15)
    assert gradient_kept_fraction("gppo", 0.1, 0.05, beta1=0.0) == pytest.approx(0.05)
    assert gradient_kept_fraction("ppo_clip", 0.1, 0.05) == 0.0
    assert [s for s in range(11) if due(s, 4, 10)] == [0, 4, 8, 10]
    assert [s for s in range(5) if due(s, 0, 4)] == [0, 4]
    report = {"models": {"model": {"benchmarks": {"a": {"pass@1": 50.0, "stderr": 5.0}, "b": {"pass@1": 30.0}}}}}
    assert val_scores(report) == {"val/a/pass@1": 50.0, "val/a/stderr": 5.0, "val/b/pass@1": 30.0, "val/pass@1": 40.0}


def _samples(folder: Path) -> list[tuple[str, int, str]]:
    rows = [r for f in sorted((folder / "math-k4").rglob("*.parquet")) for r in pq.read_table(f).to_pylist() if "response" in r]
    assert len(rows) == 16  # 4 problems x k 4
    return sorted((r["id"], r["sample"], r["response"]) for r in rows)


def test_validation_equals_a_separate_evaluation(tiny_model: str, demo_files: list[str], tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps(item) + "\n" for item in benchmark_items(4)))
    caplog.set_level(logging.INFO)
    config = load_config(GppoConfig, "tiny-math", ["max_steps=2", "save_steps=2", f"val_data=[{bench}]", "val_every=2",
                                                   "progress_seconds=0.01", *VAL])
    output, work = tmp_path / "out", tmp_path / "work"
    report = run(tiny_model, demo_files[:1], str(output), config, work_dir=str(work))

    validation = report["validation"]
    assert [row["step"] for row in validation] == [0.0, 2.0]
    assert all(row["val/seconds"] > 0 and "val/demo/pass@1" in row for row in validation)
    # This log as Katib's StdOut collector reads it (default filter): each validation's score, the last one the
    # trial's value under the chart's `latest` strategy, and every training row's reward.
    objective, reward = tracking.katib_name("val/pass@1"), tracking.katib_name("reward/mean")
    katib_logs = katib.parse_text_log(capsys.readouterr().err, [objective, reward])
    assert [float(log.value) for log in katib_logs if log.name == objective] == [row["val/pass@1"] for row in validation]
    assert float(katib.trial_value(katib_logs, objective, "latest")) == validation[-1]["val/pass@1"]

    # The same model, evaluated on its own, under the same protocol.
    separate = tmp_path / "eval"
    assert main(["evaluate", "--model", str(output), "--benchmark", str(bench), "--output", str(separate),
                 "--config", "demo", "--set", "sampling.max_tokens=24"]) == 0
    evaluated = json.loads((separate / "report.json").read_text())
    assert val_scores(evaluated) == {k: v for k, v in validation[-1].items() if k not in ("step", "val/seconds")}
    assert _samples(work / "validation" / "step-2" / "samples") == _samples(Path(f"{separate}.samples"))

    # Every figure the trackers and the curves get is in the scheme, with GPPO's own ones among them.
    rows = [json.loads(line) for line in (output / "logs" / tracking.HISTORY_FILE).read_text().splitlines()]
    names = {name for row in rows for name in row if name != "step"}
    assert all(name.startswith(tracking.SCHEME_PREFIXES) for name in names), names
    assert {"reward/mean", "reward/math/mean", "reward/accuracy", "reward/worker_s", "reward/timeouts",
            "rollout/response_length_mean", "rollout/response_length_max", "rollout/truncated_frac",
            "rollout/zero_advantage_groups_frac", "rollout/tokens_per_second", "train/clip_frac_low",
            "train/clip_frac_high", "train/gradient_kept_frac", "train/entropy", "train/kl_old_policy",
            "val/demo/pass@1", "val/pass@1"} <= names
    assert [r["step"] for r in rows if "val/pass@1" in r] == [0.0, 2.0]
    assert [float(log.value) for log in katib_logs if log.name == reward] == [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert "val" in (output / "logs" / tracking.CURVES_FILE).read_text()
    assert any(r.getMessage().startswith("gppo: step 2/2 (100%)") for r in caplog.records)
