"""Multi-node training stages (sft, gppo) through Kubeflow Trainer: the job manifest, its schema check, and a launcher.

Two job kinds, same command on every node (`accelerate launch` with the ZeRO-3 config, one process
per GPU, node rank and rendezvous from the variables the operator injects):

  PyTorchJob (kubeflow.org/v1, Training Operator >= v1.8): Master + Workers; env RANK, MASTER_ADDR, MASTER_PORT
  TrainJob   (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer >= v2.2): numNodes on the `torch-distributed`
             runtime, the pods' settings in `runtimePatches`; env PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT

Trainer v2.1's TrainJob is not written: v2.2 replaced its `podTemplateOverrides` with `runtimePatches` (a breaking
change, kubeflow/trainer#3309) and each release's API server drops the other's field, so both would need two
manifest shapes and a per-cluster switch, for a release v2.2 and v2.3 superseded. Jobs are created with strict field
validation instead: a cluster that does not know a field (v2.1 and `runtimePatches`) refuses the job and names the
field, where it would otherwise run it without /dev/shm, the launching pod's scheduling and its labels.

S3 credentials come from a Secret as environment variables; /dev/shm is a RAM-backed emptyDir
(NCCL and the data loaders need more than the container default of 64 MB). The launcher creates
the job, streams the master pod's log, and raises when the job fails.

The job outlives the pod that launched it. Its name is derived from the pipeline run and the step (sft,
gppo-math, gppo-code), not from the pod: a retried launcher (a new pod of the same task) finds the job by that
name and re-attaches to it, waiting for it and following its master's log; only a job that failed is replaced,
and the new one resumes from the checkpoints on run_root. The job is owned by the run's Argo Workflow (the
launching pod's own owner), so it lives as long as the run and goes with it, never with one launcher pod. A cut
log stream reconnects where it stopped (`timestamps` and `sinceSeconds`, lines already printed skipped). The job's
pods take the launching pod's scheduling (node selector, tolerations, affinity, pull secrets, service account) and
the image the pipeline was compiled with (KLEAR_TRAIN_IMAGE).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from klear.common.kfp_io import API_ENV, IMAGE_ENV, POD_NAME_ENV, RUN_ID_ENV, RUNTIME_ENV
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
WORKFLOW_API = "argoproj.io/v1alpha1"  # the run: KFP runs a pipeline as an Argo Workflow that owns its pods
NODE_JOB = "node"  # the runtime's replicated job and container that train (Trainer's torch runtimes, the chart's)
PATCH_MANAGER = "klear.io/launcher"  # this module's entry in a TrainJob's runtimePatches, which are keyed by manager
OPERATORS = {"PyTorchJob": "the Training Operator >= v1.8 (kubeflow.org/v1)",
             "TrainJob": "Kubeflow Trainer >= v2.2 (trainer.kubeflow.org/v1alpha1 with spec.runtimePatches)"}


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
    owner: Mapping[str, Any] | None = None  # ownerReference to the run's Argo Workflow
    scheduling: Mapping[str, Any] = field(default_factory=dict)  # SCHEDULING_FIELDS of the launching pod
    pod_labels: Mapping[str, str] = field(default_factory=dict)  # the launching pod's klear.io/ labels


def job_name(run_id: str, step: str) -> str:
    """A DNS-1123 name per (pipeline run, step): gppo-math and gppo-code of one run differ, a retried launcher of
    the same step finds the job its earlier attempt created, another run gets its own."""
    digest = hashlib.sha256(f"{run_id}/{step}".encode()).hexdigest()[:10]
    prefix = re.sub(r"[^a-z0-9-]+", "-", f"klear-{step}".lower()).strip("-")[:52]
    return f"{prefix}-{digest}"


def workflow_owner(pod_metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ownerReference that makes the run's Argo Workflow own the job, taken from the launching pod's own
    owner (Argo makes the Workflow every pod's controller); None outside a Workflow. Deleting the run deletes the
    job; deleting or retrying the launching pod does not."""
    for owner in pod_metadata.get("ownerReferences") or []:
        if owner.get("kind") == "Workflow" and owner.get("apiVersion") == WORKFLOW_API:
            return {"apiVersion": WORKFLOW_API, "kind": "Workflow", "name": owner["name"], "uid": owner["uid"],
                    "blockOwnerDeletion": False}
    return None


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
    """A TrainJob for Kubeflow Trainer >= v2.2: what Trainer's `trainer` field cannot say (/dev/shm, the launching
    pod's scheduling and labels) is a runtime patch of the `node` job's pod template."""
    pod = {"metadata": {"labels": {**PART_OF, **spec.labels, **spec.pod_labels}},
           "spec": {"volumes": [_shm_volume(spec)],
                    "containers": [{"name": NODE_JOB, "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}],
                    **spec.scheduling}}
    patch = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": NODE_JOB, "template": {"spec": {"template": pod}}}]}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": _metadata(spec),
            "spec": {"runtimeRef": {"name": spec.runtime},
                     "trainer": {"image": spec.image, "command": _command(spec, V2_VARS), "env": _env(spec),
                                 "numNodes": spec.nodes, "resourcesPerNode": _resources(spec)},
                     "runtimePatches": [patch]}}


# --------------------------------------------------------------------------- schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"{K8S_DEFINITIONS}#/$defs/{name}"}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_REPLICA = _closed({"replicas": {"type": "integer", "minimum": 0},
                    "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                    "template": _ref("io.k8s.api.core.v1.PodTemplateSpec")}, ("replicas", "template"))

# Trainer v2.2+ runtime patches (pkg/apis/trainer/v1alpha1/trainjob_types.go: RuntimePatch ... ContainerPatch):
# metadata may carry labels and annotations only; a container patch names a container of the runtime.
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_PATCH_METADATA = _closed({"labels": _STRINGS, "annotations": _STRINGS})
_PATCHED_CONTAINER = _closed({"name": {"type": "string", "minLength": 1},
                              "env": {"type": "array", "items": _ref("io.k8s.api.core.v1.EnvVar")},
                              "volumeMounts": {"type": "array", "items": _ref("io.k8s.api.core.v1.VolumeMount")},
                              "securityContext": _ref("io.k8s.api.core.v1.SecurityContext")}, ("name",))
_POD_SPEC_PATCH = _closed({
    "serviceAccountName": {"type": "string"},
    "volumes": {"type": "array", "items": _ref("io.k8s.api.core.v1.Volume")},
    "initContainers": {"type": "array", "items": _PATCHED_CONTAINER},
    "containers": {"type": "array", "items": _PATCHED_CONTAINER},
    "imagePullSecrets": {"type": "array", "items": _ref("io.k8s.api.core.v1.LocalObjectReference")},
    "securityContext": _ref("io.k8s.api.core.v1.PodSecurityContext"),
    "nodeSelector": _STRINGS,
    "affinity": _ref("io.k8s.api.core.v1.Affinity"),
    "tolerations": {"type": "array", "items": _ref("io.k8s.api.core.v1.Toleration")},
    "schedulingGates": {"type": "array", "items": _ref("io.k8s.api.core.v1.PodSchedulingGate")},
    "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0}})
_REPLICATED_JOB_PATCH = _closed({
    "name": {"type": "string", "minLength": 1},
    "template": _closed({"metadata": _PATCH_METADATA, "spec": _closed({"template": _closed({
        "metadata": _PATCH_METADATA, "spec": _POD_SPEC_PATCH})})})}, ("name",))
# Trainer's webhook wants a domain-prefixed path ("acme.io/foo": a DNS subdomain, a slash, an HTTP path).
_MANAGER = {"type": "string", "maxLength": 253,
            "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$"}
_RUNTIME_PATCH = _closed({
    "manager": _MANAGER,
    "trainingRuntimeSpec": _closed({"template": _closed({
        "metadata": _PATCH_METADATA,
        "spec": _closed({"replicatedJobs": {"type": "array", "items": _REPLICATED_JOB_PATCH}})})}),
}, ("manager",))

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
    # Kubeflow Trainer TrainJob, v2.2+ API (v2.1's podTemplateOverrides and spec.labels/annotations are errors).
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
                                "numProcPerNode": {"type": "integer", "minimum": 1},  # an int32 since v2.2
                                "resourcesPerNode": _ref("io.k8s.api.core.v1.ResourceRequirements")}),
            "runtimePatches": {"type": "array", "maxItems": 16, "items": _RUNTIME_PATCH},
            "suspend": {"type": "boolean"}, "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
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
    """(pending | running | succeeded | failed, message) from a PyTorchJob's or TrainJob's status conditions.

    The Training Operator says Created, Running, Restarting, Succeeded, Failed; Trainer only Suspended, Complete and
    Failed: a TrainJob is `pending` until it ends. Only the two terminal states decide anything."""
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
    required = (IMAGE_ENV, RUN_ID_ENV)
    if missing := [key for key in required if not environ.get(key)]:
        raise RuntimeError(f"multi-node training needs {', '.join(missing)} in the launching pod's environment: "
                           "run the compiled pipeline (pipelines/definitions.py sets them)")
    metadata = launcher_pod.get("metadata") or {}
    owner = workflow_owner(metadata)
    if owner is None:
        log.warning("the launching pod has no Argo Workflow owner: the job is owned by nothing and stays until "
                    "its TTL after it finishes")
    labels = {"klear.io/run-id": environ[RUN_ID_ENV][:63], "klear.io/step": step}
    spec = JobSpec(name=job_name(environ[RUN_ID_ENV], step), image=environ[IMAGE_ENV], stage=stage, nodes=nodes,
                   gpus_per_node=gpus_per_node, model=model, data=data, output=output, preset=preset,
                   overrides=overrides, namespace=namespace,
                   runtime=environ.get(RUNTIME_ENV) or "torch-distributed", labels=labels, owner=owner,
                   scheduling=launcher_scheduling(launcher_pod.get("spec") or {}),
                   pod_labels=launcher_labels(metadata))
    return spec, environ.get(API_ENV) == "v2"


class JobCluster(Protocol):
    """Where a launcher's jobs live: the Kubernetes API (KubernetesJobs) or, in tests, local processes."""

    def get(self, name: str) -> dict[str, Any] | None:
        """The job (with its status) or None when there is none of that name."""

    def create(self, manifest: dict[str, Any]) -> None: ...

    def delete(self, name: str) -> None: ...

    def names(self, labels: Mapping[str, str]) -> list[str]:
        """The names of the jobs carrying every one of `labels`."""

    def master_log(self, name: str, after: str | None) -> Iterator[tuple[str, str]]:
        """(mark, line) of the master's log, following it until its container exits; only lines after the mark
        `after` (marks sort in log order). Raises when the stream breaks."""


def attach_decision(state: str | None) -> str:
    """What a launcher does with the job of its name, by the job's state (None: no such job): create it,
    attach to it (pending, running), take it as done (succeeded), or replace it (failed: a new job resumes from
    the checkpoints)."""
    return {None: "create", "pending": "attach", "running": "attach", "succeeded": "done",
            "failed": "replace"}[state]


def start_or_attach(cluster: JobCluster, manifest: dict[str, Any], poll_seconds: float,
                    delete_timeout_s: float) -> str:
    """Create the job, or re-attach to the one an earlier attempt of this step created; returns the decision
    (attach_decision). Jobs of this run and step under another name (launchers that named jobs after their pod)
    and a failed job of this name are deleted first, and awaited: they would write the same checkpoints."""
    name, kind = manifest["metadata"]["name"], manifest["kind"]
    existing = cluster.get(name)
    decision = attach_decision(None if existing is None else job_state(existing.get("status"))[0])
    labels = {key: manifest["metadata"]["labels"][key] for key in ("klear.io/run-id", "klear.io/step")}
    doomed = [other for other in cluster.names(labels) if other != name] + ([name] if decision == "replace" else [])
    for other in doomed:
        log.info("deleting %s %s of an earlier attempt", kind, other)
        cluster.delete(other)
    deadline = time.monotonic() + delete_timeout_s
    while doomed := [other for other in doomed if cluster.get(other) is not None]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"earlier jobs {doomed} were not deleted within {delete_timeout_s:.0f} s")
        time.sleep(poll_seconds)
    if decision in ("create", "replace"):
        cluster.create(manifest)
        log.info("created %s %s", kind, name)
    else:
        log.info("%s %s of an earlier attempt is %s: attaching to it", kind, name,
                 "finished" if decision == "done" else "still there")
    return decision


