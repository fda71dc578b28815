"""Evaluate fed by the DAG's judge step in front of it: the planted samples judged in 2 slices and merged with the
judge settings and problems evaluate hands over (its `judge` section, its benchmarks as `klear evaluate-problems`
publishes them), then evaluated, judge nothing anew and score as evaluate judging the raw samples itself; a judge
output of other settings is judged again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from klear.common.config import ConfigError, load_config
from klear.evaluate.benchmarks import load_benchmarks
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.samples import parse_sample_specs
from klear.evaluate.stage import judge_problem_rows, run, write_problems
from klear.judge.config import judge_config, settings_json
from klear.judge.stage import run as judge
from tests.commands import klear
from tests.evaluate.helpers import write_jsonl
from tests.evaluate.test_code import LCB, lcb_rows
from tests.evaluate.test_scores import TOY, _benchmark, _config


def _judged_in_slices(samples: str, output: str, benchmark: str, overrides: list[str], command: bool = False) -> None:
    """What the DAG runs: evaluate's problems step (`command`: as `klear evaluate-problems`), then each judge slice
    and the merge with what it handed over."""
    problems = f"{output}.problems"
    config = load_config(EvaluateConfig, "tiny", overrides)
    if command:
        done = klear("evaluate-problems", "--output", problems, "--benchmark", benchmark, "--config", "tiny",
                     *(arg for o in overrides for arg in ("--set", o)))
        assert done.returncode == 0, done.stderr
    else:
        write_problems(problems, config, [benchmark])
    handed = judge_config(settings_json(config.judge))
    for part in ("0/2", "1/2"):
        judge(samples, output, handed, problems, slice_spec=part)
    judge(samples, output, handed, problems, merge=True)


def test_the_problems_evaluate_hands_over_read_back_as_its_own(tmp_path: Path) -> None:
    """Math and LiveCodeBench problems (stdin and functional) read back with evaluate's references; judged as
    another task, a problem's reference would differ: refused, naming it."""
    both = [*TOY[:-1], *LCB[1:], "only=[toy,livecodebench_v5,livecodebench_v6]"]  # without their own `only`
    config = load_config(EvaluateConfig, "tiny", both)
    bench = load_benchmarks([write_jsonl(lcb_rows(), tmp_path / "lcb.jsonl"), _benchmark(tmp_path)], config)
    rows = judge_problem_rows(bench, "auto")
    assert {row["id"] for row in rows} == set(bench.problems) and {"lc-add", "t1"} <= set(bench.problems)
    with pytest.raises(ConfigError, match="'abc100_a'.*judge.task=auto"):
        judge_problem_rows(bench, "math")


def test_evaluate_takes_the_verdicts_of_judge_slices_under_its_own_settings(planted: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    tmp = planted["tmp"]
    benchmark = _benchmark(tmp)
    judged = str(tmp_path / "judge-eval-sft-math")
    # The rows' records hold a wrong gold answer: verdicts match evaluate's only if judged against its benchmark.
    _judged_in_slices(str(tmp / "sft-samples"), judged, benchmark, TOY, command=True)
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
