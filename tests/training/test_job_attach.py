"""The launcher against jobs that are local processes (tests.local_cluster): a failed job is replaced, a job an
older launcher named after its pod is deleted first, a job that fails or disappears while followed is an error
that names it; a TrainJob, which never says Running, has its master's log followed, and its pods get what its
runtime patch says, while a TrainJob a Trainer v2.3 cluster would refuse is refused."""

from __future__ import annotations

import copy
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from klear.sft.stage import STAGE as SFT
from klear.training.trainjob import JobFailed, JobSpec, follow_job, job_state, render_pytorchjob, render_trainjob, start_or_attach
from tests.local_cluster import LocalJobs

LABELS = {"klear.io/run-id": "run-1", "klear.io/step": "sft"}


def _job(name: str, script: str, nodes: int = 2) -> dict[str, Any]:
    """A PyTorchJob of this run and step whose nodes run `script` instead of training."""
    spec = JobSpec(name=name, image="klear/klear-cpu:test", stage=SFT, nodes=nodes, gpus_per_node=1, model="m",
                   data=["d"], output="o", preset="tiny", labels=LABELS)
    manifest = render_pytorchjob(spec)
    for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["containers"][0]["command"] = ["bash", "-c", script]
    return manifest


def _trainjob(name: str, script: str, nodes: int = 2) -> dict[str, Any]:
    """A TrainJob of this run and step, from a launching pod with scheduling and a klear.io/ label, whose nodes run
    `script` instead of training."""
    spec = JobSpec(name=name, image="klear/klear-cpu:test", stage=SFT, nodes=nodes, gpus_per_node=1, model="m",
                   data=["d"], output="o", preset="tiny", labels=LABELS, shm_size="1Gi",
                   scheduling={"nodeSelector": {"pool": "gpu"}, "serviceAccountName": "pipeline-runner",
                               "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
                   pod_labels={"klear.io/runs-untrusted-code": "true"})
    manifest = render_trainjob(spec)
    manifest["spec"]["trainer"]["command"] = ["bash", "-c", script]
    return manifest


def _wait_for(jobs: LocalJobs, name: str, state: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while job_state((jobs.get(name) or {}).get("status"))[0] != state:
        assert time.monotonic() < deadline, f"{name} never became {state}"
        time.sleep(0.05)


@pytest.fixture()
def jobs(tmp_path: Path):
    cluster = LocalJobs(tmp_path / "jobs")
    yield cluster
    cluster.delete_all()


def test_a_failed_job_is_replaced_and_an_older_launchers_job_deleted(jobs: LocalJobs) -> None:
    jobs.create(_job("klear-sft-named-after-a-pod", "sleep 600"))  # an older launcher's job: same run and step
    jobs.create(_job("klear-sft-1", 'echo "node $RANK failed"; exit 3'))
    _wait_for(jobs, "klear-sft-1", "failed")
    with pytest.raises(JobFailed, match=r"PyTorchJob klear-sft-1 failed: nodes exited with \{0: 3"):
        follow_job(jobs, "klear-sft-1", "PyTorchJob", poll_seconds=0.05)

    assert start_or_attach(jobs, _job("klear-sft-1", 'echo "node $RANK resumed"'), 0.05, 30) == "replace"
    assert jobs.names(LABELS) == ["klear-sft-1"]  # the older launcher's job is gone
    _wait_for(jobs, "klear-sft-1", "succeeded")  # ended before it is followed: its log is still printed
    printed = io.StringIO()
    follow_job(jobs, "klear-sft-1", "PyTorchJob", poll_seconds=0.05, out=printed)
    assert printed.getvalue().splitlines() == ["node 0 resumed"]  # the new job's master log, followed


def test_a_running_job_is_attached_and_a_finished_one_taken_as_done(jobs: LocalJobs) -> None:
    jobs.create(_job("klear-sft-1", 'echo "node $RANK up"; sleep 1; echo "node $RANK done"'))
    created = (Path(jobs.root) / "klear-sft-1" / "created").stat().st_mtime_ns
    assert start_or_attach(jobs, _job("klear-sft-1", "exit 9"), 0.05, 30) == "attach"
    printed = io.StringIO()
    follow_job(jobs, "klear-sft-1", "PyTorchJob", poll_seconds=0.05, out=printed)
    assert printed.getvalue().splitlines() == ["node 0 up", "node 0 done"]
    assert start_or_attach(jobs, _job("klear-sft-1", "exit 9"), 0.05, 30) == "done"
    assert (Path(jobs.root) / "klear-sft-1" / "created").stat().st_mtime_ns == created  # never created again


def test_a_job_deleted_while_followed_is_an_error(jobs: LocalJobs) -> None:
    jobs.create(_job("klear-sft-1", "sleep 600", nodes=1))
    _wait_for(jobs, "klear-sft-1", "running")
    jobs.delete("klear-sft-1")
    with pytest.raises(JobFailed, match="PyTorchJob klear-sft-1 is gone"):
        follow_job(jobs, "klear-sft-1", "PyTorchJob", poll_seconds=0.05)


def test_a_trainjob_has_its_master_log_followed_and_its_pods_patched(jobs: LocalJobs) -> None:
    """Trainer writes no Running condition: the launcher follows the master's log anyway. Each node's pod is the
    runtime's, with the runtime patch's /dev/shm, scheduling and labels merged in as Trainer merges them."""
    jobs.create(_trainjob("klear-sft-1", 'echo "node $PET_NODE_RANK up"; sleep 1; echo "node $PET_NODE_RANK done"'))
    status = (jobs.get("klear-sft-1") or {})["status"]
    assert "conditions" not in status and job_state(status)[0] == "pending"  # running, as Trainer says it
    printed = io.StringIO()
    follow_job(jobs, "klear-sft-1", "TrainJob", poll_seconds=0.05, out=printed)
    assert printed.getvalue().splitlines() == ["node 0 up", "node 0 done"]
    assert job_state((jobs.get("klear-sft-1") or {})["status"]) == ("succeeded", "jobset completed")

    pod = json.loads((Path(jobs.root) / "klear-sft-1" / "pod.json").read_text())
    (node,) = pod["spec"]["containers"]
    assert node["image"] == "klear/klear-cpu:test" and node["command"][-1].startswith('echo "node $PET_NODE_RANK up"')
    assert node["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert pod["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    assert node["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["metadata"]["labels"]["klear.io/runs-untrusted-code"] == "true"
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"} and pod["spec"]["serviceAccountName"] == "pipeline-runner"


def test_a_failed_trainjob_is_an_error_that_names_it(jobs: LocalJobs) -> None:
    jobs.create(_trainjob("klear-sft-1", 'echo "node $PET_NODE_RANK failed"; exit 3', nodes=1))
    printed = io.StringIO()
    with pytest.raises(JobFailed, match=r"TrainJob klear-sft-1 failed: nodes exited with \{0: 3\}"):
        follow_job(jobs, "klear-sft-1", "TrainJob", poll_seconds=0.05, out=printed)
    assert printed.getvalue().splitlines() == ["node 0 failed"]


@pytest.mark.parametrize(("change", "refusal"), [
    pytest.param("v2.1", "'podTemplateOverrides' was unexpected", id="v2.1"),  # Trainer v2.1's field: unknown to v2.2+
    pytest.param("env", "container 'node' takes env from spec.trainer only", id="env"),
    pytest.param("manager", "manager 'klear' is not a domain-prefixed path", id="manager"),
    pytest.param("container", "job node has no container 'trainer'", id="container"),
    pytest.param("mount", "mounts 'dshm', which is no volume of the pod", id="mount"),
])
def test_a_trainjob_trainer_would_refuse_is_refused(jobs: LocalJobs, change: str, refusal: str) -> None:
    manifest = copy.deepcopy(_trainjob("klear-sft-1", "exit 0"))
    (patch,) = manifest["spec"]["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    if change == "v2.1":
        del manifest["spec"]["runtimePatches"]
        manifest["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}], **pod}]
    elif change == "env":
        pod["spec"]["containers"][0]["env"] = [{"name": "NCCL_DEBUG", "value": "INFO"}]
    elif change == "manager":
        patch["manager"] = "klear"
    elif change == "container":
        pod["spec"]["containers"][0]["name"] = "trainer"
    else:
        del pod["spec"]["volumes"]
    with pytest.raises(ValueError, match="TrainJob klear-sft-1 refused: .*" + refusal):
        jobs.create(manifest)
    assert jobs.get("klear-sft-1") is None
