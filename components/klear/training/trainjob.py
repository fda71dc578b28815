"""Multi-node training stages (sft, gppo) through Kubeflow Trainer: the job manifest, its schema check, and a launcher.

Two job kinds, same command on every node (`accelerate launch` with the ZeRO-3 config, one process
per GPU, node rank and rendezvous from the variables the operator injects):

  PyTorchJob (kubeflow.org/v1, Training Operator v1): Master + Workers; env RANK, MASTER_ADDR, MASTER_PORT
  TrainJob   (trainer.kubeflow.org/v1alpha1, Trainer v2): numNodes on the `torch-distributed` runtime;
             env PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT

S3 credentials come from a Secret as environment variables; /dev/shm is a RAM-backed emptyDir
(NCCL and the data loaders need more than the container default of 64 MB). The launcher creates
the job, streams the master pod's log, and raises when the job fails.

The launching pod (the KFP task) is the job's owner: the job's name is derived from the pod's name, so
every task and every retry attempt gets its own; Kubernetes deletes the job with the pod, and a retry
first removes an earlier attempt's job of the same step (both would write the same checkpoints). The
job's pods take the launching pod's scheduling (node selector, tolerations, affinity, pull secrets,
service account) and the image the pipeline was compiled with (KLEAR_TRAIN_IMAGE).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from klear.common.kfp_io import API_ENV, IMAGE_ENV, POD_NAME_ENV, POD_UID_ENV, RUN_ID_ENV, RUNTIME_ENV
from klear.common.tracking import TRACKING_SECRET, TRACKING_SECRET_KEYS
from klear.training.launch import accelerate_command, shell_line

if TYPE_CHECKING:
    from klear.training.stage import TrainingStage

log = logging.getLogger("klear.trainjob")

S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")
OPTIONAL_S3_KEYS = ("AWS_REGION",)  # not every store needs one
# Pod-spec fields a job's pods take from the launching pod.
SCHEDULING_FIELDS = ("nodeSelector", "tolerations", "affinity", "imagePullSecrets", "serviceAccountName")
FINISHED_JOB_TTL_S = 86_400  # a finished PyTorchJob (and its pods' logs) stays a day
PART_OF = {"app.kubernetes.io/part-of": "klear"}
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
    tracking_secret: str = TRACKING_SECRET  # optional: MLflow / W&B credentials, when the chart has them
    shm_size: str = "64Gi"
    cpu: str = "64"  # per node; the pipelines' defaults for an 8-GPU node
    memory: str = "512Gi"
    runtime: str = "torch-distributed"  # Trainer v2 ClusterTrainingRuntime
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: Mapping[str, Any] | None = None  # ownerReference to the launching pod
    scheduling: Mapping[str, Any] = field(default_factory=dict)  # SCHEDULING_FIELDS of the launching pod
    pod_labels: Mapping[str, str] = field(default_factory=dict)  # the launching pod's klear.io/ labels


def job_name(step: str, pod_name: str) -> str:
    """A DNS-1123 name unique per launching pod: one per task (gppo-math, gppo-code) and per retry attempt."""
    digest = hashlib.sha256(pod_name.encode()).hexdigest()[:10]
    prefix = re.sub(r"[^a-z0-9-]+", "-", f"klear-{step}".lower()).strip("-")[:52]
    return f"{prefix}-{digest}"


def owner_reference(pod_name: str, pod_uid: str) -> dict[str, Any]:
    """The launching pod owns the job: Kubernetes deletes the job (and its pods) when the pod is deleted."""
    return {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid, "blockOwnerDeletion": False}


def launcher_scheduling(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The scheduling settings of the launching pod's spec (as the API returns it) that the job's pods share."""
    return {key: pod_spec[key] for key in SCHEDULING_FIELDS if pod_spec.get(key)}


def launcher_labels(pod_metadata: Mapping[str, Any]) -> dict[str, str]:
    """The launching pod's `klear.io/` labels, which the job's pods carry too: the one that puts pods running
    model-written code (gppo's rewards) under the chart's deny-all NetworkPolicy."""
    return {key: value for key, value in (pod_metadata.get("labels") or {}).items() if key.startswith("klear.io/")}


def _metadata(spec: JobSpec) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace, "labels": {**PART_OF, **spec.labels}}
    if spec.owner:
        metadata["ownerReferences"] = [dict(spec.owner)]
    return metadata


def _command(spec: JobSpec, variables: tuple[str, str, str]) -> list[str]:
    rank, address, port = variables
    argv = accelerate_command(spec.stage, spec.model, spec.data, spec.output, spec.preset, spec.overrides, spec.gpus_per_node,
                              nodes=spec.nodes, machine_rank=rank, main_address=address, main_port=port, python="python")
    return ["bash", "-c", "exec " + shell_line(argv, variables)]


