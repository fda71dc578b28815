"""The compiled DAGs: they compile, load back, and run end to end under kfp.local with data on S3."""

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from klear.cli import RECIPE_PIPELINE, STAGES
from klear.common import storage
from klear.demo.generate import generate
from pipelines.compile import compile_all, validate
from pipelines.definitions import PIPELINES
from pipelines.run_local import run_compiled


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled")
    compile_all(out)
    return out


# Every pipeline: the recipe and each stage's own, from the stage registry.
STAGE_PIPELINES = sorted({RECIPE_PIPELINE, *(p for stage in STAGES.values() for p in stage.pipelines)})


def test_the_pipelines_are_the_registrys() -> None:
    """A stage registered without its pipeline, or a pipeline filed under another name, fails here."""
    missing = sorted(set(STAGE_PIPELINES) - set(PIPELINES))
    assert not missing, f"klear.cli.STAGES names {missing}: add each to PIPELINES in pipelines/definitions.py"
    unregistered = sorted(set(PIPELINES) - set(STAGE_PIPELINES))
    assert not unregistered, f"PIPELINES has {unregistered}: add each to its stage's pipelines in klear.cli.STAGES"
    misfiled = {key: pipeline.name for key, pipeline in PIPELINES.items() if key != pipeline.name}
    assert not misfiled, f"PIPELINES keys differ from the pipelines' @dsl.pipeline(name=...): {misfiled}"


def test_every_pipeline_compiles_and_loads_back(compiled: Path) -> None:
    names = sorted(p.stem for p in compiled.glob("*.yaml"))
    assert names == STAGE_PIPELINES
    for name in names:
        validate(compiled / f"{name}.yaml")
    # Each stage's own pipelines run the stage's component.
    for command, stage in STAGES.items():
        for name in stage.pipelines:
            components = validate(compiled / f"{name}.yaml").components
            assert any(c.startswith(f"comp-{command}") for c in components), (name, sorted(components))


def test_the_recipe_is_wired_in_the_papers_order(compiled: Path) -> None:
    spec = validate(compiled / "klear-reasoner.yaml")
    tasks = _body_tasks(spec)
    named = {prefix: _task_named(spec, prefix) for prefix in (
        "curate", "sample: teacher", "sample: reference", "sft-data", "sft:", "sample: filter-math",
        "sample: filter-code", "rl-filter: math", "rl-filter: code", "math RL: GPPO", "code RL: GPPO",
        "evaluate: benchmark prompts", "evaluate: AIME / HMMT", "sample: eval-rl-math", "sample: eval-sft-math",
        "sample: eval-base-math", "judge: reference", "judge: filter-math", "judge: filter-code", "judge: eval-rl-math",
        "judge: eval-sft-math", "judge: eval-base-math")}

    def deps(prefix: str) -> set[str]:
        """Every task the named task waits for, directly or through others: a stage wired in between two (one that
        reads sft-data's output before SFT, say) keeps the order this test checks."""
        found, todo = set(), list(tasks[named[prefix]].dependent_tasks)
        while todo:
            task = todo.pop()
            if task not in found:
                found.add(task)
                todo += tasks[task].dependent_tasks if task in tasks else []
        return found

    assert named["curate"] in deps("sample: teacher") and named["curate"] in deps("sample: reference")
    # The reference samples reach sft-data judged (a fan-out of judge slices, then its merge).
    assert {named["sample: teacher"], named["judge: reference"]} <= deps("sft-data")
    assert named["sample: reference"] in deps("judge: reference")
    assert named["sft-data"] in deps("sft:")
    assert named["sample: filter-math"] in deps("judge: filter-math") and named["judge: filter-math"] in deps(
        "rl-filter: math")
    assert named["sample: filter-code"] in deps("judge: filter-code") and named["judge: filter-code"] in deps(
        "rl-filter: code")
    assert {named["sft:"], named["rl-filter: math"]} <= deps("math RL: GPPO")
    assert {named["math RL: GPPO"], named["rl-filter: code"]} <= deps("code RL: GPPO")
    assert named["code RL: GPPO"] in deps("sample: eval-rl-math") and named["sft:"] in deps("sample: eval-sft-math")
    # Each model's evaluation samples reach evaluate judged (judge slices under evaluate's settings, then a merge).
    for label in ("rl", "sft", "base"):
        assert named[f"sample: eval-{label}-math"] in deps(f"judge: eval-{label}-math")
        assert named[f"judge: eval-{label}-math"] in deps("evaluate: AIME / HMMT")
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
    tasks = _body_tasks(spec)
    text = (compiled / "klear-reasoner.yaml").read_text()
    assert "klear-s3" in text and "AWS_SECRET_ACCESS_KEY" in text and "AWS_REGION" in text
    assert "klear-endpoint" in text and "OPENAI_API_KEY" in text  # the teacher's key, optional
    # The Secrets holding the teacher's and the filter model's keys are run-time parameters.
    teacher_executor = spec.components[tasks[_task_named(spec, "sample: teacher")].component_ref.name].executor_label
    (key,) = [s for s in _kubernetes_executors(compiled / "klear-reasoner.yaml")[teacher_executor]["secretAsEnv"]
              if s["keyToEnv"][0]["secretKey"] == "api-key"]
    assert key["secretNameParameter"]["componentInputParameter"].removeprefix("pipelinechannel--") == (
        "teacher_key_secret") and key["optional"]
    assert "klear.io/runs-untrusted-code" in text
    assert "klear-gpu:" in text and "klear-cpu:" in text
    for prefix in ("sample: teacher", "sft:", "math RL: GPPO"):
        task = tasks[_task_named(spec, prefix)]
        assert task.retry_policy.max_retry_count == 3, prefix
    # Every stage task is cached, keyed by a content digest (never cached itself) that folds in `recompute`.
    for prefix in ("curate", "sample: teacher", "sft-data", "sft:", "rl-filter: math", "math RL: GPPO",
                   "evaluate: AIME / HMMT"):
        task = tasks[_task_named(spec, prefix)]
        assert task.caching_options.enable_cache, prefix
        digest = tasks[task.inputs.parameters["input_digest"].task_output_parameter.producer_task]
        assert not digest.caching_options.enable_cache, prefix
        assert _pipeline_input(digest.inputs.parameters["recompute"]) == "recompute", prefix


