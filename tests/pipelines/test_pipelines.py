"""The compiled DAGs: they compile, load back, and run end to end under kfp.local with data on S3."""

import json
from pathlib import Path

import pytest
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from klear.common import storage
from klear.demo.generate import generate
from pipelines.compile import compile_all, validate
from pipelines.run_local import run_compiled


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled")
    compile_all(out)
    return out


def test_every_pipeline_compiles_and_loads_back(compiled: Path) -> None:
    names = sorted(p.stem for p in compiled.glob("*.yaml"))
    assert names == ["klear-curate", "klear-gppo-code", "klear-gppo-math", "klear-reasoner", "klear-reasoner-demo",
                     "klear-sft"]
    spec = validate(compiled / "klear-reasoner-demo.yaml")
    tasks = spec.root.dag.tasks
    # Math RL and code RL are the one gppo component twice; the graph tells them apart by display name.
    math_rl, code_rl = _task_named(spec, "math RL: GPPO"), _task_named(spec, "code RL: GPPO")
    assert set(tasks) == {"demo-data", "curate", "tiny-model", "sft", math_rl, code_rl}
    math_component, code_component = (spec.components[tasks[t].component_ref.name] for t in (math_rl, code_rl))
    assert math_component.input_definitions == code_component.input_definitions
    assert "task" in math_component.input_definitions.parameters
    assert tasks[math_rl].inputs.parameters["task"].runtime_value.constant.string_value == "math"
    assert tasks[code_rl].inputs.parameters["task"].runtime_value.constant.string_value == "code"
    assert tasks["curate"].dependent_tasks == ["demo-data"]
    # The paper's order: SFT, then math RL from the SFT model, then code RL from the math RL model.
    assert sorted(tasks[math_rl].dependent_tasks) == ["curate", "sft"]
    assert sorted(tasks[code_rl].dependent_tasks) == ["curate", math_rl]
    full = validate(compiled / "klear-reasoner.yaml")
    assert "sft" in full.root.dag.tasks
    assert _task_named(full, "math RL: GPPO") in full.root.dag.tasks[_task_named(full, "code RL: GPPO")].dependent_tasks
    # Cluster settings survive compilation: the S3 secret reaches the pod as env variables.
    text = (compiled / "klear-reasoner.yaml").read_text()
    assert "klear-s3" in text and "AWS_SECRET_ACCESS_KEY" in text


def _task_named(spec, display_prefix: str) -> str:
    """The task (by its name in the DAG) whose display name starts with `display_prefix`; exactly one."""
    found = [name for name, task in spec.root.dag.tasks.items() if task.task_info.name.startswith(display_prefix)]
    assert len(found) == 1, (display_prefix, found)
    return found[0]


def test_training_resources_are_run_time_parameters(compiled: Path) -> None:
    """The full DAG sizes each training stage from string pipeline parameters (the only kind the KFP driver
    resolves into pod resources); the CPU demo asks for no accelerator at all."""
    full = validate(compiled / "klear-reasoner.yaml")
    inputs = full.root.input_definitions.parameters
    for name in ("sft_gpus_per_node", "rl_gpus_per_node", "sft_cpu", "sft_memory", "rl_cpu", "rl_memory"):
        assert inputs[name].parameter_type == pipeline_spec_pb2.ParameterType.STRING, name
    assert inputs["sft_gpus_per_node"].default_value.string_value == "8"
    executors = full.deployment_spec.fields["executors"].struct_value.fields

    def resources(task: str) -> dict:
        executor = full.components[full.root.dag.tasks[task].component_ref.name].executor_label
        return json_format.MessageToDict(executors[executor].struct_value)["container"]["resources"]

    sft = resources("sft")
    assert sft["accelerator"]["resourceCount"] == "{{$.inputs.parameters['pipelinechannel--sft_gpus_per_node']}}"
    assert sft["resourceMemoryLimit"] == "{{$.inputs.parameters['pipelinechannel--sft_memory']}}"
    code_rl = resources(_task_named(full, "code RL: GPPO"))
    assert code_rl["accelerator"]["resourceCount"] == "{{$.inputs.parameters['pipelinechannel--rl_gpus_per_node']}}"
    assert code_rl["resourceCpuLimit"] == "{{$.inputs.parameters['pipelinechannel--rl_cpu']}}"
    # The GPU count the pod gets is the one the component launches processes for.
    sft_args = full.root.dag.tasks["sft"].inputs.parameters
    assert sft_args["gpus_per_node"].component_input_parameter == "sft_gpus_per_node"
    assert full.root.dag.tasks["sft"].retry_policy.max_retry_count == 3
    assert "dshm" in (compiled / "klear-reasoner.yaml").read_text()
    demo = (compiled / "klear-reasoner-demo.yaml").read_text()
    assert "accelerator" not in demo and "nvidia.com/gpu" not in demo


