"""Serving a published model: the chart's InferenceService (`serving` values) and the one the pipeline's serve step
applies are the same object (klear.serve.manifest), valid under KServe's own CRD schema (vendored, strict), and the
step's create-or-replace waits for the server that holds the new model (klear.serve.deploy)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from klear.serve.deploy import FIELD_MANAGER, deploy, serving_state
from klear.serve.manifest import (
    API_VERSION,
    PREDICTOR_CONTAINER,
    ServeSpec,
    endpoint_url,
    inference_service,
    pipeline_spec,
    server_args,
)
from tests.deploy.helpers import CHART, CREDENTIALS, NAMESPACE, RELEASE, find, merge, render, validation_errors

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

MODEL = "s3://klear/runs/run-1/gppo-code"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "serving": merge(CREDENTIALS, {"serving": {"enabled": True, "modelUri": MODEL}}),
    "serving-scheduled": merge(CREDENTIALS, {
        "imagePullSecrets": ["registry-credentials"],
        "images": {"registry": "registry.example.com/klear/", "tag": "1.2.3"},
        "s3": {"existingSecret": "store-credentials"},
        "serving": {"enabled": True, "modelUri": MODEL, "name": "klear-rl", "deploymentMode": "Standard",
                    "replicas": 2, "tensorParallelSize": 2, "maxModelLen": 40960, "extraArgs": ["--enable-prefix-caching"],
                    "resources": {"limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": 2}},
                    "tolerations": [GPU_TOLERATION], "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}),
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(values) for name, values in VALUE_SETS.items()}


def _image(values: dict[str, Any], role: str) -> str:
    images = values["images"]
    tag = images["tag"] or yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return f"{images['registry'].rstrip('/')}/{images[role]}:{tag}"


def spec_from_values(overrides: dict[str, Any], labels: dict[str, str]) -> ServeSpec:
    """The ServeSpec the chart's `serving` values describe, field by field (the chart's labels as rendered)."""
    values = merge(yaml.safe_load((CHART / "values.yaml").read_text()), overrides)
    s = values["serving"]
    return ServeSpec(
        name=s["name"] or f"{RELEASE}-serve", model_uri=s["modelUri"], server_image=s["image"] or _image(values, "gpu"),
        fetch_image=_image(values, "cpu"), served_model_name=s["servedModelName"],
        s3_secret=values["s3"]["existingSecret"] or values["s3"]["secretName"], deployment_mode=s["deploymentMode"],
        replicas=s["replicas"], port=s["port"], tensor_parallel_size=s["tensorParallelSize"],
        max_model_len=s["maxModelLen"], gpu_memory_utilization=s["gpuMemoryUtilization"], extra_args=s["extraArgs"],
        resources=s["resources"], cache_size=s["cacheSize"], shm_size=s["shmSize"], startup_seconds=s["startupSeconds"],
        pull_policy=values["images"]["pullPolicy"], image_pull_secrets=values["imagePullSecrets"],
        node_selector=s["nodeSelector"], tolerations=s["tolerations"], affinity=s["affinity"], labels=labels)


# --------------------------------------------------------------------------- the chart


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_lint_is_clean_and_the_inference_service_validates(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[case], strict=True, namespace=NAMESPACE, kube_version="v1.31.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]
    errors = [error for obj in rendered[case] for error in validation_errors(obj)]
    assert not errors, "\n".join(errors)
    assert find(rendered[case], "InferenceService")["apiVersion"] == API_VERSION


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_chart_renders_what_the_pipeline_applies(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    isvc = find(rendered[case], "InferenceService")
    labels = isvc["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "serve" and labels["app.kubernetes.io/instance"] == RELEASE
    assert isvc == inference_service(spec_from_values(VALUE_SETS[case], labels))


def test_the_server_is_the_teachers_command_and_only_the_copy_holds_credentials(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    isvc = find(rendered["serving"], "InferenceService")
    predictor = isvc["spec"]["predictor"]
    (server,), (fetch,) = predictor["containers"], predictor["initContainers"]
    teacher = find(render(merge(CREDENTIALS, {"teacher": {"enabled": True, "model": {"s3Uri": MODEL}}})), "Deployment")
    teacher_server = teacher["spec"]["template"]["spec"]["containers"][0]
    assert server["name"] == PREDICTOR_CONTAINER and server["command"] == teacher_server["command"]
    assert server["image"] == teacher_server["image"] == "klear/klear-gpu:0.1.0"
    assert {"--model=/model", "--reasoning-parser=deepseek_r1", "--host=0.0.0.0"} <= set(server["args"])
    assert set(teacher_server["args"]) >= {"--model=/model", "--reasoning-parser=deepseek_r1", "--host=0.0.0.0"}
    assert f"--port={server['ports'][0]['containerPort']}" in server["args"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1 and "--tensor-parallel-size=1" in server["args"]
    assert fetch["command"] == ["python", "-m", "klear.serve.fetch", MODEL, "/model"]
    assert fetch["envFrom"] == [{"secretRef": {"name": "klear-s3"}}] and fetch["image"] == "klear/klear-cpu:0.1.0"
    assert "envFrom" not in server and all("valueFrom" not in e for e in server.get("env", []))
    assert predictor["deploymentStrategy"] == {"type": "Recreate"}
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    scheduled = find(rendered["serving-scheduled"], "InferenceService")["spec"]["predictor"]
    assert scheduled["tolerations"] == [GPU_TOLERATION] and scheduled["imagePullSecrets"] == [
        {"name": "registry-credentials"}]
    assert scheduled["initContainers"][0]["envFrom"] == [{"secretRef": {"name": "store-credentials"}}]
    assert {"--max-model-len=40960", "--tensor-parallel-size=2"} <= set(scheduled["containers"][0]["args"])


def test_serving_is_optional_and_needs_a_model() -> None:
    assert not [o for o in render(CREDENTIALS) if o["kind"] == "InferenceService"]
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match="serving.modelUri is required"):
        chart.render(merge(CREDENTIALS, {"serving": {"enabled": True}}), name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("bad", [
    {"serving": {"enabled": True, "modelUri": "runs/run-1/gppo-code"}},
    {"serving": {"name": "Klear_RL"}},
    {"serving": {"name": "k" * 49}},
    {"serving": {"deploymentMode": "Serverless"}},
    {"serving": {"replicas": 0}},
    {"serving": {"maxModelLen": "40960"}},
    {"serving": {"modeluri": MODEL}},
])
def test_schema_refuses_wrong_serving_values(bad: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(merge(CREDENTIALS, bad))


def test_kserve_schema_catches_a_broken_inference_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    isvc = copy.deepcopy(find(rendered["serving"], "InferenceService"))
    isvc["spec"]["predictor"]["minReplica"] = 1  # misspelt
    isvc["spec"]["predictor"]["containers"][0]["ports"][0]["containerPort"] = "http"
    isvc["spec"]["predictor"]["deploymentStrategy"]["rollingUpdate"] = {"maxSurge": [1]}
    errors = validation_errors(isvc)
    assert any("minReplica" in e for e in errors) and any("containerPort" in e for e in errors), errors
    assert any("maxSurge" in e for e in errors), errors


def test_role_lets_the_pipeline_apply_inference_services(rendered: dict[str, list[dict[str, Any]]]) -> None:
    role = find(rendered["serving"], "Role")
    grants = {(group, resource): set(rule["verbs"]) for rule in role["rules"]
              for group in rule["apiGroups"] for resource in rule["resources"]}
    # Server-side apply is a PATCH that creates the object when it is new; the wait reads it.
    assert grants[(API_VERSION.split("/")[0], "inferenceservices")] >= {"create", "patch", "get"}


# --------------------------------------------------------------------------- the pipeline step's manifest


def test_the_pipeline_steps_inference_service_validates() -> None:
    spec = pipeline_spec(MODEL, "klear-reasoner", "2", "16", "128Gi", {"pool": "gpu"}, [GPU_TOLERATION],
                         "registry.example.com/klear-gpu:1.2.3", "registry.example.com/klear-cpu:1.2.3", "klear-s3")
    isvc = inference_service(spec)
    assert validation_errors(isvc) == []
    server = isvc["spec"]["predictor"]["containers"][0]
    assert "--tensor-parallel-size=2" in server["args"] and "--served-model-name=klear-reasoner" in server["args"]
    assert server["resources"]["limits"] == {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": 2}
    assert isvc["spec"]["predictor"]["nodeSelector"] == {"pool": "gpu"}
    assert endpoint_url("klear-reasoner", NAMESPACE) == f"http://klear-reasoner-predictor.{NAMESPACE}.svc.cluster.local/v1"


@pytest.mark.parametrize(("change", "message"), [
    ({"name": "Klear"}, "name 'Klear'"), ({"name": "k" * 49}, "at most 48"),
    ({"model_uri": "/models/rl"}, "model_uri"), ({"deployment_mode": "Serverless"}, "Knative"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"), ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
])
def test_bad_settings_are_refused_by_name(change: dict[str, Any], message: str) -> None:
    spec = ServeSpec(**{"name": "klear-rl", "model_uri": MODEL, "server_image": "g", "fetch_image": "c", **change})
    with pytest.raises(ValueError, match=message):
        inference_service(spec)


def test_the_steps_gpu_count_must_be_whole() -> None:
    with pytest.raises(ValueError, match="gpus 'one'"):
        pipeline_spec(MODEL, "klear-rl", "one", "1", "1Gi", {}, [], "g", "c", "klear-s3")


def test_server_args_follow_the_settings() -> None:
    spec = ServeSpec(name="klear-rl", model_uri=MODEL, server_image="g", fetch_image="c", port=9000, max_model_len=0,
                     extra_args=("--dtype=float32",))
    args = server_args(spec, model_dir="/tmp/m", host="127.0.0.1")
    assert args[:3] == ["--model=/tmp/m", "--served-model-name=klear-reasoner", "--host=127.0.0.1"]
    assert "--port=9000" in args and args[-1] == "--dtype=float32"
    assert not [a for a in args if a.startswith("--max-model-len")]  # 0: the model's own length


# --------------------------------------------------------------------------- create or replace, then wait


class Cluster:
    """KServe's side of the two calls, in memory: an apply bumps the generation when the spec changes and records
    the manager's time; `steps` then play the controller, one status per `get` after the apply."""

    def __init__(self, existing: dict[str, Any] | None = None, steps: list[dict[str, Any]] | None = None) -> None:
        self.obj, self.steps, self.applied = existing, list(steps or []), 0
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.applied += 1
        self.now += timedelta(seconds=60)
        old = self.obj or {"metadata": {"generation": 0}, "spec": None}
        generation = old["metadata"]["generation"] + (manifest["spec"] != old["spec"])
        self.obj = {**copy.deepcopy(manifest), "status": (self.obj or {}).get("status", {}),
                    "metadata": {**manifest["metadata"], "generation": generation,
                                 "managedFields": [{"manager": FIELD_MANAGER, "time": self.now.isoformat()}]}}
        return copy.deepcopy(self.obj)

    def get(self, name: str) -> dict[str, Any] | None:
        if self.obj is not None and self.applied and self.steps:
            self.obj["status"] = self.steps.pop(0)
        return copy.deepcopy(self.obj)