def follow_job(cluster: JobCluster, name: str, kind: str, poll_seconds: float, out: TextIO | None = None) -> None:
    """Print the master's log while the job runs, reconnecting where a cut stream stopped; return when the job
    succeeds, raise JobFailed when it fails or disappears."""
    mark: str | None = None
    while True:
        job = cluster.get(name)
        if job is None:
            raise JobFailed(f"{kind} {name} is gone (deleted while it ran): the retried task creates it again")
        state, message = job_state(job.get("status"))
        # Follow the log whatever the state says: a TrainJob never says Running and a PyTorchJob says Restarting
        # while its master comes back (master_log yields nothing until a master pod has started). A job that ended
        # before the first poll or between two still has the lines not yet printed printed once.
        ended = state in ("succeeded", "failed")
        mark = _print_master_log(cluster, name, kind, mark, out or sys.stdout, ended)
        if state == "succeeded":
            return
        if state == "failed":
            raise JobFailed(f"{kind} {name} failed: {message}")
        time.sleep(poll_seconds)


def _print_master_log(cluster: JobCluster, name: str, kind: str, mark: str | None, out: TextIO,
                      ended: bool) -> str | None:
    """Print the master's log lines after `mark` until its stream ends or breaks; returns the last mark printed."""
    try:
        for seen, line in cluster.master_log(name, mark):
            print(line, file=out, flush=True)
            mark = seen
    except Exception as exc:  # noqa: BLE001 - any break of the stream (HTTP, API, connection): the job still runs
        log.warning("the log stream of %s %s broke (%s: %s)%s", kind, name, type(exc).__name__, exc,
                    "" if ended else ": reconnecting")
    return mark


