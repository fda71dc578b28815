"""The chart's teacher as a scaled service: replicas, a HorizontalPodAutoscaler, and one server over several nodes
(a LeaderWorkerSet running vLLM's multi-node executor), rendered by Helm's Go SDK, linted, and validated against
Kubernetes' schemas and the LeaderWorkerSet envelope in tests/deploy/helpers.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.deploy.helpers import CHART, CREDENTIALS, NAMESPACE, RELEASE, find, merge, render, validation_errors

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

R1 = {"enabled": True, "model": {"s3Uri": "s3://models/DeepSeek-R1/"}}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "replicas": merge(CREDENTIALS, {"teacher": merge(R1, {"replicas": 3})}),
    "autoscaled": merge(CREDENTIALS, {"teacher": merge(R1, {"autoscaling": {"enabled": True, "maxReplicas": 6}})}),
    "multi-node": merge(CREDENTIALS, {"teacher": merge(R1, {"replicas": 2, "multiNode": {"enabled": True, "nodes": 2},
                                                            "tolerations": [GPU_TOLERATION]})}),
    "multi-node-autoscaled": merge(CREDENTIALS, {"teacher": {
        "enabled": True, "model": {"source": "pvc", "pvc": {"claimName": "models", "subPath": "DeepSeek-R1"}},
        "multiNode": {"enabled": True, "nodes": 4}, "autoscaling": {"enabled": True}}}),
}
NAME = f"{RELEASE}-teacher"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(values) for name, values in VALUE_SETS.items()}


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_lint_is_clean_and_every_manifest_validates(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[case], strict=True, namespace=NAMESPACE, kube_version="v1.31.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]
    errors = [error for obj in rendered[case] for error in validation_errors(obj)]
    assert not errors, "\n".join(errors)


def test_replicas_without_autoscaling(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["replicas"]
    assert find(objects, "Deployment", NAME)["spec"]["replicas"] == 3
    assert not [o for o in objects if o["kind"] in ("HorizontalPodAutoscaler", "LeaderWorkerSet")]


def test_autoscaler_owns_the_replica_count(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["autoscaled"]
    deployment, hpa = find(objects, "Deployment", NAME), find(objects, "HorizontalPodAutoscaler", NAME)
    assert "replicas" not in deployment["spec"]  # a chart upgrade must not reset what the autoscaler set
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm:num_requests_waiting"
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 600


def _pod(template: dict[str, Any]) -> dict[str, Any]:
    return template["spec"]


def test_multi_node_server_is_a_leader_worker_set(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["multi-node"]
    assert not [o for o in objects if o["kind"] == "Deployment"]
    lws, service = find(objects, "LeaderWorkerSet", NAME), find(objects, "Service", NAME)
    spec = lws["spec"]
    assert spec["replicas"] == 2 and spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["startupPolicy"] == "LeaderCreated"  # the leader turns ready only after its workers joined
    leader_template, worker_template = (spec["leaderWorkerTemplate"][k] for k in ("leaderTemplate", "workerTemplate"))
    leader, worker = _pod(leader_template)["containers"][0], _pod(worker_template)["containers"][0]

    distributed = {"--tensor-parallel-size=8", "--pipeline-parallel-size=2", "--nnodes=2",
                   "--master-addr=$(LWS_LEADER_ADDRESS)", "--distributed-executor-backend=mp"}
    assert leader["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert distributed | {"--node-rank=0", "--model=/model", "--reasoning-parser=deepseek_r1"} <= set(leader["args"])
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health" and leader["ports"][0]["name"] == "http"
    assert worker["command"][-3:] == ["serve", "/model", "--headless"]
    assert distributed | {"--node-rank=$(LWS_WORKER_INDEX)"} <= set(worker["args"])
    assert not {"ports", "readinessProbe", "startupProbe"} & set(worker)
    assert not [a for a in worker["args"] if a.startswith(("--port", "--served-model-name"))]
    # The Service reaches the leaders (the API servers) only.
    selector = service["spec"]["selector"].items()
    assert selector <= leader_template["metadata"]["labels"].items()
    assert not selector <= worker_template["metadata"]["labels"].items()
    for template in (leader_template, worker_template):  # every pod copies the model and is scheduled alike
        pod = _pod(template)
        assert pod["initContainers"][0]["name"] == "fetch-model" and pod["tolerations"] == [GPU_TOLERATION]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert pod["securityContext"]["runAsNonRoot"] and "envFrom" not in pod["containers"][0]


def test_multi_node_autoscaler_scales_groups(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["multi-node-autoscaled"]
    lws, hpa = find(objects, "LeaderWorkerSet", NAME), find(objects, "HorizontalPodAutoscaler", NAME)
    assert "replicas" not in lws["spec"] and lws["spec"]["leaderWorkerTemplate"]["size"] == 4
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                             "name": NAME}
    worker = _pod(lws["spec"]["leaderWorkerTemplate"]["workerTemplate"])
    assert "initContainers" not in worker and worker["volumes"][0]["persistentVolumeClaim"]["claimName"] == "models"
    assert "--pipeline-parallel-size=4" in worker["containers"][0]["args"]


def test_leader_worker_set_schema_catches_a_broken_manifest(rendered: dict[str, list[dict[str, Any]]]) -> None:
    lws = json.loads(json.dumps(find(rendered["multi-node"], "LeaderWorkerSet", NAME)))
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["ports"] = [{"containerPort": "x"}]
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    errors = validation_errors(lws)
    assert any("sise" in e for e in errors) and any("restartPolicy" in e for e in errors), errors
    assert any("containerPort" in e or "'x'" in e for e in errors), errors


@pytest.mark.parametrize("bad", [
    {"teacher": {"multiNode": {"nodes": 1}}},
    {"teacher": {"replicas": "2"}},
    {"teacher": {"autoscaling": {"maxReplica": 4}}},
    {"teacher": {"autoscaling": {"metrics": []}}},
])
def test_schema_refuses_wrong_scaling_values(bad: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(merge(CREDENTIALS, bad))