def _body_tasks(spec) -> dict[str, Any]:
    """The tasks at the top of the pipeline's body: the root DAG's, and those of the exit handler group that holds
    the whole body of a pipeline that reports its outcome (klear-reasoner)."""
    tasks = dict(spec.root.dag.tasks)
    for name, task in spec.root.dag.tasks.items():
        if name.startswith("exit-handler-"):
            tasks |= dict(spec.components[task.component_ref.name].dag.tasks)
    return tasks


def _task_named(spec, display_prefix: str) -> str:
    """The task (by its name in the DAG) whose display name starts with `display_prefix`; exactly one."""
    found = [name for name, task in _body_tasks(spec).items() if task.task_info.name.startswith(display_prefix)]
    assert len(found) == 1, (display_prefix, found)
    return found[0]


def test_training_resources_are_run_time_parameters(compiled: Path) -> None:
    """The full DAG sizes each training stage from string pipeline parameters (the only kind the KFP driver
    resolves into pod resources), through a sizing step: one node, the launching pod takes the node's GPUs;
    more nodes, it takes none (the Trainer job's pods do)."""
    from klear.training.component import launcher_resources

    full = validate(compiled / "klear-reasoner.yaml")
    inputs = full.root.input_definitions.parameters
    for name in ("sft_gpus_per_node", "rl_gpus_per_node", "sft_cpu", "sft_memory", "rl_cpu", "rl_memory"):
        assert inputs[name].parameter_type == pipeline_spec_pb2.ParameterType.STRING, name
    assert inputs["sft_gpus_per_node"].default_value.string_value == "8"
    executors = full.deployment_spec.fields["executors"].struct_value.fields
    tasks = _body_tasks(full)

    def container(task: str) -> dict:
        executor = full.components[tasks[task].component_ref.name].executor_label
        return json_format.MessageToDict(executors[executor].struct_value)["container"]

    for training, gpus, nodes in (("sft", "sft_gpus_per_node", "sft_nodes"),
                                  (_task_named(full, "code RL: GPPO"), "rl_gpus_per_node", "rl_nodes")):
        (size_name,) = {parameter.task_output_parameter.producer_task for key, parameter
                        in tasks[training].inputs.parameters.items()
                        if parameter.task_output_parameter.producer_task and key != "input_digest"}
        assert size_name.startswith("launcher-resources") and size_name in tasks[training].dependent_tasks
        assert _pipeline_input(tasks[size_name].inputs.parameters["gpus_per_node"]) == gpus
        assert _pipeline_input(tasks[size_name].inputs.parameters["nodes"]) == nodes
        resources = container(training)["resources"]
        assert resources["accelerator"]["resourceCount"] == (
            f"{{{{$.inputs.parameters['pipelinechannel--{size_name}-gpus']}}}}")
        assert resources["resourceCpuLimit"] == f"{{{{$.inputs.parameters['pipelinechannel--{size_name}-cpu']}}}}"
        # The component launches as many processes per node as the pipeline parameter says.
        assert _pipeline_input(tasks[training].inputs.parameters["gpus_per_node"]) == gpus
        assert tasks[training].retry_policy.max_retry_count == 3
    assert tuple(launcher_resources.python_func(nodes=1, gpus_per_node="8", cpu="64", memory="512Gi")) == (
        "8", "64", "512Gi")
    assert tuple(launcher_resources.python_func(nodes=4, gpus_per_node="8", cpu="64", memory="512Gi"))[0] == "0"
    assert "dshm" in (compiled / "klear-reasoner.yaml").read_text()
    curate_only = (compiled / "klear-curate.yaml").read_text()  # a CPU stage asks for no accelerator
    assert "accelerator" not in curate_only and "nvidia.com/gpu" not in curate_only


