"""Kubeflow Trainer job manifests: rendered, validated against the Kubernetes schemas; job states, failures."""

from __future__ import annotations

import copy

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
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]} == {"klear-s3"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    single = render_pytorchjob(JobSpec(**{**SPEC.__dict__, "nodes": 1}))
    assert "Worker" not in single["spec"]["pytorchReplicaSpecs"] and validate_manifest(single) == []


def test_trainjob_renders_and_validates() -> None:
    job = render_trainjob(SPEC)
    assert validate_manifest(job) == []
    assert job["spec"]["trainer"]["numNodes"] == 4
    assert "--machine_rank $PET_NODE_RANK" in job["spec"]["trainer"]["command"][-1]


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
        ({"conditions": [{"type": "Running", "status": "True"},
                         {"type": "Failed", "status": "True", "message": "pod master-0 OOMKilled"}]}, "failed"),
    ],
)
def test_job_state_from_conditions(status: dict | None, expected: str) -> None:
    state, message = job_state(status)
    assert state == expected
    if expected == "failed":
        assert "OOMKilled" in message