def test_invalid_spec_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelineInfo:\n  name: x\nroot:\n  dag:\n    tasks: {}\nnotAField: 1\n")
    with pytest.raises(Exception, match="notAField"):
        validate(bad)


def test_demo_pipeline_end_to_end_on_s3(compiled: Path, s3_bucket: str, tmp_path: Path) -> None:
    task = run_compiled("klear-reasoner-demo", tmp_path, {"math_count": 60, "code_count": 8,
                                                          "run_root": f"{s3_bucket}/runs"}, compiled)
    location = task.outputs["curated"].metadata["uri"]
    assert location.startswith(f"{s3_bucket}/runs/") and location.endswith("/curate")
    with storage.fetch_published(location) as (local, manifest):
        report = json.loads((local / "report.json").read_text())
        assert {"report.json", "report.md"} <= set(manifest.files)
    assert report["totals"]["read"] == 60 + 8 + 12
    assert report["totals"]["duplicate"] == 4 and report["totals"]["contaminated"] == 6
    assert report["totals"]["short_match"] == 1
    # The demo data the first step wrote is on S3 too, published.
    demo_location = location.rsplit("/", 1)[0] + "/demo-data"
    assert "math.jsonl" in storage.read_manifest(demo_location).files
    # The tiny model was fine-tuned on the curated prompts, and published next to them.
    model = task.outputs["sft_model"].metadata["uri"]
    assert model == location.rsplit("/", 1)[0] + "/sft"
    sft_report = json.loads(storage.read_bytes(model + "/report.json"))
    assert sft_report["data"]["read"] == report["totals"]["kept"]
    assert {"model.safetensors", "tokenizer.json"} <= set(storage.read_manifest(model).files)
    # Math RL then code RL, each on its kind of curated prompt, scored by the real verifiers (code in the sandbox).
    final = task.outputs["model"].metadata["uri"]
    assert final == location.rsplit("/", 1)[0] + "/gppo-code"
    math_rl = json.loads(storage.read_bytes(location.rsplit("/", 1)[0] + "/gppo-math/report.json"))
    code_rl = json.loads(storage.read_bytes(final + "/report.json"))
    assert math_rl["data"]["read"] == code_rl["data"]["read"] == report["totals"]["kept"]
    assert math_rl["data"]["kept"] + code_rl["data"]["kept"] == report["totals"]["kept"]  # each prompt is one kind
    assert math_rl["data"]["skipped"] == {"no_answer": code_rl["data"]["kept"]}
    for rl in (math_rl, code_rl):
        assert rl["training"]["global_step"] == rl["config"]["max_steps"] and rl["training"]["reward_timeouts"] == 0
        assert any("reward" in row for row in rl["history"])
    assert {"model.safetensors", "report.md"} <= set(storage.read_manifest(final).files)


def test_single_stage_rerun_from_imported_s3_sources(compiled: Path, s3_bucket: str, tmp_path: Path) -> None:
    generate(f"{s3_bucket}/sources", math_count=40, code_count=8, seed=2)
    task = run_compiled(
        "klear-curate", tmp_path,
        {"sources_uri": f"{s3_bucket}/sources", "source_files": ["math.jsonl#prompt=problem"], "preset": "tiny",
         "run_root": f"{s3_bucket}/rerun"},
        compiled,
    )
    report = json.loads(storage.read_bytes(task.output.metadata["uri"] + "/report.json"))
    assert report["totals"]["read"] == 40 + 12 and report["per_source"].keys() == {"math"}
