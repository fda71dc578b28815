"""The compiled DAGs fan every sampling use out: a ParallelFor of sample slices (each its own retried GPU task)
over a run-time number of slices, collected into one merge task that publishes."""

from pathlib import Path
from typing import Any

import pytest

from pipelines.compile import compile_all, validate

# klear-reasoner: the display name of each sampling use's merge -> the pipeline parameter of its slice count.
RECIPE_USES = {
    "teacher": "teacher_slices", "reference": "reference_slices", "filter-math": "filter_math_slices",
    "filter-code": "filter_code_slices", "eval-rl-math": "eval_slices", "eval-sft-math": "eval_slices",
    "eval-base-math": "eval_slices", "eval-rl-code": "eval_slices", "eval-sft-code": "eval_slices",
    "eval-base-code": "eval_slices",
}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled")
    compile_all(out)
    return out


def _dags(spec) -> dict[str, Any]:
    """Every DAG of the pipeline by component name ("" for the root): the root's, conditions' and loops'."""
    dags = {"": spec.root.dag}
    for name, component in spec.components.items():
        if component.WhichOneof("implementation") == "dag":
            dags[name] = component.dag
    return dags


def _source(parameter) -> str:
    """Where a task input comes from, the same inside a loop (a channel named after it) as outside."""
    if parameter.task_output_parameter.producer_task:
        output = parameter.task_output_parameter
        return f"{output.producer_task}-{output.output_parameter_key}"
    if parameter.component_input_parameter:
        return parameter.component_input_parameter.removeprefix("pipelinechannel--")
    return str(parameter.runtime_value.constant)


def _fan_outs(spec) -> dict[str, dict[str, Any]]:
    """Each sampling use's merge task -> its loop's slice task, the slice-list task and the parameter it counts."""
    dags = _dags(spec)
    found = {}
    for dag in dags.values():
        for task in dag.tasks.values():
            if not task.component_ref.name.startswith("comp-sample") or task.component_ref.name.startswith(
                    "comp-sample-slice"):
                continue
            use = task.task_info.name.removeprefix("sample: ").removesuffix(" (merge of the slices)")
            assert task.inputs.parameters["merge"].runtime_value.constant.bool_value, use  # no unsliced sampling
            collected = task.inputs.parameters["slices"].task_output_parameter
            loop = dag.tasks[collected.producer_task]
            body = dags[loop.component_ref.name]
            (piece,) = [t for t in body.tasks.values() if t.component_ref.name.startswith("comp-sample-slice")]
            items = loop.parameter_iterator.items.input_parameter.removeprefix("pipelinechannel--")
            lister = dag.tasks[items.removesuffix("-Output")]
            assert lister.component_ref.name.startswith("comp-slice-list"), use
            assert piece.inputs.parameters["part"].component_input_parameter == loop.parameter_iterator.item_input
            count = lister.inputs.parameters["count"].component_input_parameter.removeprefix("pipelinechannel--")
            # Every parameter the slice task reads (its pod's resources too) is an input of the loop: KFP leaves
            # out channels used only as resources, and the pod's size could then not be resolved.
            inputs = spec.components[loop.component_ref.name].input_definitions.parameters
            read = {p.component_input_parameter for p in piece.inputs.parameters.values()} - {""}
            assert read <= set(inputs), (use, read - set(inputs))
            found[use] = {"merge": task, "slice": piece, "count": count}
    return found