def _status(ready: str, at: datetime, **model: Any) -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": at.isoformat()}],
            "url": "http://klear-rl.team-a.example.com", "modelStatus": model}


def _manifest(uri: str = MODEL) -> dict[str, Any]:
    return inference_service(ServeSpec(name="klear-rl", model_uri=uri, server_image="g", fetch_image="c"))


def test_a_new_service_is_ready_when_kserve_says_so() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=61)
    cluster = Cluster(steps=[{}, _status("False", start, transitionStatus="InProgress"), _status("True", start)])
    assert deploy(cluster, _manifest(), timeout_s=60, poll_s=0, sleep=lambda s: None) == "http://klear-rl.team-a.example.com"
    assert cluster.applied == 1 and cluster.obj is not None and cluster.obj["metadata"]["generation"] == 1


def test_a_replaced_model_waits_for_the_new_server_not_the_old_ready() -> None:
    old = _manifest("s3://klear/runs/run-0/gppo-code")
    long_ago = datetime(2025, 12, 1, tzinfo=UTC)
    existing = {**old, "metadata": {**old["metadata"], "generation": 3}, "status": _status("True", long_ago)}
    after = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=90)
    # The old Ready first (stale), then Recreate takes it down, then the new server is ready.
    cluster = Cluster(existing, [_status("True", long_ago), _status("True", long_ago), _status("False", after),
                                 _status("True", after + timedelta(seconds=30))])
    seen: list[str] = []
    deploy(cluster, _manifest(), timeout_s=60, poll_s=0, sleep=lambda s: seen.append("slept"))
    assert cluster.steps == [] and len(seen) == 3  # not ready at the first, stale, look
    assert cluster.obj is not None and cluster.obj["metadata"]["generation"] == 4
    # Applying the same spec again changes nothing: the Ready it finds counts at once.
    assert deploy(cluster, _manifest(), timeout_s=60, poll_s=0, sleep=lambda s: None)
    assert cluster.obj["metadata"]["generation"] == 4


def test_a_model_that_cannot_load_fails_the_step_with_kserves_reason() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=61)
    failed = _status("False", at, transitionStatus="BlockedByFailedLoad",
                     lastFailureInfo={"reason": "ModelLoadFailed", "message": "CUDA out of memory", "exitCode": 1})
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        deploy(Cluster(steps=[failed]), _manifest(), timeout_s=60, poll_s=0, sleep=lambda s: None)
    ticks = iter(range(1000))
    with pytest.raises(RuntimeError, match="not ready after 5 s"):
        deploy(Cluster(steps=[_status("False", at)] * 50), _manifest(), timeout_s=5, poll_s=1,
               clock=lambda: float(next(ticks)), sleep=lambda s: None)


def test_serving_state_reads_the_status() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert serving_state({}, None) == ("waiting", "no Ready condition yet")
    assert serving_state({"status": _status("True", at)}, None)[0] == "ready"
    assert serving_state({"status": _status("True", at)}, at + timedelta(seconds=1))[0] == "waiting"
    state, why = serving_state({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Pending",
                                                           "message": "0/1 replicas"}]}}, None)
    assert (state, why) == ("waiting", "Pending: 0/1 replicas")
