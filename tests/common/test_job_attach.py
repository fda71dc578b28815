"""The launcher against jobs that are local processes (tests.local_cluster): a failed job is replaced, a job an
older launcher named after its pod is deleted first, a job that fails or disappears while followed is an error
that names it."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

from klear.sft.stage import STAGE as SFT
from klear.training.trainjob import JobFailed, JobSpec, follow_job, render_pytorchjob, start_or_attach
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


def _wait_for(jobs: LocalJobs, name: str, state: str, timeout_s: float = 30) -> None:
    from klear.training.trainjob import job_state

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
