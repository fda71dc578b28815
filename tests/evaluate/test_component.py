"""The evaluate components in a small pipeline under kfp.local (as the DAG runs on CPU): the protocol's prompts,
and scoring two imported sample outputs side by side, with the HTML, Markdown and Metrics outputs the UI shows."""

# No `from __future__ import annotations`: kfp reads the pipeline's parameter types at run time.

import json
from pathlib import Path

import pytest

from klear.common import storage
from tests.evaluate.helpers import TINY_SAMPLING, publish_samples
from tests.evaluate.test_scores import _benchmark, planted_rows


@pytest.mark.slow
def test_components_under_kfp_local(tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The klear-evaluate wiring: prompts -> the sample component (the tiny model, with the protocol's overrides)
    -> evaluate, beside an imported baseline sample output."""
    monkeypatch.setenv("KLEAR_RUN_ID", "r1")  # what the cluster takes from the pod's pipeline/runid label
    from kfp import dsl, local

    from klear.evaluate.component import evaluate, evaluation_prompts
    from klear.sample.component import sample

    sft = publish_samples(planted_rows(), str(tmp_path / "sft"), {**TINY_SAMPLING, "max_tokens": 8})
    toy = ["benchmarks.toy.kind=math", "benchmarks.toy.k=8", "only=[toy]", "sampling.max_tokens=8"]

    @dsl.pipeline(name="klear-evaluate-test")
    def evaluation(model_uri: str, sft_uri: str, benchmark: str, run_root: str) -> None:
        model = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=False)
        prompts = evaluation_prompts(benchmark_uris=[benchmark], preset="tiny", overrides=toy, run_root=run_root)
        sampled = sample(prompts=prompts.outputs["math_prompts"], model=model.output, endpoint="", served_model="",
                         api_key_env="", name="eval-math", preset="tiny", overrides=prompts.outputs["math_sample_overrides"],
                         run_root=run_root)
        baseline = dsl.importer(artifact_uri=sft_uri, artifact_class=dsl.Dataset, reimport=False)
        evaluate(samples=sampled.outputs["samples"], label="rl", baseline_samples=baseline.output, baseline_label="sft",
                 benchmark_uris=[benchmark], preset="tiny", overrides=toy, run_root=run_root)

    root = tmp_path / "kfp"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    evaluation(model_uri=tiny_model, sft_uri=sft, benchmark=_benchmark(tmp_path), run_root=str(tmp_path / "runs"))
    report = json.loads(storage.read_bytes(str(tmp_path / "runs/r1/evaluate/report.json")))
    assert report["labels"] == ["rl", "sft"]
    rl = report["benchmarks"]["toy"]
    assert (rl["k"], rl["problems"], rl["samples"]) == (8, 4, 32) and rl["mean_response_tokens"] <= 8
    assert report["settings"]["samples"]["rl"][0]["check"] == "matches the protocol"  # the overrides pinned it
    assert report["models"]["sft"]["benchmarks"]["toy"]["pass@1"] == pytest.approx(40.625)
    prompts = json.loads(storage.read_bytes(str(tmp_path / "runs/r1/evaluate-prompts-math/report.json")))
    assert prompts["groups"]["math-k8"]["prompts"] == 4
    (task,) = [p for p in root.rglob("evaluate") if (p / "executor_output.json").is_file()]
    page = (task / "report").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("data:image/png;base64,") == 4
    assert "| toy | 8 | 4 |" in (task / "summary").read_text()
    artifacts = json.loads((task / "executor_output.json").read_text())["artifacts"]
    logged = artifacts["metrics"]["artifacts"][0]["metadata"]
    assert logged["toy_pass1"] == pytest.approx(rl["pass@1"]) and logged["sft_toy_pass1"] == pytest.approx(40.625)
    assert logged["sft_toy_stderr"] == pytest.approx(22.462, abs=1e-3)


def test_the_component_compiles_with_optional_slots(tmp_path: Path) -> None:
    """Slots left unconnected compile as optional inputs: the single-model pipeline wires only `samples`."""
    from kfp import compiler, dsl

    from klear.evaluate.component import evaluate

    @dsl.pipeline(name="klear-evaluate-compile")
    def single(samples_uri: str) -> None:
        imported = dsl.importer(artifact_uri=samples_uri, artifact_class=dsl.Dataset, reimport=False)
        evaluate(samples=imported.output, benchmark_uris=[], preset="paper", overrides=[], run_root="s3://runs/x")

    target = tmp_path / "p.yaml"
    compiler.Compiler().compile(single, str(target))
    import yaml

    spec = yaml.safe_load(target.read_text())
    inputs = spec["components"]["comp-evaluate"]["inputDefinitions"]["artifacts"]
    assert not inputs["samples"].get("isOptional") and inputs["baseline_samples"]["isOptional"] is True
    outputs = spec["components"]["comp-evaluate"]["outputDefinitions"]["artifacts"]
    assert {name: o["artifactType"]["schemaTitle"] for name, o in outputs.items()} == {
        "report": "system.HTML", "summary": "system.Markdown", "metrics": "system.Metrics", "scores": "system.Dataset"}
