"""Multi-node training stages (sft, gppo) through Kubeflow Trainer: the job manifest, its schema check, and a launcher.

Two job kinds, same command on every node (`accelerate launch` with the ZeRO-3 config, one process
per GPU, node rank and rendezvous from the variables the operator injects):

  PyTorchJob (kubeflow.org/v1, Training Operator v1): Master + Workers; env RANK, MASTER_ADDR, MASTER_PORT
  TrainJob   (trainer.kubeflow.org/v1alpha1, Trainer v2): numNodes on the `torch-distributed` runtime;
             env PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT

S3 credentials come from a Secret as environment variables; /dev/shm is a RAM-backed emptyDir
(NCCL and the data loaders need more than the container default of 64 MB). The launcher creates
the job, streams the master pod's log, and raises when the job fails.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from klear.training.launch import accelerate_command, shell_line

if TYPE_CHECKING:
    from klear.training.stage import TrainingStage

log = logging.getLogger("klear.trainjob")

S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")
V1_VARS = ("$RANK", "$MASTER_ADDR", "$MASTER_PORT")
V2_VARS = ("$PET_NODE_RANK", "$PET_MASTER_ADDR", "$PET_MASTER_PORT")
K8S_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"


@dataclass(frozen=True)
class JobSpec:
    name: str
    image: str
    stage: TrainingStage  # handed in by the stage's component: this module imports no stage
    nodes: int
    gpus_per_node: int
    model: str
    data: list[str]
    output: str
    preset: str = "paper"
    overrides: list[str] = field(default_factory=list)
    namespace: str = "kubeflow"
    s3_secret: str = "klear-s3"
    shm_size: str = "64Gi"
    cpu: str = "64"  # per node; the pipelines' defaults for an 8-GPU node
    memory: str = "512Gi"
    runtime: str = "torch-distributed"  # Trainer v2 ClusterTrainingRuntime


def _command(spec: JobSpec, variables: tuple[str, str, str]) -> list[str]:
    rank, address, port = variables
    argv = accelerate_command(spec.stage, spec.model, spec.data, spec.output, spec.preset, spec.overrides, spec.gpus_per_node,
                              nodes=spec.nodes, machine_rank=rank, main_address=address, main_port=port, python="python")
    return ["bash", "-c", "exec " + shell_line(argv, variables)]


def _env(spec: JobSpec) -> list[dict[str, Any]]:
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": spec.s3_secret, "key": key}}} for key in S3_KEYS]


def _resources(spec: JobSpec) -> dict[str, Any]:
    amounts = {"cpu": spec.cpu, "memory": spec.memory, "nvidia.com/gpu": str(spec.gpus_per_node)}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _shm_volume(spec: JobSpec) -> dict[str, Any]:
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}


def render_pytorchjob(spec: JobSpec) -> dict[str, Any]:
    def replica(count: int) -> dict[str, Any]:
        container = {"name": "pytorch", "image": spec.image, "command": _command(spec, V1_VARS), "env": _env(spec),
                     "resources": _resources(spec), "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [container], "volumes": [_shm_volume(spec)]}}}

    replicas = {"Master": replica(1)}
    if spec.nodes > 1:
        replicas["Worker"] = replica(spec.nodes - 1)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": {"app.kubernetes.io/part-of": "klear"}},
            "spec": {"runPolicy": {"backoffLimit": 3, "cleanPodPolicy": "None"}, "pytorchReplicaSpecs": replicas}}


def render_trainjob(spec: JobSpec) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": {"app.kubernetes.io/part-of": "klear"}},
            "spec": {"runtimeRef": {"name": spec.runtime},
                     "trainer": {"image": spec.image, "command": _command(spec, V2_VARS), "env": _env(spec),
                                 "numNodes": spec.nodes, "resourcesPerNode": _resources(spec)},
                     "podSpecOverrides": [{"targetJobs": [{"name": "node"}], "volumes": [_shm_volume(spec)],
                                           "containers": [{"name": "node", "volumeMounts": [
                                               {"name": "dshm", "mountPath": "/dev/shm"}]}]}]}}


# --------------------------------------------------------------------------- schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"{K8S_DEFINITIONS}#/$defs/{name}"}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_REPLICA = _closed({"replicas": {"type": "integer", "minimum": 0},
                    "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                    "template": _ref("io.k8s.api.core.v1.PodTemplateSpec")}, ("replicas", "template"))

SCHEMAS: dict[str, dict[str, Any]] = {
    # Kubeflow Training Operator v1 PyTorchJob: the envelope; pod templates are checked by Kubernetes' own schema.
    "PyTorchJob": _closed({
        "apiVersion": {"const": "kubeflow.org/v1"}, "kind": {"const": "PyTorchJob"},
        "metadata": _ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
        "spec": _closed({
            "runPolicy": _closed({"backoffLimit": {"type": "integer", "minimum": 0},
                                  "cleanPodPolicy": {"enum": ["None", "All", "Running"]},
                                  "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                                  "activeDeadlineSeconds": {"type": "integer", "minimum": 0}}),
            "nprocPerNode": {"type": "string"},
            "pytorchReplicaSpecs": _closed({"Master": {**_REPLICA, "properties": {**_REPLICA["properties"],
                                                       "replicas": {"const": 1}}}, "Worker": _REPLICA}, ("Master",)),
        }, ("pytorchReplicaSpecs",)),
    }, ("apiVersion", "kind", "metadata", "spec")),
    # Kubeflow Trainer v2 TrainJob (v2.0 API).
    "TrainJob": _closed({
        "apiVersion": {"const": "trainer.kubeflow.org/v1alpha1"}, "kind": {"const": "TrainJob"},
        "metadata": _ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
        "spec": _closed({
            "runtimeRef": _closed({"name": {"type": "string", "minLength": 1}, "apiGroup": {"type": "string"},
                                   "kind": {"enum": ["TrainingRuntime", "ClusterTrainingRuntime"]}}, ("name",)),
            "trainer": _closed({"image": {"type": "string", "minLength": 1},
                                "command": {"type": "array", "items": {"type": "string"}},
                                "args": {"type": "array", "items": {"type": "string"}},
                                "env": {"type": "array", "items": _ref("io.k8s.api.core.v1.EnvVar")},
                                "numNodes": {"type": "integer", "minimum": 1},
                                "numProcPerNode": {"type": ["integer", "string"]},
                                "resourcesPerNode": _ref("io.k8s.api.core.v1.ResourceRequirements")}),
            "podSpecOverrides": {"type": "array", "items": _closed({
                "targetJobs": {"type": "array", "items": _closed({"name": {"type": "string"}}, ("name",))},
                "volumes": {"type": "array", "items": _ref("io.k8s.api.core.v1.Volume")},
                "containers": {"type": "array", "items": _closed({
                    "name": {"type": "string"}, "env": {"type": "array", "items": _ref("io.k8s.api.core.v1.EnvVar")},
                    "volumeMounts": {"type": "array", "items": _ref("io.k8s.api.core.v1.VolumeMount")}}, ("name",))},
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                "tolerations": {"type": "array", "items": _ref("io.k8s.api.core.v1.Toleration")},
                "serviceAccountName": {"type": "string"}}, ("targetJobs",))},
            "labels": {"type": "object"}, "annotations": {"type": "object"}, "suspend": {"type": "boolean"},
        }, ("runtimeRef",)),
    }, ("apiVersion", "kind", "metadata", "spec")),
}


def _registry(kubernetes_version: str) -> Any:
    from referencing import Registry, Resource

    path = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{kubernetes_version}-local-strict"
    definitions = json.loads((path / "_definitions.json").read_text())
    return Registry().with_resource(K8S_DEFINITIONS, Resource.from_contents(definitions))


def validate_manifest(manifest: dict[str, Any], kubernetes_version: str = "1.31.0") -> list[str]:
    """Every schema error of a job manifest, as 'path: message'; [] when valid."""
    from jsonschema import Draft202012Validator

    kind = manifest.get("kind")
    if kind not in SCHEMAS:
        return [f"kind: {kind!r} is not one of {sorted(SCHEMAS)}"]
    validator = Draft202012Validator(SCHEMAS[kind], registry=_registry(kubernetes_version))
    errors = [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in validator.iter_errors(manifest)]
    if kind == "PyTorchJob":  # the operator finds the training container by this name
        for role, replica in manifest.get("spec", {}).get("pytorchReplicaSpecs", {}).items():
            names = [c.get("name") for c in replica.get("template", {}).get("spec", {}).get("containers", [])]
            if "pytorch" not in names:
                errors.append(f"spec.pytorchReplicaSpecs.{role}: no container named 'pytorch' (found {names})")
    return sorted(errors)


# --------------------------------------------------------------------------- launcher


def job_state(status: dict[str, Any] | None) -> tuple[str, str]:
    """(pending | running | succeeded | failed, message) from a PyTorchJob's or TrainJob's status conditions."""
    conditions = {c.get("type"): c for c in (status or {}).get("conditions") or [] if c.get("status") == "True"}
    if "Failed" in conditions:
        return "failed", conditions["Failed"].get("message", "")
    for done in ("Succeeded", "Complete"):  # v1 says Succeeded, v2 Complete
        if done in conditions:
            return "succeeded", conditions[done].get("message", "")
    if "Running" in conditions:
        return "running", ""
    return "pending", ""


class JobFailed(RuntimeError):
    """The training job failed; the message carries the operator's reason."""


