"""The compiled recipe judges over slices: each judging use in front of sft-data, rl-filter and evaluate is a
ParallelFor of judge slices over a run-time number of slices, collected into one merge that the stage reads; the CPU
of every judging task is a run-time parameter."""

import pytest
from google.protobuf import json_format

from pipelines.compile import validate
from tests.pipelines.test_sample_slices import _source

# The display name of each judging use's merge -> (its slice-count parameter, the stage whose judge settings it
# uses, the task every problem is judged as).
USES = {"reference": ("reference_judge_slices", "sft-data", ""),
        "filter-math": ("filter_math_judge_slices", "rl-filter", "math"),
        "filter-code": ("filter_code_judge_slices", "rl-filter", "code"),
        **{f"eval-{label}-{kind}": ("evaluate_judge_slices", "evaluate", "") for label in ("rl", "sft", "base")
           for kind in ("math", "code")}}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory):
    from kfp import compiler

    from pipelines.definitions import klear_pipeline

    path = tmp_path_factory.mktemp("compiled") / "klear-reasoner.yaml"
    compiler.Compiler().compile(pipeline_func=klear_pipeline, package_path=str(path))
    return validate(path)


def _constant(parameter) -> str:
    return str(json_format.MessageToDict(parameter.runtime_value.constant))


def test_each_judging_use_is_a_parallel_for_of_slices_then_a_merge(spec) -> None:
    dags = {"": spec.root.dag} | {name: c.dag for name, c in spec.components.items()
                                  if c.WhichOneof("implementation") == "dag"}
    found = {}
    for dag in dags.values():
        for task in dag.tasks.values():
            if not task.component_ref.name.startswith("comp-judge") or task.component_ref.name.startswith(
                    "comp-judge-slice"):
                continue
            use = task.task_info.name.removeprefix("judge: ").removesuffix(" (merge of the slices)")
            assert task.inputs.parameters["merge"].runtime_value.constant.bool_value, use
            loop = dag.tasks[task.inputs.parameters["slices"].task_output_parameter.producer_task]
            (piece,) = dags[loop.component_ref.name].tasks.values()
            assert piece.component_ref.name.startswith("comp-judge-slice"), use
            assert piece.inputs.parameters["part"].component_input_parameter == loop.parameter_iterator.item_input
            lister = dag.tasks[loop.parameter_iterator.items.input_parameter.removeprefix("pipelinechannel--")
                               .removesuffix("-Output")]
            # Inside a condition (evaluate_code) a pipeline parameter comes as a channel.
            count = lister.inputs.parameters["count"].component_input_parameter.removeprefix("pipelinechannel--")
            # Retried, and cached like the merge: keyed by the same content digest (so one work area).
            assert piece.retry_policy.max_retry_count == 3 and piece.caching_options.enable_cache, use
            assert task.caching_options.enable_cache, use
            # Slices and merge write one output (one work area), judged under one stage's settings.
            assert _source(piece.inputs.parameters["input_digest"]) == _source(task.inputs.parameters["input_digest"])
            for key in ("name", "config_of", "task", "preset", "run_root"):
                assert _constant(piece.inputs.parameters[key]) == _constant(task.inputs.parameters[key]), (use, key)
            assert piece.inputs.parameters["cpu"].component_input_parameter.endswith("judge_cpu"), use
            found[use] = (count, piece.inputs.parameters["config_of"].runtime_value.constant.string_value,
                          piece.inputs.parameters["task"].runtime_value.constant.string_value)
    assert found == USES
    parameters = spec.root.input_definitions.parameters
    for count, _, _ in USES.values():
        assert parameters[count].default_value.number_value == 1 and parameters[count].description.strip()


def test_the_cpu_of_every_judging_task_is_a_run_time_parameter(spec) -> None:
    parameters = spec.root.input_definitions.parameters
    assert parameters["judge_cpu"].default_value.string_value == "16" and parameters["judge_cpu"].description.strip()
    executors = json_format.MessageToDict(spec.deployment_spec)["executors"]
    tasks = {task.task_info.name: task for component in [spec.root, *spec.components.values()]
             if component.WhichOneof("implementation") == "dag" or component is spec.root
             for task in component.dag.tasks.values()}
    judging = [name for name in tasks if name.startswith(("judge slice:", "sft-data", "rl-filter", "evaluate: AIME"))]
    assert len(judging) == 3 + 6 + 1 + 2 + 2, judging
    for name in judging:
        executor = spec.components[tasks[name].component_ref.name].executor_label
        resources = executors[executor]["container"]["resources"]
        assert resources["resourceCpuLimit"] == resources["resourceCpuRequest"], name
        assert resources["resourceCpuLimit"].startswith("{{$.inputs.parameters['pipelinechannel--"), name
        assert resources["resourceCpuLimit"].endswith("judge_cpu']}}"), name


def test_every_evaluate_task_reads_judge_merges_of_its_own_settings(spec) -> None:
    """Each sample input of each evaluate task is the merge of a judging use under evaluate's preset, overrides and
    benchmarks (so evaluate reuses every verdict); the math uses are judged once for both evaluations."""
    tasks = {name: task for component in [spec.root, *spec.components.values()]
             if component is spec.root or component.WhichOneof("implementation") == "dag"
             for name, task in component.dag.tasks.items()}
    evaluations = {name: task for name, task in tasks.items() if task.component_ref.name.startswith("comp-evaluate")
                   and not task.component_ref.name.startswith("comp-evaluation-prompts")}
    assert sorted(t.task_info.name for t in evaluations.values()) == ["evaluate: AIME / HMMT",
                                                                      "evaluate: AIME / HMMT / LiveCodeBench"]
    read = set()
    for evaluation in evaluations.values():
        slots = {key: value for key, value in evaluation.inputs.artifacts.items() if key.endswith("samples")}
        assert len(slots) in (3, 6), slots
        for key, value in slots.items():
            # Inside the condition an input comes as the channel of the task outside that made it.
            producer = value.task_output_artifact.producer_task or value.component_input_artifact.removeprefix(
                "pipelinechannel--").removesuffix("-judged")
            merge = tasks[producer]
            assert merge.component_ref.name.startswith("comp-judge") and "slice" not in merge.component_ref.name, key
            assert merge.inputs.parameters["config_of"].runtime_value.constant.string_value == "evaluate", key
            for parameter, source in (("preset", "evaluate_preset"), ("overrides", "evaluate_overrides"),
                                      ("benchmark_uris", "benchmark_uris")):
                assert merge.inputs.parameters[parameter].component_input_parameter.endswith(source), (key, parameter)
            read.add(merge.task_info.name)
    assert len(read) == 6, read