def _env(spec: JobSpec) -> list[dict[str, Any]]:
    def from_secret(key: str, optional: bool, secret: str = spec.s3_secret) -> dict[str, Any]:
        ref: dict[str, Any] = {"name": secret, "key": key}
        if optional:
            ref["optional"] = True
        return {"name": key, "valueFrom": {"secretKeyRef": ref}}

    return ([from_secret(k, False) for k in S3_KEYS] + [from_secret(k, True) for k in OPTIONAL_S3_KEYS]
            + [from_secret(k, True, spec.tracking_secret) for k in TRACKING_SECRET_KEYS])


def _resources(spec: JobSpec) -> dict[str, Any]:
    amounts = {"cpu": spec.cpu, "memory": spec.memory, "nvidia.com/gpu": str(spec.gpus_per_node)}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _shm_volume(spec: JobSpec) -> dict[str, Any]:
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}


def render_pytorchjob(spec: JobSpec) -> dict[str, Any]:
    def replica(count: int) -> dict[str, Any]:
        container = {"name": "pytorch", "image": spec.image, "command": _command(spec, V1_VARS), "env": _env(spec),
                     "resources": _resources(spec), "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
        pod = {"containers": [container], "volumes": [_shm_volume(spec)], **spec.scheduling}
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": {**PART_OF, **spec.labels, **spec.pod_labels}}, "spec": pod}}

    replicas = {"Master": replica(1)}
    if spec.nodes > 1:
        replicas["Worker"] = replica(spec.nodes - 1)
    run_policy = {"backoffLimit": 3, "cleanPodPolicy": "None", "ttlSecondsAfterFinished": FINISHED_JOB_TTL_S}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(spec),
            "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas}}


def render_trainjob(spec: JobSpec) -> dict[str, Any]:
    """A TrainJob for Kubeflow Trainer >= v2.1 (`podTemplateOverrides`; v2.0 called it podSpecOverrides)."""
    pod = {"volumes": [_shm_volume(spec)],
           "containers": [{"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}],
           **spec.scheduling}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": _metadata(spec),
            "spec": {"runtimeRef": {"name": spec.runtime},
                     "trainer": {"image": spec.image, "command": _command(spec, V2_VARS), "env": _env(spec),
                                 "numNodes": spec.nodes, "resourcesPerNode": _resources(spec)},
                     "podTemplateOverrides": [{"targetJobs": [{"name": "node"}],
                                               "metadata": {"labels": {**PART_OF, **spec.labels, **spec.pod_labels}},
                                               "spec": pod}]}}


# --------------------------------------------------------------------------- schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"{K8S_DEFINITIONS}#/$defs/{name}"}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_REPLICA = _closed({"replicas": {"type": "integer", "minimum": 0},
                    "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                    "template": _ref("io.k8s.api.core.v1.PodTemplateSpec")}, ("replicas", "template"))

_OVERRIDDEN_CONTAINER = _closed({"name": {"type": "string"},
                                 "env": {"type": "array", "items": _ref("io.k8s.api.core.v1.EnvVar")},
                                 "volumeMounts": {"type": "array", "items": _ref("io.k8s.api.core.v1.VolumeMount")}},
                                ("name",))

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
    # Kubeflow Trainer v2 TrainJob (v2.1 API).
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
            "podTemplateOverrides": {"type": "array", "items": _closed({
                "targetJobs": {"type": "array", "items": _closed({"name": {"type": "string"}}, ("name",))},
                "metadata": _closed({"labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                     "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}),
                "spec": _closed({
                    "volumes": {"type": "array", "items": _ref("io.k8s.api.core.v1.Volume")},
                    "containers": {"type": "array", "items": _OVERRIDDEN_CONTAINER},
                    "initContainers": {"type": "array", "items": _OVERRIDDEN_CONTAINER},
                    "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                    "affinity": _ref("io.k8s.api.core.v1.Affinity"),
                    "tolerations": {"type": "array", "items": _ref("io.k8s.api.core.v1.Toleration")},
                    "imagePullSecrets": {"type": "array", "items": _ref("io.k8s.api.core.v1.LocalObjectReference")},
                    "schedulingGates": {"type": "array", "items": _ref("io.k8s.api.core.v1.PodSchedulingGate")},
                    "serviceAccountName": {"type": "string"}}),
            }, ("targetJobs",))},
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


def plan_job(stage: TrainingStage, step: str, model: str, data: list[str], output: str, preset: str,
             overrides: list[str], nodes: int, gpus_per_node: int, environ: Mapping[str, str], namespace: str,
             launcher_pod: Mapping[str, Any]) -> tuple[JobSpec, bool]:
    """The job a launching pod creates, from what the compiled pipeline put in its environment and its own pod
    (as the API returns it); (spec, whether it is a Trainer v2 TrainJob). Raises naming every missing variable."""
    required = (IMAGE_ENV, POD_NAME_ENV, POD_UID_ENV, RUN_ID_ENV)
    if missing := [key for key in required if not environ.get(key)]:
        raise RuntimeError(f"multi-node training needs {', '.join(missing)} in the launching pod's environment: "
                           "run the compiled pipeline (pipelines/definitions.py sets them)")
    labels = {"klear.io/run-id": environ[RUN_ID_ENV][:63], "klear.io/step": step}
    spec = JobSpec(name=job_name(step, environ[POD_NAME_ENV]), image=environ[IMAGE_ENV], stage=stage, nodes=nodes,
                   gpus_per_node=gpus_per_node, model=model, data=data, output=output, preset=preset,
                   overrides=overrides, namespace=namespace,
                   runtime=environ.get(RUNTIME_ENV) or "torch-distributed", labels=labels,
                   owner=owner_reference(environ[POD_NAME_ENV], environ[POD_UID_ENV]),
                   scheduling=launcher_scheduling(launcher_pod.get("spec") or {}),
                   pod_labels=launcher_labels(launcher_pod.get("metadata") or {}))
    return spec, environ.get(API_ENV) == "v2"


def run_trainjob(stage: TrainingStage, step: str, model: str, data: list[str], output: str, preset: str,
                 overrides: list[str], nodes: int, gpus_per_node: int, poll_seconds: float = 15.0,
                 delete_timeout_s: float = 600.0) -> None:
    """Create the job in this pod's namespace, stream its master's log, return when it succeeds, raise when it fails.

    KLEAR_TRAINER_API=v2 makes a TrainJob (Kubeflow Trainer >= v2.1, runtime KLEAR_TRAINER_RUNTIME), anything
    else a PyTorchJob (Training Operator v1)."""
    from kubernetes import client, config

    config.load_incluster_config()
    namespace_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    namespace = open(namespace_file).read().strip() if os.path.exists(namespace_file) else "kubeflow"
    api, core = client.CustomObjectsApi(), client.CoreV1Api()
    launcher: dict[str, Any] = {}
    if pod_name := os.environ.get(POD_NAME_ENV):
        launcher = client.ApiClient().sanitize_for_serialization(core.read_namespaced_pod(pod_name, namespace))
    spec, v2 = plan_job(stage, step, model, data, output, preset, overrides, nodes, gpus_per_node, os.environ,
                        namespace, launcher)
    manifest = render_trainjob(spec) if v2 else render_pytorchjob(spec)
    if errors := validate_manifest(manifest):
        raise ValueError("job manifest does not validate: " + "; ".join(errors))
    group, version, plural = ("trainer.kubeflow.org", "v1alpha1", "trainjobs") if v2 else ("kubeflow.org", "v1", "pytorchjobs")
    # An earlier attempt of this step (a retried pod) may have left its job running: it would write the same
    # checkpoints. Remove it and wait until it is gone before starting this one.
    selector = ",".join(f"{key}={value}" for key, value in spec.labels.items())
    earlier = [item["metadata"]["name"] for item in
               api.list_namespaced_custom_object(group, version, namespace, plural, label_selector=selector)["items"]
               if item["metadata"]["name"] != spec.name]
    for name in earlier:
        log.info("deleting %s %s/%s of an earlier attempt", manifest["kind"], namespace, name)
        api.delete_namespaced_custom_object(group, version, namespace, plural, name,
                                            body=client.V1DeleteOptions(propagation_policy="Foreground"))
    deadline = time.monotonic() + delete_timeout_s
    while earlier and api.list_namespaced_custom_object(group, version, namespace, plural,
                                                        label_selector=selector)["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"earlier jobs {earlier} were not deleted within {delete_timeout_s:.0f} s")
        time.sleep(poll_seconds)
    api.create_namespaced_custom_object(group, version, namespace, plural, manifest)
    log.info("created %s %s/%s on %d nodes", manifest["kind"], namespace, spec.name, nodes)
    pods_of_master = (f"jobset.sigs.k8s.io/jobset-name={spec.name},batch.kubernetes.io/job-completion-index=0" if v2
                      else f"training.kubeflow.org/job-name={spec.name},training.kubeflow.org/replica-type=master")
    streamed = False
    while True:
        state, message = job_state(api.get_namespaced_custom_object(group, version, namespace, plural, spec.name).get("status"))
        if state == "running" and not streamed:
            pods = core.list_namespaced_pod(namespace, label_selector=pods_of_master).items
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