def _kubernetes_executors(path: Path) -> dict:
    import yaml

    documents = list(yaml.safe_load_all(path.read_text()))
    return documents[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def test_pods_know_their_run_and_training_pods_their_image_and_scheduling(compiled: Path) -> None:
    """Every stage pod gets the run id from its pipeline/runid label and its own pod name (the run and task its
    outputs' lineage names; not task parameters: KFP's cache key would change every run); training pods get their
    own name/uid (owner of their Trainer jobs) and the compiled image; GPU pods take the node selector and
    tolerations from pipeline parameters."""
    import yaml

    for name in STAGE_PIPELINES:
        spec = validate(compiled / f"{name}.yaml")
        assert "run_id" not in json_format.MessageToJson(spec), name  # no stage takes the run id as an input
        assert not spec.root.input_definitions.parameters["run_root"].is_optional, name  # outputs always on storage
        for executor, config in _kubernetes_executors(compiled / f"{name}.yaml").items():
            fields = {e["name"]: e["fieldPath"] for e in config.get("fieldPathAsEnv", [])}
            assert fields.get("KLEAR_RUN_ID") == "metadata.labels['pipeline/runid']", (name, executor)
            assert fields.get("KLEAR_TASK_POD") == "metadata.name", (name, executor)  # the lineage's task id
    platform = _kubernetes_executors(compiled / "klear-reasoner.yaml")
    document = yaml.safe_load((compiled / "klear-reasoner.yaml").read_text().split("\n---\n")[0])
    for executor in ("exec-sft", "exec-gppo", "exec-gppo-2"):
        fields = {e["name"]: e["fieldPath"] for e in platform[executor]["fieldPathAsEnv"]}
        assert fields["KLEAR_POD_NAME"] == "metadata.name" and "KLEAR_POD_UID" not in fields
        selector = platform[executor]["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"]
        tolerations = platform[executor]["tolerations"][0]["tolerationJson"]["componentInputParameter"]
        # Inside the run's exit handler a pipeline parameter is a `pipelinechannel--` of the sub-DAG.
        assert selector.removeprefix("pipelinechannel--") == "gpu_node_selector"
        assert tolerations.removeprefix("pipelinechannel--") == "gpu_tolerations"
        container = document["deploymentSpec"]["executors"][executor]["container"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["KLEAR_TRAIN_IMAGE"] == container["image"] and "klear-gpu" in container["image"]
        # MLflow / W&B credentials from the chart's tracking Secret, which may be absent.
        (tracking,) = [e for e in platform[executor]["secretAsEnv"] if "MLFLOW_TRACKING_PASSWORD" in json.dumps(e)]
        assert tracking["optional"] and "klear-tracking" in json.dumps(tracking) and "WANDB_API_KEY" in json.dumps(tracking)
    assert "nodeSelector" not in platform["exec-curate"] and "tolerations" not in platform["exec-curate"]


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


def test_multi_node_jobs_run_the_image_compiled_in(tmp_path: Path, repo_root: Path) -> None:
    """Compiled for a registry, tag and Trainer v2: the Trainer jobs that math RL and code RL of one run create
    (from the environment the compiled tasks give their pods) run that image, on that runtime, with distinct
    names."""
    import os
    import subprocess
    import sys

    import yaml

    from klear.gppo.stage import STAGE as GPPO
    from klear.training.trainjob import plan_job, render_trainjob, validate_manifest

    env = {**os.environ, "KLEAR_IMAGE_REGISTRY": "registry.example.com/ml", "KLEAR_IMAGE_TAG": "2.0.1",
           "KLEAR_TRAINER_API": "v2", "KLEAR_TRAINER_RUNTIME": "klear-torch-distributed"}
    subprocess.run([sys.executable, "-m", "pipelines.compile", "--output-dir", str(tmp_path)], check=True, env=env,
                   cwd=repo_root, capture_output=True)
    document = next(yaml.safe_load_all((tmp_path / "klear-reasoner.yaml").read_text()))
    names = set()
    for number, (executor, step) in enumerate((("exec-gppo", "gppo-math"), ("exec-gppo-2", "gppo-code"))):
        container = document["deploymentSpec"]["executors"][executor]["container"]
        environ = {e["name"]: e["value"] for e in container["env"]}
        # What the downward API adds on the cluster.
        environ |= {"KLEAR_POD_NAME": f"klear-reasoner-abc12-impl-{number}", "KLEAR_RUN_ID": "3f6c0a52"}
        spec, v2 = plan_job(GPPO, step, "s3://m", ["s3://d"], "s3://o", step.split("-")[1], [], 4, 8, environ,
                            "ns", {})
        job = render_trainjob(spec)
        assert v2 and validate_manifest(job) == []
        assert job["spec"]["trainer"]["image"] == container["image"] == "registry.example.com/ml/klear-gpu:2.0.1"
        assert job["spec"]["runtimeRef"]["name"] == "klear-torch-distributed"
        names.add(job["metadata"]["name"])
    assert len(names) == 2


def _all_tasks(spec) -> dict[str, Any]:
    """Every task of the pipeline: the root DAG's and those inside conditions (sub-DAG components)."""
    tasks = dict(spec.root.dag.tasks)
    for component in spec.components.values():
        if component.WhichOneof("implementation") == "dag":
            tasks |= dict(component.dag.tasks)
    return tasks


def _pipeline_input(parameter) -> str:
    """The pipeline parameter a task input reads ("" if none); inside a condition it is a `pipelinechannel--`."""
    return parameter.component_input_parameter.removeprefix("pipelinechannel--")


def test_the_trained_models_are_registered_on_request_after_the_evaluation(compiled: Path) -> None:
    """register_model_name switches on the final model's registration (register_sft the SFT model's too, as
    <name>-sft) with the evaluation's scores; never cached (the registries are outside KFP's cache), retried, with
    the tracking Secret's MLflow address and credentials."""
    spec = validate(compiled / "klear-reasoner.yaml")
    tasks = _all_tasks(spec)
    (switch,) = [t for t in _body_tasks(spec).values() if t.task_info.name == "register-model"]
    assert "register_model_name'] != ''" in switch.trigger_policy.condition
    code_rl, sft, evaluation = (_task_named(spec, prefix) for prefix in ("code RL: GPPO", "sft:", "evaluate: AIME / HMMT"))
    assert {code_rl, sft, evaluation} <= set(switch.dependent_tasks)
    (inner,) = [t for t in tasks.values() if t.task_info.name == "register-sft"]
    assert "register_sft'] == true" in inner.trigger_policy.condition
    executors = _kubernetes_executors(compiled / "klear-reasoner.yaml")
    for display, model, suffix in (("register: final model", code_rl, ""), ("register: SFT model", sft, "-sft")):
        (task,) = [t for t in tasks.values() if t.task_info.name == display]
        assert task.component_ref.name.startswith("comp-register")
        assert task.inputs.artifacts["model"].component_input_artifact == f"pipelinechannel--{model}-model"
        assert task.inputs.artifacts["evaluation"].component_input_artifact == f"pipelinechannel--{evaluation}-scores"
        assert _pipeline_input(task.inputs.parameters["name"]) == "register_model_name"
        assert task.inputs.parameters["name_suffix"].runtime_value.constant.string_value == suffix
        assert _pipeline_input(task.inputs.parameters["kubeflow_registry"]) == "register_kubeflow_registry"
        assert not task.caching_options.enable_cache and task.retry_policy.max_retry_count == 3
        executor = spec.components[task.component_ref.name].executor_label
        assert [s["secretName"] for s in executors[executor]["secretAsEnv"] if s.get("optional")] == ["klear-tracking"]


# klear-reasoner: the pipeline parameter of each stage task's overrides (display-name prefix -> parameter).
RECIPE_OVERRIDES = {
    "curate": "curate_overrides", "sample: teacher": "teacher_overrides", "sample: reference": "reference_overrides",
    "sample: filter-math": "filter_math_overrides", "sample: filter-code": "filter_code_overrides",
    "sft-data": "sft_data_overrides", "sft:": "sft_overrides", "rl-filter: math": "rl_filter_math_overrides",
    "rl-filter: code": "rl_filter_code_overrides", "math RL: GPPO": "gppo_math_overrides",
    "code RL: GPPO": "gppo_code_overrides", "evaluate: benchmark prompts": "evaluate_overrides",
    "evaluate: AIME / HMMT": "evaluate_overrides",
}


def test_every_stage_task_takes_overrides_from_a_run_time_parameter(compiled: Path) -> None:
    """Every setting is reachable per run from the UI: each stage task's `overrides` is a described pipeline
    parameter (the evaluation's sample tasks: the protocol's settings after the run's own sample overrides)."""
    for name in STAGE_PIPELINES:
        spec = validate(compiled / f"{name}.yaml")
        parameters = spec.root.input_definitions.parameters
        tasks = _all_tasks(spec)
        for pname, definition in parameters.items():
            if pname.endswith("overrides"):  # the `Args:` line, shown in the UI
                assert definition.description.strip(), f"{name}: add an `Args:` line for {pname} to its docstring"
        for tname, task in tasks.items():
            component = spec.components[task.component_ref.name]
            if "overrides" not in component.input_definitions.parameters:
                continue
            if "overrides" not in task.inputs.parameters:
                # A judge step: the settings the stage reading its rows handed over, from that stage's overrides
                # (its step is checked here too).
                settings = task.inputs.parameters["settings"]
                handing = settings.task_output_parameter.producer_task or settings.component_input_parameter \
                    .removeprefix("pipelinechannel--").removesuffix("-Output")
                assert "overrides" in tasks[handing].inputs.parameters, (name, tname, handing)
                continue
            given = task.inputs.parameters["overrides"]
            if given.task_output_parameter.producer_task:  # the protocol's settings, from the prompts step
                producer = tasks[given.task_output_parameter.producer_task]
                assert producer.component_ref.name.startswith("comp-evaluation-prompts"), (name, tname)
                assert _pipeline_input(producer.inputs.parameters["sampling_overrides"]) in parameters, (name, tname)
            elif _pipeline_input(given).startswith("evaluation-prompts"):  # the same, inside a condition
                assert _pipeline_input(given).endswith("_sample_overrides"), (name, tname)
            else:
                assert _pipeline_input(given) in parameters, (name, tname, given)
    recipe = validate(compiled / "klear-reasoner.yaml")
    wired = {prefix: _pipeline_input(_body_tasks(recipe)[_task_named(recipe, prefix)].inputs.parameters["overrides"])
             for prefix in RECIPE_OVERRIDES}
    assert wired == RECIPE_OVERRIDES
    prompts = _body_tasks(recipe)[_task_named(recipe, "evaluate: benchmark prompts")]
    assert _pipeline_input(prompts.inputs.parameters["sampling_overrides"]) == "eval_sample_overrides"
    (code_evaluate,) = [t for t in _all_tasks(recipe).values()
                        if t.task_info.name.startswith("evaluate: AIME / HMMT /")]
    assert _pipeline_input(code_evaluate.inputs.parameters["overrides"]) == "evaluate_overrides"
    assert "gppo_overrides" not in recipe.root.input_definitions.parameters  # one ablation no longer changes both
    for name in ("klear-curate", "klear-rl-filter", "klear-evaluate", "klear-evaluate-samples"):
        spec = validate(compiled / f"{name}.yaml")
        stage = [t for t in spec.root.dag.tasks.values() if "overrides" in t.inputs.parameters
                 and t.inputs.parameters["overrides"].component_input_parameter]
        assert stage and all(_pipeline_input(t.inputs.parameters["overrides"]) == "overrides" for t in stage), name


def test_the_demo_passes_only_parameters_the_recipe_takes(compiled: Path) -> None:
    from pipelines.demo import pipeline_arguments

    parameters = validate(compiled / "klear-reasoner.yaml").root.input_definitions.parameters
    inputs = {"data": "s3://b/data", "model": "s3://b/model", "benchmark": "s3://b/data/demo_benchmark.jsonl",
              "validation": "s3://b/inputs/validation/demo_benchmark.jsonl"}
    for quick in (False, True):
        arguments = pipeline_arguments(inputs, "s3://b/runs", quick)
        assert set(arguments) <= set(parameters), set(arguments) - set(parameters)
        # Math RL validates on the held-out slice; --quick shortens math RL only (code RL keeps its preset's steps).
        math = arguments["gppo_math_overrides"]
        assert "val_data=[s3://b/inputs/validation/demo_benchmark.jsonl]" in math
        assert [o for o in math if not o.startswith("val_")] == (["max_steps=40"] if quick else [])
        assert arguments.get("gppo_code_overrides", []) == []
    # --tracking-uri: the models registered at the end, their training runs reported to MLflow to link them.
    tracked = pipeline_arguments(inputs, "s3://b/runs", True, register="klear-demo")
    assert set(tracked) <= set(parameters) and tracked["register_model_name"] == "klear-demo" and tracked["register_sft"]
    for key in ("sft_overrides", "gppo_math_overrides", "gppo_code_overrides"):
        assert tracked[key][-1] == "report_to=tensorboard,mlflow", key


def _executor_kinds(spec) -> dict[str, str]:
    executors = json_format.MessageToDict(spec.deployment_spec)["executors"]
    return {label: next(iter(executor)) for label, executor in executors.items()}  # container or importer


def test_cached_tasks_key_on_the_content_of_what_they_read(compiled: Path) -> None:
    """KFP's cache key holds URIs and artifacts, not their content, and outputs change in place (a sample output
    topped up): every cached stage task takes the digest of each URI it reads, directly or through an importer,
    and of its config (`preset`: a file or URI is read with its `base` chain), from a digest step that is never
    cached itself."""
    for name in STAGE_PIPELINES:
        spec = validate(compiled / f"{name}.yaml")
        kinds = _executor_kinds(spec)
        tasks = _body_tasks(spec)
        cached = [tname for tname, task in tasks.items() if task.caching_options.enable_cache
                  and kinds[spec.components[task.component_ref.name].executor_label] == "container"]
        assert cached or name in ("klear-sample", "klear-sft", "klear-gppo-math", "klear-gppo-code"), name
        for tname in cached:
            task = tasks[tname]
            digest = task.inputs.parameters["input_digest"].task_output_parameter.producer_task
            assert digest and tasks[digest].component_ref.name.startswith("comp-digest-inputs"), (
                f"{name}: the cached task {tname} takes no input_digest from a digest step: wire it with "
                "cached_stage(component, reads=[its URIs], ...) in pipelines/definitions.py, and give its component "
                "an `input_digest: str = \"\"` input")
            assert not tasks[digest].caching_options.enable_cache, (name, digest)
            digested = {_pipeline_input(p) for p in tasks[digest].inputs.parameters.values()} - {""}
            read = {_pipeline_input(p) for p in task.inputs.parameters.values()
                    if _pipeline_input(p).endswith(("_uri", "_uris", "preset"))}
            for artifact in task.inputs.artifacts.values():
                producer = tasks[artifact.task_output_artifact.producer_task]
                if kinds[spec.components[producer.component_ref.name].executor_label] == "importer":
                    read.add(_pipeline_input(producer.inputs.parameters["uri"]))
            # A task that reads only upstream artifacts and a constant preset reads nothing by URI: nothing to add.
            assert read <= digested, (f"{name}: the cached task {tname} reads {sorted(read - digested)} by URI, which "
                                      "its digest step does not: add them to its cached_stage(reads=...)")
    recipe = validate(compiled / "klear-reasoner.yaml")
    (code_evaluate,) = [t for t in _all_tasks(recipe).values()
                        if t.task_info.name.startswith("evaluate: AIME / HMMT /")]
    assert "digest-inputs" in _pipeline_input(code_evaluate.inputs.parameters["input_digest"])