def launch_job(cluster: JobCluster, spec: JobSpec, v2: bool, poll_seconds: float = 15.0,
               delete_timeout_s: float = 600.0) -> str:
    """Render and check the job, create it or re-attach to it, follow it to its end; returns the decision."""
    manifest = render_trainjob(spec) if v2 else render_pytorchjob(spec)
    if errors := validate_manifest(manifest):
        raise ValueError("job manifest does not validate: " + "; ".join(errors))
    decision = start_or_attach(cluster, manifest, poll_seconds, delete_timeout_s)
    follow_job(cluster, spec.name, manifest["kind"], poll_seconds)
    return decision


# --------------------------------------------------------------------------- the Kubernetes API


_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ")


def timestamped_line(raw: str) -> tuple[str, str]:
    """(mark, text) of a kubelet log line read with `timestamps=true` ("2026-12-06T08:00:01.5Z text"): the mark
    is the time with nine fraction digits, so marks sort as times do."""
    found = _TIMESTAMP.match(raw)
    if found is None:
        raise ValueError(f"log line without a timestamp: {raw[:80]!r}")
    return f"{found[1]}.{(found[2] or '').ljust(9, '0')}", raw[found.end():].rstrip("\n")


def lines_after(raw_lines: Iterable[str], after: str | None) -> Iterator[tuple[str, str]]:
    """The (mark, text) of each timestamped line later than the mark `after` (a reconnected stream starts a
    second early: what was printed already is skipped)."""
    for raw in raw_lines:
        mark, text = timestamped_line(raw)
        if after is None or mark > after:
            yield mark, text


