"""The math prompt template and sampling extras as preset values, the 32K preset's extras without a YaRN length,
and the per-benchmark rules (judging mode, prompt, sampling, execution) the report states beside Table 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from klear.common.config import ConfigError, load_config
from klear.evaluate.config import MATH_TEMPLATES, EvaluateConfig
from klear.evaluate.paper import TABLE1
from klear.evaluate.report import _protocol_table
from klear.evaluate.stage import benchmark_rules, run
from tests.evaluate.helpers import boxed, publish_samples, respond, row, write_jsonl


def test_math_prompt_is_a_named_preset_value() -> None:
    paper = load_config(EvaluateConfig, "paper")
    assert (paper.math_prompt, paper.math_template) == ("raw", "{problem}")  # the form RL trained on
    instructed = load_config(EvaluateConfig, "paper", ["math_template=instructed"])
    assert instructed.math_prompt == "instructed" and instructed.math_template == MATH_TEMPLATES["instructed"]
    assert instructed.math_template.format(problem="P") == \
        "P\nPlease reason step by step, and put your final answer within \\boxed{}."
    custom = load_config(EvaluateConfig, "paper", ['math_template="Q: {problem}"'])
    assert custom.math_prompt == "custom"


def test_sampling_extras_presets() -> None:
    paper = load_config(EvaluateConfig, "paper").sampling_for(64)
    assert (paper.temperature, paper.top_p, paper.top_k, paper.repetition_penalty, paper.max_tokens) == (
        0.6, 0.95, 0, 1.0, 32768)
    release = load_config(EvaluateConfig, "release")
    sampled = release.sampling_for(64)
    assert release.sampling_extras == "release" and release.judge.verifier.math_mode == "official"
    assert release.judge.verifier.code_rules == "runner"  # LiveCodeBench as its own lcb_runner judges
    assert (sampled.top_k, sampled.repetition_penalty, sampled.seed, sampled.max_tokens, sampled.max_model_len) == (
        20, 1.05, 0, 65536, 81920)
    assert sampled.engine_kwargs["hf_overrides"]["rope_parameters"]["factor"] == 2.5


def test_extras_on_the_32k_preset_keep_its_length() -> None:
    """The bug: extras on the 32K preset forced max_model_len 81,920 without YaRN, which vLLM refuses."""
    extras = load_config(EvaluateConfig, "paper", ["official_extras.enabled=true"]).sampling_for(8)
    assert (extras.top_k, extras.repetition_penalty, extras.max_model_len) == (20, 1.05, 0)
    with pytest.raises(ConfigError, match="official_extras.max_model_len 81920 without rope scaling"):
        load_config(EvaluateConfig, "paper", ["official_extras.enabled=true", "official_extras.max_model_len=81920"])
    yarn = load_config(EvaluateConfig, "paper-64k", ["official_extras.enabled=true", "official_extras.max_model_len=81920"])
    assert yarn.sampling_for(8).max_model_len == 81920


def test_report_states_the_rules_per_benchmark_beside_table1() -> None:
    config = load_config(EvaluateConfig, "release")
    math, code = benchmark_rules(config, "math"), benchmark_rules(config, "code")
    assert (math["judging"], math["prompt"], math["execution"]) == ("official", "raw", None)
    assert math["sampling_extras"].startswith("release extras (top_k 20, repetition_penalty 1.05")
    assert code["execution"] and code["prompt"] == "LiveCodeBench"
    report = {"paper": TABLE1, "settings": {"protocol": {
        "aime24": {"title": "AIME 2024", "kind": "math", "k": 64, "window": None, "problems": 30, **math}}}}
    headers, [row] = _protocol_table(report)
    cells = dict(zip(headers, row))
    assert (cells["judging"], cells["prompt"], cells["Table 1: paper RL 32K"]) == ("official", "raw", "83.2")
    assert cells["execution"] == "-"


def test_evaluate_report_shows_math_modes_side_by_side(tmp_path: Path) -> None:
    """report_modes: the same chosen samples judged strict and official, pass@1 per benchmark beside Table 1."""
    gold = {"t1": "12", "t2": "7"}
    bench = write_jsonl([{"id": pid, "benchmark": "toy", "problem": f"Compute {pid}.", "answer": a}
                         for pid, a in gold.items()], tmp_path / "toy.jsonl")
    rows = [row("t1", 0, boxed("12")), row("t1", 1, "<think>\nso \\boxed{12}, check", "length"),
            row("t2", 0, respond("The answer is 7.")), row("t2", 1, boxed("8"))]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    config = load_config(EvaluateConfig, "tiny", ["benchmarks.toy.kind=math", "benchmarks.toy.k=2", "only=[toy]",
                                                  "benchmarks.toy.title=Toy", "judge.report_modes=[strict,official]",
                                                  "settings_check=warn"])
    report = run([samples], str(tmp_path / "out"), config, [bench])
    assert report["benchmarks"]["toy"]["pass@1"] == pytest.approx(25.0)  # strict: 1 of 4
    assert report["math_modes"]["mode"] == "strict"
    assert report["math_modes"]["other"]["model"]["official"]["toy"]["pass@1"] == pytest.approx(75.0)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Math judging modes" in md and "| model | Toy | 25.0 ± 25.0 | 75.0 ± 25.0 |" in md
    assert "<h2>Math judging modes</h2>" in (tmp_path / "out" / "report.html").read_text()
