"""Kubeflow Trainer job manifests: rendered, validated against the Kubernetes schemas and Trainer's own TrainJob CRD;
job states, failures; jobs created with strict field validation."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from klear.sft.stage import STAGE as SFT
from klear.training.trainjob import JobSpec, job_state, render_pytorchjob, render_trainjob, validate_manifest

SPEC = JobSpec(name="klear-sft-run-1", image="registry/klear-gpu:0.1.0", stage=SFT, nodes=4, gpus_per_node=8,
               model="s3://models/Qwen3-8B-Base", data=["s3://runs/1/curate"], output="s3://runs/1/sft")


def test_pytorchjob_renders_and_validates() -> None:
    job = render_pytorchjob(SPEC)
    assert validate_manifest(job) == []
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 3
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    line = container["command"][-1]
    assert "accelerate.commands.launch" in line and "launch_configs/zero3.yaml" in line
    assert "--num_machines 4 --num_processes 32 --machine_rank $RANK" in line
    assert "--main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT" in line
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]} == {"klear-s3", "klear-tracking"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    single = render_pytorchjob(JobSpec(**{**SPEC.__dict__, "nodes": 1}))
    assert "Worker" not in single["spec"]["pytorchReplicaSpecs"] and validate_manifest(single) == []


def test_trainjob_renders_and_validates() -> None:
    job = render_trainjob(SPEC)
    assert validate_manifest(job) == []
    assert job["spec"]["trainer"]["numNodes"] == 4
    assert "--machine_rank $PET_NODE_RANK" in job["spec"]["trainer"]["command"][-1]


def _patched_pod(job: dict[str, Any]) -> dict[str, Any]:
    """The pod template of the `node` job in a TrainJob's one runtime patch."""
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == "klear.io/launcher"
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"  # the replicated job of Trainer's torch runtimes and the chart's
    return node["template"]["spec"]["template"]


