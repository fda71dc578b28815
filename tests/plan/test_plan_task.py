"""klear-reasoner's first task runs `klear plan` on the run's own arguments: a typo fails the run at that task in
seconds, before curate publishes anything; the demo's tiny settings pass it; and the compiled Workflow's size
estimate stays within a budget under etcd's request limit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from klear.plan.checks import ETCD_REQUEST_LIMIT, workflow_size

ROOT = Path(__file__).resolve().parents[2]
# The compiled run's Argo Workflow at submission, at most this share of etcd's request limit (a margin for the
# per-task overhead the estimate assumes and for tasks yet to come).
WORKFLOW_BUDGET = 0.75


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipelines.compile import compile_all

    out = tmp_path_factory.mktemp("compiled")
    compile_all(out)
    return out


def demo_arguments(root: Path) -> list[str]:
    """The demo's arguments (pipelines/demo.py), with inputs that need not exist: the plan fails first."""
    from pipelines.demo import DEMO

    arguments = {"sources_uri": str(root / "data"), "source_files": ["arithmetic.jsonl#prompt=problem"],
                 "base_model_uri": str(root / "tiny-model"), "reference_model_uri": str(root / "tiny-model"),
                 "rl_math_uri": str(root / "data" / "arithmetic.jsonl"), "rl_code_uri": str(root / "data" / "code.jsonl"),
                 **DEMO}
    return [f"{key}={json.dumps(value)}" for key, value in arguments.items()]


def test_a_typo_fails_the_run_at_the_plan_task(compiled: Path, tmp_path: Path) -> None:
    run_root = tmp_path / "runs"
    args = [a for item in demo_arguments(tmp_path) for a in ("--arg", item)]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipelines.run_local", "klear-reasoner", "--workdir",
                           str(tmp_path / "work"), "--run-root", str(run_root), "--compiled", str(compiled), *args,
                           "--arg", 'gppo_code_overrides=["eps_hihg=0.3"]'],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert seconds < 60, seconds
    assert "plan check(s) failed" in output and "gppo_code_overrides" in output and "eps_hihg" in output, \
        output[-3000:]
    assert "plan-run" in output  # the task that failed: kfp.local names it
    # Nothing ran after it: no stage published, curate included.
    assert not run_root.exists() or not any(run_root.rglob("*")), sorted(run_root.rglob("*"))


def test_the_demo_settings_pass_the_plan_task(tmp_path: Path) -> None:
    """The plan task's own function on the demo's arguments and its tiny model (none of the shipped shapes: the
    model-shape checks say why they do not apply; settings and layouts are checked)."""
    from klear.demo.tiny_model import build
    from klear.plan.component import plan_run
    from pipelines.demo import DEMO

    model = tmp_path / "tiny-model"
    build(str(model), spec="demo")
    params = dict(DEMO)  # every demo argument the plan task takes, its pod sizes and slices included
    defaults = {"curate_overrides": [], "teacher_overrides": [], "reference_overrides": [],
                "filter_math_overrides": [], "filter_code_overrides": [], "sft_data_overrides": [],
                "sft_overrides": [], "rl_filter_math_overrides": [], "rl_filter_code_overrides": [],
                "gppo_math_overrides": [], "gppo_code_overrides": [], "evaluate_overrides": [],
                "eval_sample_overrides": [], "sft_nodes": 1, "rl_nodes": 1, "teacher_model_uri": ""}
    table = plan_run.python_func(cluster="h100-80gb-x8", base_model_uri=str(model), reference_model_uri=str(model),
                                 **{**defaults, **params})
    assert "FAIL" not in table
    assert "not checked: policy model" in table and "none of the shipped model shapes" in table
    assert "layout: gppo_math_overrides at rl_nodes=1 x 1 GPUs" in table
    # The same arguments at 16 RL nodes of 8 GPUs: the run's own layout is refused by name.
    with pytest.raises(Exception, match="gppo_math_overrides"):
        plan_run.python_func(cluster="h100-80gb-x8", base_model_uri=str(model), reference_model_uri=str(model),
                             **{**defaults, **params, "rl_nodes": 16, "rl_gpus_per_node": "8"})


def test_the_workflow_estimate_stays_within_its_budget(compiled: Path) -> None:
    documents = list(yaml.load_all((compiled / "klear-reasoner.yaml").read_text(), Loader=yaml.CSafeLoader))
    size = workflow_size(documents[0], documents[1])
    assert size["tasks"] >= 99
    assert size["submitted_bytes"] <= WORKFLOW_BUDGET * ETCD_REQUEST_LIMIT, size
    # The estimate sees growth: the spec with every task doubled is larger by at least the tasks' specs.
    tasks = documents[0]["root"]["dag"]["tasks"]
    doubled = {**documents[0], "root": {**documents[0]["root"], "dag": {
        "tasks": {**tasks, **{f"{name}-copy": task for name, task in tasks.items()}}}}}
    assert workflow_size(doubled, documents[1])["submitted_bytes"] > size["submitted_bytes"] + 1024 * len(tasks)


