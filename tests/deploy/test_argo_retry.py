"""Deleted pods of retried tasks are retried (issue #33). The chart's `argoRetryDefaults` renders a retryStrategy
default and a Job running files/argo_retry_defaults.py, which writes it into Argo's controller ConfigMap. Here the
rendered default goes through that script (as a command, on KFP 2.17's own ConfigMap), then onto the templates KFP's
Argo compiler makes of each compiled pipeline the way Argo applies templateDefaults, and then through Argo's retry
decision: a retried task retries a deleted pod (node phase Error) as well as a failed container (Failed) with its own
limit and backoff, and every other template retries nothing.

The Argo and KFP behaviour below is modelled from their source (pure functions, each citing where), not run: no
cluster is at hand. Versions read: KFP backend 2.14.0-2.17.0, Argo Workflows v3.5.14-v4.0.8."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.definitions import PIPELINES
from tests.deploy.helpers import CHART, CREDENTIALS, NAMESPACE, find, merge, render

pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

SCRIPT = CHART / "files" / "argo_retry_defaults.py"
PIPELINE_NAMES = sorted(PIPELINES)
ENABLED = merge(CREDENTIALS, {"argoRetryDefaults": {"enabled": True}})


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every pipeline compiled as `make pipeline` compiles it (a fresh checkout has no pipelines/compiled)."""
    from pipelines.compile import compile_all

    out = tmp_path_factory.mktemp("compiled")
    compile_all(out)
    return out

# The controller ConfigMap's data as KFP 2.17.0 ships it (manifests/kustomize/third-party/argo/base/
# workflow-controller-configmap-patch.yaml at tag 2.17.0; artifactRepository left out).
KFP_2_17_DATA = {
    "executor": (
        "imagePullPolicy: IfNotPresent\nsecurityContext:\n  runAsNonRoot: true\n  runAsUser: 65532\n"
        "  allowPrivilegeEscalation: false\n  capabilities:\n    drop:\n      - ALL\n  seccompProfile:\n"
        "    type: RuntimeDefault\n"),
    "workflowDefaults": (
        "spec:\n  ttlStrategy:\n    secondsAfterCompletion: 3600\n    secondsAfterSuccess: 3600\n"
        "    secondsAfterFailure: 3600\n  templateDefaults:\n    retryStrategy:\n      limit: '2'\n"
        "      retryPolicy: OnError\n"),
}

# --------------------------------------------------------------------------- Argo, as its source says


def argo_config(data: dict[str, str]) -> dict[str, Any]:
    """How Argo's controller reads its ConfigMap (config/controller.go, parseConfigMap): one `config` key holding the
    whole configuration, or one key per setting."""
    if "config" in data:
        assert len(data) == 1, "Argo refuses a `config` key beside others"
        return yaml.safe_load(data["config"])
    return {key: yaml.safe_load(value) for key, value in data.items()}