def test_trainjob_patches_the_node_pods_as_trainer_v2_2_reads_them() -> None:
    """/dev/shm, the launching pod's scheduling and klear.io/ labels go in spec.runtimePatches (Trainer >= v2.2),
    and the TrainJob passes Trainer v2.3's own CRD schema as an API server with strict field validation applies
    it. The v2.1 shape (podTemplateOverrides), which such a server drops or refuses, fails both checks."""
    from klear.training.trainjob import plan_job
    from tests.deploy.helpers import validation_errors

    spec, v2 = plan_job(SFT, "sft", "s3://m", ["s3://d"], "s3://runs/r/sft", "paper", [], 2, 8,
                        {**_environ("pod-1"), "KLEAR_TRAINER_API": "v2"}, "team-a", LAUNCHER_POD)
    job = render_trainjob(spec)
    assert v2 and validate_manifest(job) == [] and validation_errors(job) == []
    pod = _patched_pod(job)
    assert pod["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]
    assert pod["spec"]["containers"] == [{"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]
    assert pod["metadata"]["labels"]["klear.io/runs-untrusted-code"] == "true"
    carried = ("nodeSelector", "tolerations", "imagePullSecrets", "serviceAccountName")
    assert {key: pod["spec"].get(key) for key in carried} == {key: LAUNCHER_SPEC[key] for key in carried}

    v2_1 = copy.deepcopy(job)
    v2_1["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}], **v2_1["spec"].pop("runtimePatches")[0]
                                             ["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
                                             ["template"]["spec"]["template"]}]
    v2_1["spec"]["trainer"]["numProcPerNode"] = "auto"  # an int32 since v2.2
    for errors in (validate_manifest(v2_1), validation_errors(v2_1)):
        assert any("'podTemplateOverrides' was unexpected" in e for e in errors), errors
        assert any("numProcPerNode" in e for e in errors), errors


def test_schema_errors_are_all_reported() -> None:
    job = copy.deepcopy(render_pytorchjob(SPEC))
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    pod["containers"][0]["ports"] = [{"containerPort": "eighty"}]  # wrong type
    pod["containers"][0]["volumeMount"] = []  # typo: unknown field (strict schema)
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    errors = validate_manifest(job)
    assert len(errors) >= 4, errors
    text = "\n".join(errors)
    assert "eighty" in text and "volumeMount" in text and "replicas" in text and "'pytorch'" in text
    bad_v2 = render_trainjob(SPEC)
    bad_v2["spec"]["trainer"]["numNodes"] = 0
    bad_v2["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = {"count": 8}
    assert len(validate_manifest(bad_v2)) >= 2
    assert validate_manifest({"kind": "Deployment"}) != []


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, "pending"),
        ({"conditions": [{"type": "Created", "status": "True"}]}, "pending"),
        ({"conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]}, "running"),
        ({"conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]}, "succeeded"),
        ({"conditions": [{"type": "Complete", "status": "True", "message": "jobset completed"}]}, "succeeded"),
        # A running TrainJob: Trainer writes the JobSet's counts and no Running condition.
        ({"jobsStatus": [{"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0, "suspended": 0}]},
         "pending"),
        ({"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed"}]}, "pending"),
        ({"conditions": [{"type": "Running", "status": "True"},
                         {"type": "Failed", "status": "True", "message": "pod master-0 OOMKilled"}]}, "failed"),
    ],
)
def test_job_state_from_conditions(status: dict | None, expected: str) -> None:
    state, message = job_state(status)
    assert state == expected
    if expected == "failed":
        assert "OOMKilled" in message


LAUNCHER_SPEC = {  # as the API returns the launching pod (sanitize_for_serialization)
    "containers": [{"name": "main", "image": "registry/klear-gpu:0.1.0"}],
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "imagePullSecrets": [{"name": "registry-key"}],
    "serviceAccountName": "pipeline-runner",
    "restartPolicy": "Never",
}
WORKFLOW = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "klear-reasoner-x7k2p",
            "uid": "5d0c6a1e-0000-4000-8000-000000000001", "controller": True, "blockOwnerDeletion": True}
LAUNCHER_POD = {"metadata": {"labels": {"klear.io/runs-untrusted-code": "true", "pipeline/runid": "3f6c"},
                             "ownerReferences": [WORKFLOW]},
                "spec": LAUNCHER_SPEC}
RUN_ID = "3f6c0a52-1b7e-4d8e-9d0a-5a3c2b1e0f99"


def _environ(pod: str, run_id: str = RUN_ID) -> dict[str, str]:
    return {"KLEAR_TRAIN_IMAGE": "registry.example.com/klear/klear-gpu:1.2.3", "KLEAR_POD_NAME": pod,
            "KLEAR_RUN_ID": run_id}


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_a_retried_launcher_names_the_same_job_and_the_run_owns_it(api: str) -> None:
    """gppo-math and gppo-code of one run get two jobs; a retry of gppo-math (another pod) names gppo-math's job,
    so it re-attaches; another run gets its own. Every job is owned by the run's Workflow, not by a pod, and
    runs the compiled image with the launching pod's scheduling."""
    from klear.gppo.stage import STAGE as GPPO
    from klear.training.trainjob import plan_job

    jobs = []
    for step, pod, run_id in (("gppo-math", "klear-reasoner-x7k2p-system-container-impl-1", RUN_ID),
                              ("gppo-code", "klear-reasoner-x7k2p-system-container-impl-2", RUN_ID),
                              ("gppo-math", "klear-reasoner-x7k2p-system-container-impl-3", RUN_ID),  # the retry
                              ("gppo-math", "klear-reasoner-q9m4z-system-container-impl-1", "another-run")):
        environ = {**_environ(pod, run_id), **({"KLEAR_TRAINER_API": "v2", "KLEAR_TRAINER_RUNTIME": "klear-torch"}
                                               if api == "v2" else {})}
        spec, v2 = plan_job(GPPO, step, "s3://m", ["s3://d"], f"s3://runs/r/{step}", step.split("-")[1], [], 2, 8,
                            environ, "team-a", LAUNCHER_POD)
        assert v2 == (api == "v2")
        job = render_trainjob(spec) if v2 else render_pytorchjob(spec)
        assert validate_manifest(job) == [], validate_manifest(job)
        jobs.append(job)
    math, code, retry, other_run = [job["metadata"]["name"] for job in jobs]
    assert retry == math and len({math, code, other_run}) == 3
    assert all(len(n) <= 63 and n.startswith("klear-gppo-") for n in (math, code, other_run))
    for job in jobs:
        (owner,) = job["metadata"]["ownerReferences"]
        assert owner == {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": WORKFLOW["name"],
                         "uid": WORKFLOW["uid"], "blockOwnerDeletion": False}
    assert jobs[0]["metadata"]["labels"]["klear.io/run-id"] == RUN_ID
    if api == "v1":
        pod_spec = jobs[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        assert pod_spec["containers"][0]["image"] == "registry.example.com/klear/klear-gpu:1.2.3"
        assert jobs[0]["spec"]["runPolicy"]["ttlSecondsAfterFinished"] > 0
    else:
        assert jobs[0]["spec"]["trainer"]["image"] == "registry.example.com/klear/klear-gpu:1.2.3"
        assert jobs[0]["spec"]["runtimeRef"]["name"] == "klear-torch"
        pod_spec = _patched_pod(jobs[0])["spec"]
    pod_labels = (jobs[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"] if api == "v1"
                  else _patched_pod(jobs[0])["metadata"]["labels"])
    assert pod_labels["klear.io/runs-untrusted-code"] == "true"  # the NetworkPolicy covers the job's pods too
    assert "pipeline/runid" not in pod_labels  # only the project's own labels are carried over
    assert pod_spec["tolerations"] == LAUNCHER_SPEC["tolerations"]
    assert pod_spec["nodeSelector"] == LAUNCHER_SPEC["nodeSelector"]
    assert pod_spec["imagePullSecrets"] == [{"name": "registry-key"}]
    assert pod_spec["serviceAccountName"] == "pipeline-runner" and "restartPolicy" not in pod_spec


def test_plan_names_every_missing_variable() -> None:
    from klear.training.trainjob import plan_job

    with pytest.raises(RuntimeError, match="KLEAR_TRAIN_IMAGE, KLEAR_RUN_ID"):
        plan_job(SFT, "sft", "m", ["d"], "o", "paper", [], 2, 8, {"KLEAR_POD_NAME": "p"}, "ns", {})


def test_outside_a_workflow_the_job_has_no_owner() -> None:
    from klear.training.trainjob import plan_job

    spec, _ = plan_job(SFT, "sft", "m", ["d"], "o", "paper", [], 2, 8, _environ("p"), "ns",
                       {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}]}})
    assert spec.owner is None and "ownerReferences" not in render_pytorchjob(spec)["metadata"]


@pytest.mark.parametrize(("state", "decision"), [(None, "create"), ("pending", "attach"), ("running", "attach"),
                                                 ("succeeded", "done"), ("failed", "replace")])
def test_attach_decision(state: str | None, decision: str) -> None:
    from klear.training.trainjob import attach_decision

    assert attach_decision(state) == decision


def test_a_reconnected_kubelet_stream_skips_what_was_printed() -> None:
    """Lines read with timestamps=true: marks sort as times (fractions of any length), a reconnected stream starts
    a second early (sinceSeconds) and what was printed already is skipped."""
    from datetime import UTC, datetime

    from klear.training.trainjob import lines_after, since_seconds, timestamped_line

    first = ["2026-12-06T08:00:00.5Z step 1\n", "2026-12-06T08:00:00.123456789Z step 2\n",
             "2026-12-06T08:00:01Z step 3\n"]
    assert timestamped_line(first[0]) == ("2026-12-06T08:00:00.500000000", "step 1")
    assert timestamped_line(first[2]) == ("2026-12-06T08:00:01.000000000", "step 3")
    marks = [timestamped_line(line)[0] for line in first]
    assert marks[1] < marks[0] < marks[2]
    seen = "2026-12-06T08:00:00.500000000"  # "step 1" was the last line printed before the stream broke
    again = ["2026-12-06T07:59:59.9Z step 0\n", first[0], "2026-12-06T08:00:00.500000001Z step 1b\n", first[2]]
    assert [text for _, text in lines_after(again, seen)] == ["step 1b", "step 3"]
    assert [text for _, text in lines_after(first[:1], None)] == ["step 1"]
    assert since_seconds(None, datetime.now(UTC)) is None
    assert since_seconds(seen, datetime(2026, 12, 6, 8, 0, 10, tzinfo=UTC)) == 11  # 9.5 s ago, rounded up, + 1
    with pytest.raises(ValueError, match="log line without a timestamp: 'step 4'"):
        timestamped_line("step 4")


def test_region_is_optional_in_the_secret() -> None:
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in
           render_pytorchjob(SPEC)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_REGION"].get("optional") is True and "optional" not in env["AWS_ACCESS_KEY_ID"]
    # Tracking credentials (MLflow, W&B) from their own Secret, which may be absent: every key optional.
    assert env["MLFLOW_TRACKING_PASSWORD"] == {"name": "klear-tracking", "key": "MLFLOW_TRACKING_PASSWORD", "optional": True}
    assert env["WANDB_API_KEY"]["optional"] is True


class _ApiServer(BaseHTTPRequestHandler):
    """Answers every request as an API server refusing an unknown field under strict field validation, and keeps
    what it was sent."""

    requests: list[tuple[str, str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append((self.command, self.path, body))
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "BadRequest", "code": 400,
                  "message": 'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: strict decoding error: '
                             'unknown field "spec.runtimePatches"'}
        reply = json.dumps(status).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def api_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    _ApiServer.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_jobs_are_created_with_strict_field_validation(api_server: str) -> None:
    """The kubernetes client sends fieldValidation=Strict, so a cluster whose CRD lacks a field (Trainer v2.1 and
    runtimePatches) refuses the job instead of dropping the field; the error names it and the Trainer needed."""
    from kubernetes import client

    from klear.training.trainjob import KubernetesJobs

    cluster = KubernetesJobs("team-a", True, api_client=client.ApiClient(client.Configuration(host=api_server)))
    job = render_trainjob(SPEC)
    with pytest.raises(RuntimeError, match=r'refused TrainJob klear-sft-run-1: .*unknown field "spec.runtimePatches"; '
                                           r"TrainJob manifests are written for Kubeflow Trainer >= v2.2"):
        cluster.create(job)
    ((method, path, body),) = _ApiServer.requests
    assert method == "POST" and path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs?fieldValidation=Strict"
    assert body == job