def since_seconds(after: str | None, now: datetime) -> int | None:
    """sinceSeconds for a stream that goes on after the mark `after`: a second early (whole seconds only)."""
    if after is None:
        return None
    then = datetime.fromisoformat(after[:26]).replace(tzinfo=UTC)  # microseconds: enough for seconds
    return max(1, math.ceil((now - then).total_seconds()) + 1)


def refusal(kind: str, name: str, status_body: str | None) -> str:
    """What to say when the API server refuses to create a job (its Status body as sent): its message, and for an
    unknown field (strict field validation) the operator version these manifests are written for."""
    try:
        message = str(json.loads(status_body or "").get("message") or status_body)
    except (ValueError, AttributeError):
        message = str(status_body)
    hint = f"; {kind} manifests are written for {OPERATORS[kind]}" if "unknown field" in message else ""
    return f"the API server refused {kind} {name}: {message}{hint}"


class KubernetesJobs:
    """PyTorchJobs (Training Operator v1) or TrainJobs (Trainer v2) of one namespace, through the API server."""

    def __init__(self, namespace: str, v2: bool, api_client: Any = None) -> None:
        from kubernetes import client

        self.namespace, self.v2 = namespace, v2
        self.api, self.core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        group, version, plural = ("trainer.kubeflow.org", "v1alpha1", "trainjobs") if v2 else ("kubeflow.org", "v1", "pytorchjobs")
        self.resource = (group, version, namespace, plural)  # the custom-object calls' leading arguments

    def get(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self.api.get_namespaced_custom_object(*self.resource, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, manifest: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:  # Strict: a field the cluster's CRD does not know is an error, not silently dropped (the default, Warn)
            self.api.create_namespaced_custom_object(*self.resource, manifest, field_validation="Strict")
        except ApiException as exc:
            if exc.status in (400, 422):  # BadRequest (unknown field), Invalid (schema, CEL rules, Trainer's webhook)
                raise RuntimeError(refusal(manifest["kind"], manifest["metadata"]["name"], exc.body)) from exc
            raise

    def delete(self, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.delete_namespaced_custom_object(*self.resource, name,
                                                     body=client.V1DeleteOptions(propagation_policy="Foreground"))
        except ApiException as exc:
            if exc.status != 404:
                raise

    def names(self, labels: Mapping[str, str]) -> list[str]:
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        return [item["metadata"]["name"] for item in
                self.api.list_namespaced_custom_object(*self.resource, label_selector=selector)["items"]]

    def master_log(self, name: str, after: str | None) -> Iterator[tuple[str, str]]:
        selector = (f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name={NODE_JOB},"
                    "batch.kubernetes.io/job-completion-index=0" if self.v2
                    else f"training.kubeflow.org/job-name={name},training.kubeflow.org/replica-type=master")
        pods = [pod for pod in self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
                if pod.status.phase in ("Running", "Succeeded", "Failed")]
        if not pods:
            return
        newest = max(pods, key=lambda pod: pod.metadata.creation_timestamp)  # a restarted master is a new pod
        stream = self.core.read_namespaced_pod_log(newest.metadata.name, self.namespace, follow=True, timestamps=True,
                                                   since_seconds=since_seconds(after, datetime.now(UTC)),
                                                   _preload_content=False)
        try:  # urllib3 yields the body line by line
            yield from lines_after((raw.decode(errors="replace") for raw in stream), after)
        finally:
            stream.release_conn()


def run_trainjob(stage: TrainingStage, step: str, model: str, data: list[str], output: str, preset: str,
                 overrides: list[str], nodes: int, gpus_per_node: int, poll_seconds: float = 15.0,
                 delete_timeout_s: float = 600.0) -> None:
    """Create the job in this pod's namespace (or re-attach to the one an earlier attempt of this task created),
    stream its master's log, return when it succeeds, raise when it fails.

    KLEAR_TRAINER_API=v2 makes a TrainJob (Kubeflow Trainer >= v2.2, runtime KLEAR_TRAINER_RUNTIME), anything
    else a PyTorchJob (Training Operator v1)."""
    from kubernetes import client, config

    config.load_incluster_config()
    namespace_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    namespace = open(namespace_file).read().strip() if os.path.exists(namespace_file) else "kubeflow"
    launcher: dict[str, Any] = {}
    if pod_name := os.environ.get(POD_NAME_ENV):
        launcher = client.ApiClient().sanitize_for_serialization(
            client.CoreV1Api().read_namespaced_pod(pod_name, namespace))
    spec, v2 = plan_job(stage, step, model, data, output, preset, overrides, nodes, gpus_per_node, os.environ,
                        namespace, launcher)
    launch_job(KubernetesJobs(namespace, v2), spec, v2, poll_seconds, delete_timeout_s)