def argo_merge_template_defaults(defaults: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """Argo's mergedTemplateDefaultsInto (workflow/controller/operator.go): a Kubernetes strategic merge patch with
    the defaults as the original and the template as the patch, so the template's own fields win, maps merge key by
    key and a null in the template removes the default. Lists merge by key in a strategic merge: not modelled."""
    if any(isinstance(value, list) for value in defaults.values()):
        raise ValueError(f"list-valued template defaults are not modelled: {defaults}")
    out = dict(defaults)
    for key, value in template.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = argo_merge_template_defaults(out[key], value)
        else:
            out[key] = value
    return out


def argo_substitute(value: Any, arguments: dict[str, str]) -> Any:
    """{{inputs.parameters.NAME}} replaced by the argument the calling task passes (Argo's common.ProcessArgs)."""
    if isinstance(value, dict):
        return {key: argo_substitute(item, arguments) for key, item in value.items()}
    if isinstance(value, str):
        return re.sub(r"\{\{inputs\.parameters\.([\w-]+)\}\}", lambda m: arguments[m.group(1)], value)
    return value


def argo_retries(strategy: dict[str, Any] | None, phase: str) -> float:
    """How many times Argo retries a node that ended `Failed` (its main container exited non-zero) or `Error` (e.g.
    "pod deleted": podReconciliation marks a vanished pod so): processNodeRetries in workflow/controller/operator.go
    and RetryStrategy.RetryPolicyActual in pkg/apis/workflow/v1alpha1/workflow_types.go. inf: no limit."""
    if strategy is None:
        return 0
    # No retryPolicy is OnFailure, unless an expression is set (then Always).
    policy = strategy.get("retryPolicy") or ("Always" if strategy.get("expression") else "OnFailure")
    covered = {"Always": {"Failed", "Error"}, "OnFailure": {"Failed"}, "OnError": {"Error"}}
    if policy not in covered:
        raise ValueError(f"retryPolicy {policy} is not modelled")
    if phase not in covered[policy]:
        return 0
    limit = strategy.get("limit")
    return math.inf if limit is None else int(limit)  # limit N: N retries after the first attempt


# --------------------------------------------------------------------------- KFP's Argo compiler, as its source says

# backend/src/v2/compiler/argocompiler/container.go at tag 2.17.0: addContainerExecutorTemplate (l. 362-597) names
# a task's templates retry-system-container-executor/-impl when the IR task has a retryPolicy and gives only the
# -impl (pod) template a retryStrategy (l. 582-590), from getTaskRetryStrategyFromInput (l. 667-687): a limit and a
# backoff read from input parameters, no retryPolicy. It is the only RetryStrategy the compiler sets: drivers, DAG
# templates, importers and the executor wrappers have none.
KFP_RETRY_STRATEGY = {"limit": "{{inputs.parameters.retry-max-count}}",
                      "backoff": {"duration": "{{inputs.parameters.retry-backoff-duration}}",
                                  "factor": "{{inputs.parameters.retry-backoff-factor}}",
                                  "maxDuration": "{{inputs.parameters.retry-backoff-max-duration}}"}}


def _seconds(duration: str | None) -> str:
    return str(int(float(duration.removesuffix("s")))) if duration else "0"  # protobuf Duration.Seconds; absent: "0"


def kfp_retry_arguments(policy: dict[str, Any]) -> dict[str, str]:
    """The values a retried task passes its -impl template (getTaskRetryParametersWithValues, container.go l. 614-649:
    Go's %v of each IR field, durations as whole seconds)."""
    return {"retry-max-count": str(policy.get("maxRetryCount", 0)),
            "retry-backoff-duration": _seconds(policy.get("backoffDuration")),
            "retry-backoff-factor": f"{float(policy.get('backoffFactor', 0)):g}",
            "retry-backoff-max-duration": _seconds(policy.get("backoffMaxDuration"))}


@dataclass(frozen=True)
class Instance:
    """One template as one task runs it: where in the IR, the template's fields that decide retries, its arguments,
    and the IR task whose container it runs (None for drivers, DAGs and importers)."""
    task: str
    template: dict[str, Any]
    arguments: dict[str, str]
    container_task: dict[str, Any] | None = None

    @property
    def retry_policy(self) -> dict[str, Any] | None:
        return (self.container_task or {}).get("retryPolicy")


def kfp_instances(ir: dict[str, Any]) -> list[Instance]:
    """Every template instance KFP 2.17's compiler makes of a pipeline spec (dag.go, container.go, importer.go)."""
    out = [Instance("", {"name": "entrypoint", "dag": {}}, {}), Instance("", {"name": "root", "dag": {}}, {})]

    def walk(dag: dict[str, Any], path: str) -> None:
        for name, task in dag["tasks"].items():
            where, ref = f"{path}/{name}", task["componentRef"]["name"]
            component = ir["components"][ref]
            if "dag" in component:
                out.append(Instance(where, {"name": "system-dag-driver", "container": {}}, {}))
                out.append(Instance(where, {"name": ref, "dag": {}}, {}))
                walk(component["dag"], where)
            elif "importer" in ir["deploymentSpec"]["executors"][component["executorLabel"]]:
                out.append(Instance(where, {"name": "system-importer", "container": {}}, {}))
            else:
                policy = task.get("retryPolicy")
                prefix = "retry-" if policy else ""
                impl = {"name": f"{prefix}system-container-impl", "container": {},
                        **({"retryStrategy": KFP_RETRY_STRATEGY} if policy else {})}
                out.append(Instance(where, {"name": "system-container-driver", "container": {}}, {}))
                out.append(Instance(where, {"name": f"{prefix}system-container-executor", "dag": {}}, {}))
                out.append(Instance(where, impl, kfp_retry_arguments(policy) if policy else {}, task))

    walk(ir["root"]["dag"], "")
    return out


def pipeline_spec(path: Path) -> dict[str, Any]:
    return next(yaml.safe_load_all(path.read_text()))


def run_strategies(template_defaults: dict[str, Any] | None, instance: Instance) -> dict[str, Any] | None:
    """The retryStrategy Argo runs one instance with, after the defaults and the task's arguments."""
    template = argo_merge_template_defaults(template_defaults or {}, instance.template)
    return argo_substitute(template.get("retryStrategy"), instance.arguments)


# --------------------------------------------------------------------------- the chart and its script


def run_script(tmp_path: Path, data: dict[str, str], strategy: str) -> subprocess.CompletedProcess[str]:
    """files/argo_retry_defaults.py --from-file on a ConfigMap holding `data`, with `strategy` as its strategy file."""
    configmap = tmp_path / "configmap.yaml"
    configmap.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": "workflow-controller-configmap"}, "data": data}))
    (tmp_path / "retry-strategy.yaml").write_text(strategy)
    return subprocess.run([sys.executable, str(SCRIPT), f"--retry-strategy={tmp_path / 'retry-strategy.yaml'}",
                           f"--from-file={configmap}"], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(ENABLED)


@pytest.fixture(scope="module")
def rendered_strategy(objects: list[dict[str, Any]]) -> str:
    return str(find(objects, "ConfigMap", "klear-argo-retry-defaults")["data"]["retry-strategy.yaml"])


@pytest.fixture(scope="module")
def template_defaults(rendered_strategy: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """spec.templateDefaults as Argo reads it from KFP 2.17's ConfigMap after the chart's Job ran."""
    done = run_script(tmp_path_factory.mktemp("argo"), KFP_2_17_DATA, rendered_strategy)
    assert done.returncode == 0, done.stderr
    return dict(argo_config(yaml.safe_load(done.stdout)["data"])["workflowDefaults"]["spec"]["templateDefaults"])


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_retried_tasks_retry_deleted_pods_with_their_own_limit_and_backoff(template_defaults: dict[str, Any],
                                                                           compiled: Path, name: str) -> None:
    path = compiled / f"{name}.yaml"
    instances = kfp_instances(pipeline_spec(path))
    for instance in instances:
        strategy = run_strategies(template_defaults, instance)
        retries = {phase: argo_retries(strategy, phase) for phase in ("Failed", "Error")}
        where = f"{path.name} {instance.task} {instance.template['name']}"
        if instance.retry_policy is None:
            assert retries == {"Failed": 0, "Error": 0}, where
            continue
        count = instance.retry_policy["maxRetryCount"]
        assert retries == {"Failed": count, "Error": count}, where  # a deleted pod is retried like a failed one
        assert strategy is not None and strategy["retryPolicy"] == "Always", where
        assert strategy["backoff"] == argo_substitute(KFP_RETRY_STRATEGY["backoff"], instance.arguments), where


def test_the_pipelines_have_retried_tasks_inside_loops(compiled: Path) -> None:
    """The test above sees the tasks it is about: retried ones, in ParallelFor loops too."""
    retried = [i.task for name in PIPELINE_NAMES for i in kfp_instances(pipeline_spec(compiled / f"{name}.yaml"))
               if i.retry_policy]
    assert any(task.count("/") > 1 for task in retried) and any(task.count("/") == 1 for task in retried), retried


def test_without_the_chart_default_a_deleted_pod_is_not_retried(template_defaults: dict[str, Any],
                                                                compiled: Path) -> None:
    """The defect and the traps, through the same model: what each other default does to a retried stage's -impl
    template and to a template without retries."""
    sft = next(i for i in kfp_instances(pipeline_spec(compiled / "klear-sft.yaml"))
               if i.task == "/sft" and i.retry_policy)
    driver = Instance("/sft", {"name": "system-container-driver", "container": {}}, {})
    dag = Instance("", {"name": "root", "dag": {}}, {})

    def retries(defaults: dict[str, Any] | None, instance: Instance) -> tuple[float, float]:
        strategy = run_strategies(defaults, instance)
        return argo_retries(strategy, "Failed"), argo_retries(strategy, "Error")

    # No default (KFP <= 2.16's manifests): OnFailure, so a deleted pod ends the run.
    assert retries(None, sft) == (3, 0)
    # KFP 2.17's own default: OnError replaces OnFailure, so a failed container (an OOM kill) is no longer retried,
    # and every driver and DAG template retries errors twice (a DAG retry runs its whole sub-graph again).
    stock = argo_config(KFP_2_17_DATA)["workflowDefaults"]["spec"]["templateDefaults"]
    assert retries(stock, sft) == (0, 3) and retries(stock, driver) == (0, 2) and retries(stock, dag) == (0, 2)
    # A policy without a limit: every template without retries would retry without end.
    assert retries({"retryStrategy": {"retryPolicy": "Always"}}, driver) == (math.inf, math.inf)
    # The chart's default.
    assert retries(template_defaults, sft) == (3, 3)
    assert retries(template_defaults, driver) == (0, 0) and retries(template_defaults, dag) == (0, 0)


def test_retried_tasks_are_the_documented_ones(compiled: Path) -> None:
    """What the docs say is retried (3 retries, 60 s backoff doubling): the sampling and judging slices, their
    merges, the training stages, and the registration (idempotent by content, against a server outside the
    cluster); nothing else in any compiled pipeline."""
    for name in PIPELINE_NAMES:
        path = compiled / f"{name}.yaml"
        ir = pipeline_spec(path)
        for instance in kfp_instances(ir):
            task = instance.container_task
            if task is None:
                continue
            component = ir["components"][task["componentRef"]["name"]]
            function = ir["deploymentSpec"]["executors"][component["executorLabel"]]["container"]["args"][3]
            merge_task = task.get("inputs", {}).get("parameters", {}).get("merge") == {"runtimeValue": {"constant": True}}
            documented = function in ("sample_slice", "judge_slice", "sft", "gppo", "register") or (
                function in ("sample", "judge") and merge_task)
            assert (instance.retry_policy is not None) == documented, f"{path.name} {instance.task} ({function})"
            if documented:
                assert instance.retry_policy == {"maxRetryCount": 3, "backoffDuration": "60s", "backoffFactor": 2.0,
                                                 "backoffMaxDuration": "3600s"}, f"{path.name} {instance.task}"


# --------------------------------------------------------------------------- the script itself


def test_the_script_keeps_the_rest_of_the_configmap(tmp_path: Path, rendered_strategy: str) -> None:
    done = run_script(tmp_path, KFP_2_17_DATA, rendered_strategy)
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load(done.stdout)["data"]
    assert data["executor"] == KFP_2_17_DATA["executor"]  # other keys untouched, byte for byte
    defaults = argo_config(data)["workflowDefaults"]["spec"]
    assert defaults["ttlStrategy"] == argo_config(KFP_2_17_DATA)["workflowDefaults"]["spec"]["ttlStrategy"]
    assert defaults["templateDefaults"] == {"retryStrategy": yaml.safe_load(rendered_strategy)}
    assert "{'limit': '2', 'retryPolicy': 'OnError'} -> {'limit': 0, 'retryPolicy': 'Always'}" in done.stderr
    again = run_script(tmp_path, data, rendered_strategy)  # idempotent
    assert again.returncode == 0 and yaml.safe_load(again.stdout)["data"] == data, again.stderr


@pytest.mark.parametrize("data", [{}, {"workflowDefaults": ""}, {"workflowDefaults": "spec:\n  parallelism: 4\n"}])
def test_the_script_adds_the_default_where_there_is_none(tmp_path: Path, rendered_strategy: str,
                                                         data: dict[str, str]) -> None:
    done = run_script(tmp_path, data, rendered_strategy)
    assert done.returncode == 0, done.stderr
    spec = argo_config(yaml.safe_load(done.stdout)["data"])["workflowDefaults"]["spec"]
    assert spec["templateDefaults"]["retryStrategy"] == {"limit": 0, "retryPolicy": "Always"}
    assert spec.get("parallelism") == yaml.safe_load(data.get("workflowDefaults") or "{}").get("spec", {}).get("parallelism")


def test_the_script_reads_argos_single_key_form(tmp_path: Path, rendered_strategy: str) -> None:
    config = "namespace: kubeflow\nworkflowDefaults:\n  spec:\n    serviceAccountName: runner\n"
    done = run_script(tmp_path, {"config": config}, rendered_strategy)
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load(done.stdout)["data"]
    assert list(data) == ["config"]
    merged = argo_config(data)
    assert merged["namespace"] == "kubeflow" and merged["workflowDefaults"]["spec"]["serviceAccountName"] == "runner"
    assert merged["workflowDefaults"]["spec"]["templateDefaults"]["retryStrategy"]["retryPolicy"] == "Always"


@pytest.mark.parametrize(("data", "strategy", "message"), [
    ({}, "retryPolicy: Always\n", "retryStrategy.limit must be 0"),
    ({}, "limit: 3\nretryPolicy: Always\n", "retryStrategy.limit must be 0"),
    ({}, "limit: 0\nretryPolicy: Sometimes\n", "retryStrategy.retryPolicy must be one of"),
    ({"workflowDefaults": "- spec\n"}, "limit: 0\nretryPolicy: Always\n", "data.workflowDefaults is not a YAML mapping"),
    ({"workflowDefaults": "spec:\n  templateDefaults: []\n"}, "limit: 0\nretryPolicy: Always\n",
     "data.workflowDefaults.spec.templateDefaults is not a mapping"),
])
def test_the_script_refuses_what_it_cannot_merge(tmp_path: Path, data: dict[str, str], strategy: str,
                                                 message: str) -> None:
    done = run_script(tmp_path, data, strategy)
    assert done.returncode != 0 and message in done.stderr, done.stderr


# --------------------------------------------------------------------------- what the chart renders


def test_the_job_sets_the_rendered_default_in_argos_configmap(objects: list[dict[str, Any]]) -> None:
    job = find(objects, "Job", "klear-argo-retry-defaults")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[:2] == ["python", "/scripts/argo_retry_defaults.py"]
    assert {"--retry-strategy=/scripts/retry-strategy.yaml", "--namespace=kubeflow",
            "--configmap=workflow-controller-configmap"} <= set(command)
    scripts = find(objects, "ConfigMap", "klear-argo-retry-defaults")
    assert scripts["data"]["argo_retry_defaults.py"] == SCRIPT.read_text()
    assert next(v for v in pod["volumes"] if v["name"] == "scripts")["configMap"]["name"] == scripts["metadata"]["name"]
    # The Job's account may read and update that one ConfigMap, in the controller's namespace, and nothing else.
    access = f"{NAMESPACE}-klear-argo-retry-defaults"
    role, binding = find(objects, "Role", access), find(objects, "RoleBinding", access)
    assert role["metadata"]["namespace"] == "kubeflow" == binding["metadata"]["namespace"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["workflow-controller-configmap"], "verbs": ["get", "update"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}]
    assert find(objects, "ServiceAccount")["metadata"]["name"] == pod["serviceAccountName"]


def test_argos_configmap_is_left_alone_unless_asked() -> None:
    names = [o["metadata"]["name"] for o in render(CREDENTIALS)]
    assert not [name for name in names if "argo-retry" in name]
    custom = render(merge(CREDENTIALS, {"argoRetryDefaults": {"enabled": True, "namespace": "argo",
                                                              "configMapName": "argo-controller"}}))
    command = find(custom, "Job", "klear-argo-retry-defaults")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--namespace=argo" in command and "--configmap=argo-controller" in command
    assert find(custom, "Role", f"{NAMESPACE}-klear-argo-retry-defaults")["metadata"]["namespace"] == "argo"
