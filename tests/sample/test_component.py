"""The sample KFP component: compiled, then run as a single-step pipeline under kfp.local against the fake
endpoint, with the output under run_root; its docstring documents every parameter (the UI shows them).
No `from __future__ import annotations` here: KFP reads the pipeline function's annotations as types."""


import inspect
import json
from pathlib import Path

import pytest

from klear.common import storage
from tests.sample.conftest import write_prompts
from tests.sample.fake_server import FakeServer


def test_every_parameter_is_documented() -> None:
    from klear.sample.component import sample

    function = sample.python_func
    doc = inspect.getdoc(function) or ""
    missing = [name for name in inspect.signature(function).parameters if f"\n    {name}: " not in doc]
    assert not missing, f"parameters without an Args: entry: {missing}"


@pytest.mark.filterwarnings("ignore:.*custom or non-Python base image.*")
def test_endpoint_and_model_steps_under_kfp_local(tiny_model: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KLEAR_RUN_ID", "run-1")  # what the cluster takes from the pod's pipeline/runid label
    from kfp import compiler, components, dsl, local

    from klear.sample.component import sample

    @dsl.pipeline(name="klear-sample-test")
    def pipeline(prompts_uri: str, model_uri: str, endpoint: str, run_root: str) -> None:
        prompts = dsl.importer(artifact_uri=prompts_uri, artifact_class=dsl.Dataset, reimport=False)
        model = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=False)
        sample(prompts=prompts.output, endpoint=endpoint, served_model="fake-teacher", api_key_env="", name="teacher",
               preset="tiny", overrides=["n=2"], run_root=run_root)
        sample(prompts=prompts.output, model=model.output, endpoint="", served_model="", api_key_env="",
               name="reference", preset="tiny", overrides=["n=1", "max_tokens=4"], run_root=run_root)

    compiled = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(pipeline, str(compiled))
    prompts = write_prompts(tmp_path / "prompts.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(3)])
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)
    with FakeServer() as server:
        components.load_component_from_file(str(compiled))(
            prompts_uri=prompts, model_uri=tiny_model, endpoint=server.url, run_root=str(tmp_path / "runs"))
        assert server.requests == 6
    location = str(tmp_path / "runs" / "run-1" / "sample-teacher")
    manifest = storage.read_manifest(location)
    assert "samples/part-00000.parquet" in manifest.files and manifest.meta["rows"] == 6
    report = json.loads((Path(location) / "report.json").read_text())
    assert report["units"]["rows"] == 6 and report["config"]["n"] == 2 and report["backend"]["backend"] == "openai"
    reference = json.loads((tmp_path / "runs" / "run-1" / "sample-reference" / "report.json").read_text())
    assert reference["units"]["rows"] == 3 and reference["backend"]["backend"] == "hf"