def test_a_single_stage_pipeline_fails_at_its_own_plan_task(compiled: Path, tmp_path: Path) -> None:
    """klear-sft's first task is the plan of its own preset and overrides: a typo fails the run there, before the
    model is imported or the launcher sized, and nothing is published."""
    run_root = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "pipelines.run_local", "klear-sft", "--workdir",
                           str(tmp_path / "work"), "--run-root", str(run_root), "--compiled", str(compiled),
                           "--arg", f"base_model_uri={tmp_path / 'no-model'}", "--arg", f"data_uri={tmp_path / 'no-data'}",
                           "--arg", "preset=tiny", "--arg", 'overrides=["learning_rat=1e-5"]',
                           "--arg", 'gpus_per_node="0"'],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "plan check(s) failed" in output and "learning_rat" in output and "plan-stage" in output, output[-3000:]
    assert not run_root.exists() or not any(run_root.rglob("*")), sorted(run_root.rglob("*"))


def test_every_single_stage_pipeline_plans_first(compiled: Path) -> None:
    """Every task of every compiled pipeline waits for its plan task (directly, or through a loop or a task that
    does); in a pipeline run inside an exit handler, every task of the handler's body (the exit task runs last)."""
    for path in sorted(compiled.glob("*.yaml")):
        spec = next(yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader))
        tasks = spec["root"]["dag"]["tasks"]
        body = [name for name, task in tasks.items() if name.startswith("exit-handler-")]
        if body:
            (handler,) = body
            # The root holds the handler's group and its exit task, nothing else.
            assert all(name == handler or task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"
                       for name, task in tasks.items()), path.name
            tasks = spec["components"][tasks[handler]["componentRef"]["name"]]["dag"]["tasks"]
        first = [name for name in tasks if name.startswith("plan-")]
        assert len(first) == 1, (path.name, first)
        waiting = [name for name, task in tasks.items() if name != first[0]
                   and first[0] not in task.get("dependentTasks", [])]
        assert not waiting, (path.name, waiting)


def _task_names(spec: dict) -> tuple[dict[str, str], dict[str, dict]]:
    """Display name -> task id of every task of the spec (sub-DAGs included), and the tasks by id."""
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks |= component.get("dag", {}).get("tasks", {})
    return {task["taskInfo"]["name"]: name for name, task in tasks.items()}, tasks


def test_the_teacher_goes_first(compiled: Path) -> None:
    """The filter model's and the base model's evaluation sampling wait for the teacher's merge (the critical path),
    the reference model's does not (sft-data needs it beside the teacher)."""
    spec = next(yaml.load_all((compiled / "klear-reasoner.yaml").read_text(), Loader=yaml.CSafeLoader))
    names, tasks = _task_names(spec)
    teacher = names["sample: teacher (merge of the slices)"]
    for use in ("filter-math", "filter-code", "eval-base-math"):
        assert teacher in tasks[names[f"slices of sample: {use}"]]["dependentTasks"], use
    for use in ("teacher", "reference", "eval-sft-math", "eval-rl-math"):
        assert teacher not in tasks[names[f"slices of sample: {use}"]].get("dependentTasks", []), use


def test_merges_and_slices_stage_on_a_scratch_volume(compiled: Path) -> None:
    """Every merge and every sampling slice has a generic ephemeral volume of the size the plan checks, where it
    stages (KLEAR_SCRATCH; not TMPDIR, which the KFP bootstrap's mktemp reads)."""
    from klear.common.kfp_io import ENDPOINT_SLICE_SCRATCH, MERGE_SCRATCH, MODEL_SLICE_SCRATCH, SCRATCH_PATH

    spec, platform = yaml.load_all((compiled / "klear-reasoner.yaml").read_text(), Loader=yaml.CSafeLoader)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    containers = spec["deploymentSpec"]["executors"]
    merges = slices = 0
    for label, config in executors.items():
        volumes = config.get("genericEphemeralVolume", [])
        env = {e["name"]: e.get("value") for e in containers[label]["container"].get("env", [])}
        if volumes:
            (volume,) = volumes
            assert volume["mountPath"] == SCRATCH_PATH and env.get("KLEAR_SCRATCH") == SCRATCH_PATH, label
            assert volume["size"] in (MERGE_SCRATCH, MODEL_SLICE_SCRATCH, ENDPOINT_SLICE_SCRATCH), volume
            merges += volume["size"] == MERGE_SCRATCH
            slices += volume["size"] != MERGE_SCRATCH
    assert merges >= 13 and slices >= 8, (merges, slices)  # sample and judge merges; every sampling use's slices