def run_trainjob(stage: TrainingStage, model: str, data: list[str], output: str, preset: str, overrides: list[str], nodes: int,
                 gpus_per_node: int, run_id: str, poll_seconds: float = 15.0) -> None:
    """Create the job in this pod's namespace, stream its master's log, return when it succeeds, raise when it fails.

    KLEAR_TRAINER_API=v2 makes a TrainJob (Kubeflow Trainer v2), anything else a PyTorchJob."""
    from kubernetes import client, config

    from klear.common.images import GPU_IMAGE

    config.load_incluster_config()
    namespace_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    namespace = open(namespace_file).read().strip() if os.path.exists(namespace_file) else "kubeflow"
    v2 = os.environ.get("KLEAR_TRAINER_API") == "v2"
    spec = JobSpec(name=f"klear-{stage.name}-{run_id}"[:63].rstrip("-").lower(), image=GPU_IMAGE, stage=stage, nodes=nodes,
                   gpus_per_node=gpus_per_node, model=model, data=data, output=output, preset=preset,
                   overrides=overrides, namespace=namespace)
    manifest = render_trainjob(spec) if v2 else render_pytorchjob(spec)
    if errors := validate_manifest(manifest):
        raise ValueError("job manifest does not validate: " + "; ".join(errors))
    group, version, plural = ("trainer.kubeflow.org", "v1alpha1", "trainjobs") if v2 else ("kubeflow.org", "v1", "pytorchjobs")
    api, core = client.CustomObjectsApi(), client.CoreV1Api()
    api.create_namespaced_custom_object(group, version, namespace, plural, manifest)
    log.info("created %s %s/%s on %d nodes", manifest["kind"], namespace, spec.name, nodes)
    selector = (f"jobset.sigs.k8s.io/jobset-name={spec.name},batch.kubernetes.io/job-completion-index=0" if v2 else
                f"training.kubeflow.org/job-name={spec.name},training.kubeflow.org/replica-type=master")
    streamed = False
    while True:
        state, message = job_state(api.get_namespaced_custom_object(group, version, namespace, plural, spec.name).get("status"))
        if state == "running" and not streamed:
            pods = core.list_namespaced_pod(namespace, label_selector=selector).items
            if pods:  # follows the log until the master's container exits
                for line in core.read_namespaced_pod_log(pods[0].metadata.name, namespace, follow=True,
                                                         _preload_content=False).stream():
                    print(line.decode(errors="replace"), end="", flush=True)
                streamed = True
        if state == "succeeded":
            return
        if state == "failed":
            raise JobFailed(f"{manifest['kind']} {namespace}/{spec.name} failed: {message}")
        time.sleep(poll_seconds)