def test_every_sampling_use_of_the_recipe_is_a_parallel_for_of_slices_then_a_merge(compiled: Path) -> None:
    spec = validate(compiled / "klear-reasoner.yaml")
    fan_outs = _fan_outs(spec)
    assert {use: f["count"] for use, f in fan_outs.items()} == RECIPE_USES
    parameters = spec.root.input_definitions.parameters
    for use, fan_out in fan_outs.items():
        count = parameters[fan_out["count"]]
        assert count.default_value.number_value == 1 and count.description.strip(), use
        piece, merge = fan_out["slice"], fan_out["merge"]
        # Retried, and cached: keyed by the content digest of what they read, as the work area they share is.
        assert piece.retry_policy.max_retry_count == 3 and piece.caching_options.enable_cache, use
        assert merge.retry_policy.max_retry_count == 3 and merge.caching_options.enable_cache, use
        # Slices and merge of one use write one output (and so share its work area): the same name and run root.
        for key in ("name", "run_root", "preset", "overrides", "endpoint", "served_model", "model_uri",
                    "input_digest"):
            assert _source(piece.inputs.parameters[key]) == _source(merge.inputs.parameters[key]), (use, key)
        assert piece.inputs.parameters["name"].runtime_value.constant.string_value == use
        assert merge.inputs.parameters["name"].runtime_value.constant.string_value == use


def test_slices_run_on_gpu_pods_and_the_merge_on_a_cpu_pod(compiled: Path) -> None:
    import yaml

    text = (compiled / "klear-reasoner.yaml").read_text()
    spec = validate(compiled / "klear-reasoner.yaml")
    executors = yaml.safe_load(text.split("\n---\n")[0])["deploymentSpec"]["executors"]
    teacher = _fan_outs(spec)["teacher"]
    slice_container = executors[spec.components[teacher["slice"].component_ref.name].executor_label]["container"]
    merge_container = executors[spec.components[teacher["merge"].component_ref.name].executor_label]["container"]
    assert "accelerator" in slice_container["resources"] and "--slice" not in slice_container["command"]
    assert "accelerator" not in merge_container.get("resources", {})


@pytest.mark.parametrize("name", ["klear-sample", "klear-evaluate"])
def test_the_single_stage_pipelines_fan_out_too(compiled: Path, name: str) -> None:
    spec = validate(compiled / f"{name}.yaml")
    (fan_out,) = _fan_outs(spec).values()
    assert fan_out["count"] == "slices" and spec.root.input_definitions.parameters["slices"].description.strip()


def test_klear_sample_in_two_slices_under_kfp_local_publishes_the_unsliced_rows(compiled: Path, s3_bucket: str,
                                                                              tmp_path: Path) -> None:
    """The fan-out runs under kfp.local (as the demo's teacher and reference): two slice tasks, one merge, every
    unit once, and the very rows, in the very order and bytes, of an unsliced `klear sample` of the same prompts."""
    import json

    from klear.common import storage
    from klear.common.config import load_config
    from klear.sample.config import SampleConfig
    from klear.sample.stage import run
    from pipelines.run_local import run_compiled

    rows = [{"id": f"p{i}", "prompt": f"What is {i} + 1?", "generations": [f"<think>\nadd\n</think>\n\n{i + 1}",
                                                                          f"<think>\nadd\n</think>\n\n{i + 2}"]}
            for i in range(12)]
    prompts = f"{s3_bucket}/inputs/p.jsonl"
    storage.write_bytes(storage.Uri.parse(prompts), "".join(json.dumps(r) + "\n" for r in rows).encode())
    task = run_compiled("klear-sample", tmp_path / "kfp", {
        "prompts_uri": prompts, "name": "teacher", "preset": "tiny", "overrides": ["backend=records", "n=2"],
        "gpus": "0", "run_root": f"{s3_bucket}/runs", "slices": 2}, compiled)
    uri = task.output.metadata["uri"]
    assert task.output.metadata["rows"] == 24
    report = json.loads(storage.read_bytes(storage.Uri.parse(uri).join("report.json")))
    assert sorted(report["slices"]) == ["0/2", "1/2"] and all(s["total"] for s in report["slices"].values())
    unsliced = f"{s3_bucket}/unsliced/teacher"
    run([prompts], unsliced, load_config(SampleConfig, "tiny", ["backend=records", "n=2"]))
    assert _sample_files(uri) == _sample_files(unsliced)


def _sample_files(uri: str) -> dict[str, bytes]:
    from klear.common import storage

    with storage.fetch_published(uri) as (local, manifest):
        return {rel: (local / rel).read_bytes() for rel in manifest.files if rel.startswith("samples/")}
