"""The Helm chart (charts/klear-reasoner), linted and rendered by Helm's own Go SDK (helm-python-sdk), every manifest
validated against Kubernetes' schemas, and what each object must say for the pipeline to work on a cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helpers import CHART, CREDENTIALS, NAMESPACE, RELEASE, ROOT, find, merge, pod_specs, render, validation_errors

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_NODES = {"nvidia.com/gpu.product": "NVIDIA-H200"}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": CREDENTIALS,
    "existing-secret": {"s3": {"existingSecret": "klear-s3"}},
    "teacher-from-s3": merge(CREDENTIALS, {"teacher": {"enabled": True, "model": {"s3Uri": "s3://models/DeepSeek-R1/"}}}),
    "teacher-from-pvc": merge(CREDENTIALS, {"teacher": {"enabled": True, "model": {
        "source": "pvc", "pvc": {"claimName": "models", "subPath": "DeepSeek-R1"}}}}),
    "upload-job": merge(CREDENTIALS, {"uploadJob": {"enabled": True, "namespaced": True,
                                                    "serviceAccountName": "default-editor"}}),
    "scheduled": merge(CREDENTIALS, {
        "imagePullSecrets": ["registry-credentials"],
        "images": {"registry": "registry.example.com/klear/", "tag": "1.2.3"},
        "teacher": {"enabled": True, "model": {"s3Uri": "s3://models/r1"}, "tolerations": [GPU_TOLERATION],
                    "nodeSelector": GPU_NODES},
        "uploadJob": {"enabled": True, "tolerations": [GPU_TOLERATION], "nodeSelector": {"pool": "cpu"}},
        "argoRetryDefaults": {"enabled": True, "tolerations": [GPU_TOLERATION], "nodeSelector": {"pool": "cpu"}},
        "trainingRuntime": {"create": True, "tolerations": [GPU_TOLERATION], "nodeSelector": GPU_NODES}}),
    "deny-all": merge(CREDENTIALS, {"networkPolicy": {"allowDNS": False, "allowWithinGroup": False, "egress": []},
                                    "launcherConfig": {"create": False}, "rbac": {"create": False}}),
    "api-server": merge(CREDENTIALS, {"networkPolicy": {"apiServer": {"cidrs": ["172.18.0.2/32"]}}}),
    "https-store": merge(CREDENTIALS, {"s3": {"endpoint": "https://s3.eu-west-1.amazonaws.com", "region": "eu-west-1"}}),
    "tracking": merge(CREDENTIALS, {"tracking": {"mlflowTrackingUri": "https://mlflow.example.com",
                                                 "mlflowTrackingPassword": "pw", "wandbApiKey": "key"}}),
    "argo-retry-defaults": merge(CREDENTIALS, {"argoRetryDefaults": {"enabled": True}}),
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(values) for name, values in VALUE_SETS.items()}


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_lint_is_clean(case: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[case], strict=True, namespace=NAMESPACE, kube_version="v1.31.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 = info ("icon is recommended")
    assert not problems and not report["errors"], problems or report["errors"]


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_every_manifest_validates(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    objects = rendered[case]
    assert objects
    errors = [error for obj in objects for error in validation_errors(obj)]
    assert not errors, "\n".join(errors)


def test_validation_catches_a_broken_manifest(rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployment = json.loads(json.dumps(find(rendered["teacher-from-s3"], "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    runtime = json.loads(json.dumps(find(rendered["scheduled"], "ClusterTrainingRuntime")))
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["tolerations"] = "x"
    runtime["spec"]["mlPolicy"]["torchh"] = {}
    assert any("containerPort" in e for e in validation_errors(deployment))
    errors = validation_errors(runtime)
    assert any("tolerations" in e for e in errors) and any("torchh" in e for e in errors), errors


def test_every_kind_has_a_schema(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {obj["kind"] for objects in rendered.values() for obj in objects}
    expected = {"Secret", "ConfigMap", "Role", "RoleBinding", "NetworkPolicy", "Deployment", "Service", "Job",
                "ClusterTrainingRuntime", "ServiceAccount"}
    assert kinds == expected  # a new kind must be added here and validated (validation_errors raises if unknown)


# --------------------------------------------------------------------------- values.schema.json


@pytest.mark.parametrize("bad", [
    {"teacher": {"enabled": "yes"}},
    {"teacher": {"port": "8000"}},
    {"teacher": {"model": {"source": "hub"}}},
    {"s3": {"endpoint": "seaweedfs:8333"}},
    {"networkPolicy": {"enabeld": True}},
    {"rbac": {"serviceAccounts": "pipeline-runner"}},
    {"teacher": {"tolerations": [{"key": "gpu", "effect": "Sometimes"}]}},
    {"uploadJob": {"kfpHost": "ml-pipeline:8888"}},
    {"networkPolicy": {"apiServer": {"cidrs": ["kubernetes.default"]}}},
    {"argoRetryDefaults": {"enabled": True, "namespace": "Kube Flow"}},
    {"argoRetryDefaults": {"enabled": True, "retryPolicy": "Always"}},
])
def test_schema_refuses_wrong_values(bad: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(merge(CREDENTIALS, {}))
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(merge(CREDENTIALS, bad))
        with pytest.raises(helm.HelmError):  # an install renders through the same check
            chart.render(merge(CREDENTIALS, bad), name=RELEASE, namespace=NAMESPACE)


def test_missing_credentials_are_refused() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match="s3.accessKeyId is required"):
        chart.render({}, name=RELEASE, namespace=NAMESPACE)


# --------------------------------------------------------------------------- S3 and KFP's launcher


def _providers(objects: list[dict[str, Any]]) -> dict[str, Any]:
    launcher = find(objects, "ConfigMap", "kfp-launcher")
    return yaml.safe_load(launcher["data"]["providers"])


def test_secret_holds_what_the_stages_read(rendered: dict[str, list[dict[str, Any]]]) -> None:
    secret = find(rendered["defaults"], "Secret")
    assert secret["metadata"]["name"] == "klear-s3"  # pipelines/definitions.py: S3_SECRET
    assert set(secret["stringData"]) >= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"}
    assert secret["stringData"]["AWS_REGION"] == "us-east-1"
    source = (ROOT / "pipelines" / "definitions.py").read_text()
    assert re.search(r'S3_SECRET\s*=\s*"klear-s3"', source), "the pipelines read another Secret: keep the names equal"


def test_launcher_config_follows_the_store(rendered: dict[str, list[dict[str, Any]]]) -> None:
    launcher = find(rendered["defaults"], "ConfigMap", "kfp-launcher")
    assert launcher["data"]["defaultPipelineRoot"].startswith("s3://")
    secret = find(rendered["defaults"], "Secret")
    default = _providers(rendered["defaults"])["s3"]["default"]
    # KFP wants host[:port] without a scheme; http:// means TLS off.
    assert default["endpoint"] == "seaweedfs.kubeflow.svc.cluster.local:8333" and default["disableSSL"] is True
    assert default["region"] == secret["stringData"]["AWS_REGION"] and default["forcePathStyle"] is True
    ref = default["credentials"]["secretRef"]
    assert default["credentials"]["fromEnv"] is False and ref["secretName"] == secret["metadata"]["name"]
    assert {ref["accessKeyKey"], ref["secretKeyKey"]} <= set(secret["stringData"])
    aws = _providers(rendered["https-store"])["s3"]["default"]
    assert aws["endpoint"] == "s3.eu-west-1.amazonaws.com" and aws["disableSSL"] is False and aws["region"] == "eu-west-1"


def test_existing_secret_replaces_the_chart_secret(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["existing-secret"]
    assert not [o for o in objects if o["kind"] == "Secret"]
    assert _providers(objects)["s3"]["default"]["credentials"]["secretRef"]["secretName"] == "klear-s3"


def test_launcher_config_can_be_left_to_kubeflow(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert not [o for o in rendered["deny-all"] if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "kfp-launcher"]


# --------------------------------------------------------------------------- RBAC


def test_role_covers_what_the_job_launcher_does(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["defaults"]
    role, binding = find(objects, "Role"), find(objects, "RoleBinding")
    grants = {(group, resource): set(rule["verbs"]) for rule in role["rules"]
              for group in rule["apiGroups"] for resource in rule["resources"]}
    # The (group, plural) pairs klear.training.trainjob calls the API with.
    source = (ROOT / "components" / "klear" / "training" / "trainjob.py").read_text()
    used = set(re.findall(r'"([a-z.]+\.org)", "v1\w*", "(\w+jobs)"', source))
    assert used == {("trainer.kubeflow.org", "trainjobs"), ("kubeflow.org", "pytorchjobs")}
    for pair in used:
        assert grants[pair] >= {"create", "get", "list", "watch", "delete"}, pair
    assert grants[("", "pods")] >= {"get", "list", "watch"} and grants[("", "pods/log")] >= {"get"}
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": NAMESPACE}]


# --------------------------------------------------------------------------- NetworkPolicy


def test_network_policy_closes_untrusted_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]["podLabel"]
    assert values == {"key": "klear.io/runs-untrusted-code", "value": "true"}  # docs and pipeline use this label
    group = {"podSelector": {"matchLabels": {values["key"]: values["value"]}}}
    policy = find(rendered["defaults"], "NetworkPolicy")["spec"]
    assert policy["podSelector"] == group["podSelector"]
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["ingress"] == [{"from": [group]}]
    peers = [peer for rule in policy["egress"] for peer in rule["to"]]
    assert group in peers
    dns = [rule for rule in policy["egress"] if {p["port"] for p in rule.get("ports", [])} == {53}]
    assert len(dns) == 1 and dns[0]["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert not [peer for peer in peers if "ipBlock" in peer]  # nothing outside the cluster (the lookup is offline)
    api = [rule for rule in find(rendered["api-server"], "NetworkPolicy")["spec"]["egress"]
           if any("ipBlock" in peer for peer in rule["to"])]
    assert api == [{"to": [{"ipBlock": {"cidr": "172.18.0.2/32"}}],
                    "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}]
    strict = find(rendered["deny-all"], "NetworkPolicy")["spec"]
    assert strict["ingress"] == [] and strict["egress"] == [] and sorted(strict["policyTypes"]) == ["Egress", "Ingress"]


# --------------------------------------------------------------------------- teacher


def test_teacher_serves_r1_with_its_reasoning_parser(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["teacher-from-s3"]
    deployment, service = find(objects, "Deployment"), find(objects, "Service")
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert server["args"][0] == "--model=/model" and "--reasoning-parser=deepseek_r1" in server["args"]
    assert server["image"] == "klear/klear-gpu:0.1.0"
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert f"--tensor-parallel-size={server['resources']['limits']['nvidia.com/gpu']}" in server["args"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/health" and "startupProbe" in server
    port = {p["name"]: p["containerPort"] for p in server["ports"]}["http"]
    assert f"--port={port}" in server["args"] and service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    # Credentials only in the init container that copies the model; the server never holds them.
    fetch = pod["initContainers"][0]
    assert fetch["envFrom"] == [{"secretRef": {"name": "klear-s3"}}] and "s3://models/DeepSeek-R1/" in fetch["command"]
    assert "envFrom" not in server and all("valueFrom" not in e for e in server.get("env", []))
    script = find(objects, "ConfigMap", f"{RELEASE}-teacher-fetch")["data"]["fetch_model.py"]
    assert script == (CHART / "files" / "fetch_model.py").read_text()


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_teacher_from_a_claim_needs_no_copy(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = find(rendered["teacher-from-pvc"], "Deployment")["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    model = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount["subPath"] == "DeepSeek-R1"


def test_teacher_is_optional(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert not [o for o in rendered["defaults"] if o["kind"] in ("Deployment", "Service", "Job")]


# --------------------------------------------------------------------------- upload Job, runtime, scheduling


def test_upload_job_runs_the_shipped_script(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["upload-job"]
    job = find(objects, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "klear/klear-cpu:0.1.0" and pod["serviceAccountName"] == "default-editor"
    assert container["command"][:2] == ["python", "/scripts/upload_pipelines.py"]
    assert "--folder=/opt/klear/pipelines/compiled" in container["command"]
    assert f"--namespace={NAMESPACE}" in container["command"] and "--version=0.1.0" in container["command"]
    token = next(v for v in pod["volumes"] if v["name"] == "kfp-token")
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "pipelines.kubeflow.org"
    script = find(objects, "ConfigMap", f"{RELEASE}-upload-pipelines")["data"]["upload_pipelines.py"]
    assert script == (CHART / "files" / "upload_pipelines.py").read_text()


def test_scheduling_values_reach_every_pod(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["scheduled"]
    workloads = [o for o in objects if pod_specs(o)]
    assert {o["kind"] for o in workloads} == {"Deployment", "Job", "ClusterTrainingRuntime"}
    for obj in workloads:
        for pod in pod_specs(obj):
            assert pod["tolerations"] == [GPU_TOLERATION], obj["kind"]
            assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}], obj["kind"]
            assert pod["nodeSelector"] in (GPU_NODES, {"pool": "cpu"}), obj["kind"]
            images = {c["image"] for c in pod["containers"] + pod.get("initContainers", [])}
            assert images <= {"registry.example.com/klear/klear-cpu:1.2.3", "registry.example.com/klear/klear-gpu:1.2.3"}


def test_training_runtime_labels_its_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    runtime = find(rendered["scheduled"], "ClusterTrainingRuntime")
    assert "namespace" not in runtime["metadata"]
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    assert node["name"] == "node"  # TrainJob's runtimePatches target this name (klear.training.trainjob)
    assert node["template"]["spec"]["template"]["metadata"]["labels"] == {"klear.io/runs-untrusted-code": "true"}
    assert node["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == "node"


@pytest.mark.parametrize("case", ["scheduled", "teacher-from-pvc", "upload-job"])
def test_pods_run_as_non_root(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    for obj in rendered[case]:
        if obj["kind"] == "ClusterTrainingRuntime":
            continue  # Trainer fills in the container; the image itself runs as a non-root user
        for pod in pod_specs(obj):
            for container in pod["containers"] + pod.get("initContainers", []):
                security = container["securityContext"]
                assert security["runAsNonRoot"] and security["allowPrivilegeEscalation"] is False, obj["kind"]
                assert security["capabilities"]["drop"] == ["ALL"]


# --------------------------------------------------------------------------- the upload script


class _Page:
    def __init__(self, **items: Any) -> None:
        self.__dict__.update(items)


class FakeKfp:
    """The four kfp.Client calls upload_pipelines.py makes, over an in-memory store."""

    def __init__(self, pipelines: dict[str, list[str]]) -> None:
        self.pipelines = pipelines  # name -> version names
        self.calls: list[tuple[str, str, str | None]] = []

    @staticmethod
    def _wanted(filter: str) -> str:
        return json.loads(filter)["predicates"][0]["stringValue"]

    def list_pipelines(self, filter: str, namespace: str | None, page_size: int) -> _Page:
        name = self._wanted(filter)
        return _Page(pipelines=[_Page(pipeline_id=name)] if name in self.pipelines else None)

    def list_pipeline_versions(self, pipeline_id: str, filter: str, page_size: int) -> _Page:
        version = self._wanted(filter)
        return _Page(pipeline_versions=[_Page()] if version in self.pipelines[pipeline_id] else None)

    def upload_pipeline(self, path: str, pipeline_name: str, description: str, namespace: str | None) -> None:
        self.calls.append(("pipeline", pipeline_name, namespace))
        self.pipelines[pipeline_name] = [pipeline_name]

    def upload_pipeline_version(self, path: str, pipeline_version_name: str, pipeline_id: str) -> None:
        self.calls.append(("version", pipeline_id, pipeline_version_name))
        self.pipelines[pipeline_id].append(pipeline_version_name)


def _upload_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("upload_pipelines", CHART / "files" / "upload_pipelines.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compiled(folder: Path, *names: str) -> Path:
    for name in names:  # the part of a compiled pipeline the script reads
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({"pipelineInfo": {"name": name}, "root": {}}))
    return folder


def test_upload_adds_pipelines_then_versions(tmp_path: Path) -> None:
    upload = _upload_module()
    folder = _compiled(tmp_path, "klear-reasoner", "klear-sft")
    kfp = FakeKfp({"klear-sft": ["klear-sft", "0.0.9"]})
    assert upload.upload_all(kfp, folder, "0.1.0", "team-a") == ["klear-reasoner: new pipeline",
                                                                 "klear-sft: new version 0.1.0"]
    assert kfp.calls == [("pipeline", "klear-reasoner", "team-a"), ("version", "klear-sft", "0.1.0")]
    kfp.calls.clear()
    assert upload.upload_all(kfp, folder, "0.1.0", "team-a")[1] == "klear-sft: version 0.1.0 already there"
    assert kfp.calls == [("version", "klear-reasoner", "0.1.0")]  # the new pipeline's first version had its own name
    with pytest.raises(SystemExit, match="no compiled pipelines"):
        upload.upload_all(kfp, tmp_path / "missing", "0.1.0")


def test_upload_script_calls_kfp_as_it_is() -> None:
    """The fake above mirrors kfp.Client: the keyword arguments the script passes exist in the pinned kfp."""
    import inspect

    import kfp
    from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

    used = {"list_pipelines": {"filter", "namespace", "page_size"},
            "list_pipeline_versions": {"pipeline_id", "filter", "page_size"},
            "upload_pipeline": {"pipeline_package_path", "pipeline_name", "description", "namespace"},
            "upload_pipeline_version": {"pipeline_package_path", "pipeline_version_name", "pipeline_id"},
            "__init__": {"host", "credentials"}}
    for method, names in used.items():
        assert names <= set(inspect.signature(getattr(kfp.Client, method)).parameters), method
    assert "path" in inspect.signature(ServiceAccountTokenVolumeCredentials).parameters
    source = (CHART / "files" / "upload_pipelines.py").read_text()
    assert "ServiceAccountTokenVolumeCredentials(TOKEN)" in source and "kfp.Client(host=args.host" in source


def test_tracking_secret_holds_only_the_keys_given(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from klear.common.tracking import TRACKING_SECRET, TRACKING_SECRET_KEYS

    assert [o for o in rendered["defaults"] if o["kind"] == "Secret" and o["metadata"]["name"] == TRACKING_SECRET] == []
    (secret,) = [o for o in rendered["tracking"] if o["kind"] == "Secret" and o["metadata"]["name"] == TRACKING_SECRET]
    assert secret["stringData"] == {"MLFLOW_TRACKING_URI": "https://mlflow.example.com", "MLFLOW_TRACKING_PASSWORD": "pw",
                                    "WANDB_API_KEY": "key"}
    assert set(secret["stringData"]) <= set(TRACKING_SECRET_KEYS)  # what the training pods read from it
