"""The compiled recipe judges over slices: each judging use in front of sft-data, rl-filter and evaluate is a
ParallelFor of judge slices over a run-time number of slices, collected into one merge that the stage reads; the CPU
of every judging task is a run-time parameter."""

import pytest
from google.protobuf import json_format

from pipelines.compile import validate
from tests.pipelines.test_sample_slices import _source

# The display name of each judging use's merge -> (its slice-count parameter, the step that hands it the judge
# settings of the stage reading its rows, the task that step has every problem judged as).
USES = {"reference": ("reference_judge_slices", "judge settings: sft-data", ""),
        "filter-math": ("filter_math_judge_slices", "judge settings: rl-filter math", "math"),
        "filter-code": ("filter_code_judge_slices", "judge settings: rl-filter code", "code"),
        **{f"eval-{label}-{kind}": ("evaluate_judge_slices", "evaluate: problems and judge settings", "")
           for label in ("rl", "sft", "base") for kind in ("math", "code")}}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory):
    from kfp import compiler

    from pipelines.definitions import klear_pipeline

    path = tmp_path_factory.mktemp("compiled") / "klear-reasoner.yaml"
    compiler.Compiler().compile(pipeline_func=klear_pipeline, package_path=str(path))
    return validate(path)


def _tasks(spec) -> dict:
    """Every task of the compiled pipeline by its name in its DAG (names are unique across the DAGs)."""
    return {name: task for component in [spec.root, *spec.components.values()]
            if component is spec.root or component.WhichOneof("implementation") == "dag"
            for name, task in component.dag.tasks.items()}


def test_each_judging_use_is_a_parallel_for_of_slices_then_a_merge(spec) -> None:
    dags = {"": spec.root.dag} | {name: c.dag for name, c in spec.components.items()
                                  if c.WhichOneof("implementation") == "dag"}
    tasks = _tasks(spec)
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
            for key in ("name", "settings", "run_root"):
                assert _source(piece.inputs.parameters[key]) == _source(task.inputs.parameters[key]), (use, key)
            assert not {"preset", "overrides"} & set(task.inputs.parameters), use  # the handed settings only
            assert piece.inputs.parameters["cpu"].component_input_parameter.endswith("judge_cpu"), use
            handing = tasks[_source(task.inputs.parameters["settings"]).removesuffix("-Output")]
            # The settings steps read a preset (a file may change in place): never cached, but evaluate's problems
            # step, keyed by the digest of its benchmarks and preset.
            assert handing.caching_options.enable_cache == ("input_digest" in handing.inputs.parameters), use
            task_of = handing.inputs.parameters["task"].runtime_value.constant.string_value \
                if "task" in handing.inputs.parameters else ""
            found[use] = (count, handing.task_info.name, task_of)
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
    """Each sample input of each evaluate task is the merge of a judging use with the judge settings and problems
    that evaluate's own step made from its preset, overrides and benchmarks (so evaluate reuses every verdict); the
    math uses are judged once for both evaluations."""
    tasks = _tasks(spec)
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
            handing = tasks[_source(merge.inputs.parameters["settings"]).removesuffix("-Output")]
            problems = merge.inputs.artifacts["problems"]
            assert (problems.task_output_artifact.producer_task or problems.component_input_artifact.removeprefix(
                "pipelinechannel--").removesuffix("-problems")) == _source(merge.inputs.parameters["settings"]
                                                                           ).removesuffix("-Output"), key
            assert handing.component_ref.name.startswith("comp-evaluation-problems"), key
            for parameter, source in (("preset", "evaluate_preset"), ("overrides", "evaluate_overrides"),
                                      ("benchmark_uris", "benchmark_uris")):
                assert handing.inputs.parameters[parameter].component_input_parameter.endswith(source), (key, parameter)
            read.add(merge.task_info.name)
    assert len(read) == 6, read
