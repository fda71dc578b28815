"""Evaluate fed by the DAG's judge step in front of it: the planted samples judged in 2 slices and merged under
evaluate's own judge settings and problems, then evaluated, judge nothing anew and score as evaluate judging the
raw samples itself; a judge output of other settings is judged again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klear.evaluate.samples import parse_sample_specs
from klear.evaluate.stage import run
from klear.judge.stage import problems_of, stage_judge_config
from klear.judge.stage import run as judge
from tests.evaluate.test_scores import TOY, _benchmark, _config


def _judged_in_slices(samples: str, output: str, benchmark: str, overrides: list[str]) -> None:
    """What the DAG's `_judge(..., config_of="evaluate")` runs: each slice, then the merge."""
    config = stage_judge_config("evaluate", "tiny", overrides)
    given = problems_of("evaluate", "tiny", overrides, [benchmark])
    for part in ("0/2", "1/2"):
        judge(samples, output, config, slice_spec=part, stage_problems=given)
    judge(samples, output, config, merge=True, stage_problems=given)


def test_evaluate_takes_the_verdicts_of_judge_slices_under_its_own_settings(planted: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    tmp = planted["tmp"]
    benchmark = _benchmark(tmp)
    judged = str(tmp_path / "judge-eval-sft-math")
    # The rows' records hold a wrong gold answer: verdicts match evaluate's only if judged against its benchmark.
    _judged_in_slices(str(tmp / "sft-samples"), judged, benchmark, TOY)
    itself = run(parse_sample_specs([f"sft={tmp / 'sft-samples'}"]), str(tmp_path / "itself"), _config(), [benchmark])
    report = run(parse_sample_specs([f"sft={judged}"]), str(tmp_path / "eval"), _config(), [benchmark])
    assert itself["judge"]["judged"] == 32 and itself["judge"]["reused"] == 0
    assert report["judge"]["judged"] == 0 and report["judge"]["reused"] == 32
    assert report["benchmarks"] == itself["benchmarks"] and report["benchmarks"]["toy"]["correct"] == 13
    # Other judge settings than the judge step's: its verdicts are not evaluate's, so evaluate judges them again.
    other = run(parse_sample_specs([f"sft={judged}"]), str(tmp_path / "other"),
                _config("judge.verifier.math_timeout_s=4"), [benchmark])
    assert other["judge"]["judged"] == 32 and other["judge"]["reused"] == 0
    assert other["benchmarks"]["toy"]["pass@1"] == itself["benchmarks"]["toy"]["pass@1"]


def test_the_scores_reach_the_sampled_models_card_through_the_judge_step(tmp_path: Path) -> None:
    """The DAG's evaluate reads judged rows: the model its samples came from still gets the scores in its card."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from klear.common import lineage, model_card, storage
    from tests.evaluate.helpers import SAMPLE_SCHEMA, TINY_SAMPLING
    from tests.evaluate.test_scores import planted_rows

    model = str(tmp_path / "sft-model")
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"weights")
    storage.publish_dir(weights, model, meta={"stage": "sft", "inputs": {}, "lineage": lineage.record([], None)})
    rows = tmp_path / "rows"
    (rows / "samples").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(planted_rows(), schema=SAMPLE_SCHEMA), rows / "samples" / "part-00000.parquet")
    samples = str(tmp_path / "sample-eval-sft-math")
    storage.publish_dir(rows, samples, meta={"stage": "sample", "inputs": {"model": [model]}, "settings": {
        "format": 1, "identity": {"engine": "model", "model": model}, "sampling": TINY_SAMPLING},
        "lineage": lineage.RunLineage([model], None).record()})  # the run's inputs: the model
    benchmark = _benchmark(tmp_path)
    judged = str(tmp_path / "judge-eval-sft-math")
    _judged_in_slices(samples, judged, benchmark, TOY)
    report = run(parse_sample_specs([f"sft={judged}"]), str(tmp_path / "eval"), _config(), [benchmark])
    assert report["judge"]["judged"] == 0
    header = yaml.safe_load((Path(model) / model_card.CARD_NAME).read_text().split("---\n")[1])
    (result,) = header["model-index"][0]["results"]
    assert result["metrics"][0]["value"] == round(report["benchmarks"]["toy"]["pass@1"], 2)
