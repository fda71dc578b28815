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
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]} == {"klear-s3", "klear-tracking"}
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


LAUNCHER_SPEC = {  # as the API returns the launching pod (sanitize_for_serialization)
    "containers": [{"name": "main", "image": "registry/klear-gpu:0.1.0"}],
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "imagePullSecrets": [{"name": "registry-key"}],
    "serviceAccountName": "pipeline-runner",
    "restartPolicy": "Never",
}
LAUNCHER_POD = {"metadata": {"labels": {"klear.io/runs-untrusted-code": "true", "pipeline/runid": "3f6c"}},
                "spec": LAUNCHER_SPEC}


def _environ(pod: str) -> dict[str, str]:
    return {"KLEAR_TRAIN_IMAGE": "registry.example.com/klear/klear-gpu:1.2.3", "KLEAR_POD_NAME": pod,
            "KLEAR_POD_UID": f"uid-of-{pod}", "KLEAR_RUN_ID": "3f6c0a52-1b7e-4d8e-9d0a-5a3c2b1e0f99"}


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_both_rl_runs_of_one_run_get_distinct_owned_jobs(api: str) -> None:
    """gppo-math and gppo-code of one run, and a retry of gppo-math: three names, each owned by its pod, all
    with the compiled image and the launching pod's scheduling."""
    from klear.gppo.stage import STAGE as GPPO
    from klear.training.trainjob import plan_job

    jobs = []
    for step, pod in (("gppo-math", "klear-reasoner-x7k2p-system-container-impl-1"),
                      ("gppo-code", "klear-reasoner-x7k2p-system-container-impl-2"),
                      ("gppo-math", "klear-reasoner-x7k2p-system-container-impl-3")):  # the retry
        environ = {**_environ(pod), **({"KLEAR_TRAINER_API": "v2", "KLEAR_TRAINER_RUNTIME": "klear-torch"}
                                       if api == "v2" else {})}
        spec, v2 = plan_job(GPPO, step, "s3://m", ["s3://d"], f"s3://runs/r/{step}", step.split("-")[1], [], 2, 8,
                            environ, "team-a", LAUNCHER_POD)
        assert v2 == (api == "v2")
        job = render_trainjob(spec) if v2 else render_pytorchjob(spec)
        assert validate_manifest(job) == [], validate_manifest(job)
        jobs.append(job)
    names = [job["metadata"]["name"] for job in jobs]
    assert len(set(names)) == 3 and all(len(n) <= 63 and n.startswith("klear-gppo-") for n in names)
    for job, pod in zip(jobs, ("impl-1", "impl-2", "impl-3")):
        (owner,) = job["metadata"]["ownerReferences"]
        assert owner["kind"] == "Pod" and owner["name"].endswith(pod) and owner["uid"].endswith(pod)
        assert job["metadata"]["labels"]["klear.io/run-id"] == _environ("")["KLEAR_RUN_ID"]
    if api == "v1":
        pod_spec = jobs[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        assert pod_spec["containers"][0]["image"] == "registry.example.com/klear/klear-gpu:1.2.3"
        assert jobs[0]["spec"]["runPolicy"]["ttlSecondsAfterFinished"] > 0
    else:
        assert jobs[0]["spec"]["trainer"]["image"] == "registry.example.com/klear/klear-gpu:1.2.3"
        assert jobs[0]["spec"]["runtimeRef"]["name"] == "klear-torch"
        (override,) = jobs[0]["spec"]["podTemplateOverrides"]
        pod_spec = override["spec"]
    pod_labels = (jobs[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"] if api == "v1"
                  else jobs[0]["spec"]["podTemplateOverrides"][0]["metadata"]["labels"])
    assert pod_labels["klear.io/runs-untrusted-code"] == "true"  # the NetworkPolicy covers the job's pods too
    assert "pipeline/runid" not in pod_labels  # only the project's own labels are carried over
    assert pod_spec["tolerations"] == LAUNCHER_SPEC["tolerations"]
    assert pod_spec["nodeSelector"] == LAUNCHER_SPEC["nodeSelector"]
    assert pod_spec["imagePullSecrets"] == [{"name": "registry-key"}]
    assert pod_spec["serviceAccountName"] == "pipeline-runner" and "restartPolicy" not in pod_spec


def test_plan_names_every_missing_variable() -> None:
    from klear.training.trainjob import plan_job

    with pytest.raises(RuntimeError, match="KLEAR_TRAIN_IMAGE, KLEAR_POD_UID"):
        plan_job(SFT, "sft", "m", ["d"], "o", "paper", [], 2, 8, {"KLEAR_POD_NAME": "p", "KLEAR_RUN_ID": "r"}, "ns", {})


def test_region_is_optional_in_the_secret() -> None:
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in
           render_pytorchjob(SPEC)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_REGION"].get("optional") is True and "optional" not in env["AWS_ACCESS_KEY_ID"]
    # Tracking credentials (MLflow, W&B) from their own Secret, which may be absent: every key optional.
    assert env["MLFLOW_TRACKING_PASSWORD"] == {"name": "klear-tracking", "key": "MLFLOW_TRACKING_PASSWORD", "optional": True}
    assert env["WANDB_API_KEY"]["optional"] is True
