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


STAGE_PIPELINES = ["klear-curate", "klear-evaluate", "klear-evaluate-samples", "klear-gppo-code", "klear-gppo-math",
                   "klear-judge", "klear-reasoner", "klear-rl-filter", "klear-sample", "klear-sft", "klear-sft-data"]


def test_every_pipeline_compiles_and_loads_back(compiled: Path) -> None:
    names = sorted(p.stem for p in compiled.glob("*.yaml"))
    assert names == STAGE_PIPELINES
    for name in names:
        validate(compiled / f"{name}.yaml")


def test_the_recipe_is_wired_in_the_papers_order(compiled: Path) -> None:
    spec = validate(compiled / "klear-reasoner.yaml")
    tasks = spec.root.dag.tasks
    named = {prefix: _task_named(spec, prefix) for prefix in (
        "curate", "sample: teacher", "sample: reference", "sft-data", "sft:", "sample: filter-math",
        "sample: filter-code", "rl-filter: math", "rl-filter: code", "math RL: GPPO", "code RL: GPPO",
        "evaluate: benchmark prompts", "evaluate: AIME / HMMT", "sample: eval-rl-math", "sample: eval-sft-math",
        "sample: eval-base-math")}

    def deps(prefix: str) -> set[str]:
        return set(tasks[named[prefix]].dependent_tasks)

    assert named["curate"] in deps("sample: teacher") and named["curate"] in deps("sample: reference")
    assert {named["sample: teacher"], named["sample: reference"]} <= deps("sft-data")
    assert named["sft-data"] in deps("sft:")
    assert named["sample: filter-math"] in deps("rl-filter: math")
    assert {named["sft:"], named["rl-filter: math"]} <= deps("math RL: GPPO")
    assert {named["math RL: GPPO"], named["rl-filter: code"]} <= deps("code RL: GPPO")
    assert named["code RL: GPPO"] in deps("sample: eval-rl-math") and named["sft:"] in deps("sample: eval-sft-math")
    assert {named["sample: eval-rl-math"], named["sample: eval-sft-math"], named["sample: eval-base-math"]} <= deps(
        "evaluate: AIME / HMMT")
    # Math RL and code RL are the one gppo component twice, told apart by their task argument.
    math_rl, code_rl = named["math RL: GPPO"], named["code RL: GPPO"]
    assert tasks[math_rl].component_ref.name.startswith("comp-gppo") and tasks[code_rl].component_ref.name.startswith(
        "comp-gppo")
    assert tasks[math_rl].inputs.parameters["task"].runtime_value.constant.string_value == "math"
    assert tasks[code_rl].inputs.parameters["task"].runtime_value.constant.string_value == "code"
    # LiveCodeBench evaluation is a branch switched by a parameter.
    assert any(t.trigger_policy.condition for t in tasks.values())


def test_cluster_settings_survive_compilation(compiled: Path) -> None:
    """Images, GPU requests, secrets, retries, caching, the untrusted-code label: what a cluster needs."""
    spec = validate(compiled / "klear-reasoner.yaml")
    tasks = spec.root.dag.tasks
    text = (compiled / "klear-reasoner.yaml").read_text()
    assert "klear-s3" in text and "AWS_SECRET_ACCESS_KEY" in text and "AWS_REGION" in text
    assert "klear-endpoint" in text and "OPENAI_API_KEY" in text  # the teacher's key, optional
    assert "klear.io/runs-untrusted-code" in text
    assert "klear-gpu:" in text and "klear-cpu:" in text
    for prefix in ("sample: teacher", "sft:", "math RL: GPPO"):
        task = tasks[_task_named(spec, prefix)]
        assert task.retry_policy.max_retry_count == 3, prefix
        assert not task.caching_options.enable_cache, prefix
    for prefix in ("curate", "sft-data", "rl-filter: math", "evaluate: AIME / HMMT"):
        assert tasks[_task_named(spec, prefix)].caching_options.enable_cache, prefix


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
    curate_only = (compiled / "klear-curate.yaml").read_text()  # a CPU stage asks for no accelerator
    assert "accelerator" not in curate_only and "nvidia.com/gpu" not in curate_only


def test_invalid_spec_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelineInfo:\n  name: x\nroot:\n  dag:\n    tasks: {}\nnotAField: 1\n")
    with pytest.raises(Exception, match="notAField"):
        validate(bad)


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
