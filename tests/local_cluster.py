"""Kubeflow Trainer jobs as local processes, for the launcher's tests (klear.training.trainjob.JobCluster).

A job is a folder under the cluster's root holding its manifest. Creating it first does what the API server and
the operator would refuse: a TrainJob is checked as a Kubeflow Trainer v2.3 cluster checks it (strict field
validation against Trainer's own CRD, vendored in tests/deploy/crds/, then Trainer's webhook rules for runtime
patches), and the pod each node runs (pod.json: a PyTorchJob's Master template; for a TrainJob, the runtime's
`node` template with the trainer fields and runtimePatches merged in, as Trainer builds it) must be a valid Pod
whose every volume mount names a volume. Then it starts one process per node, in a session of its own, running the
manifest's command with the variables the operator injects (PyTorchJob: RANK, MASTER_ADDR, MASTER_PORT,
WORLD_SIZE; TrainJob: PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT) on a loopback rendezvous, each node with its
own TMPDIR as each pod has its own disk (removed with the job). A node's exit status is written beside its log when
it ends; the job's status says what its operator's says: a PyTorchJob's conditions Created, Running, Succeeded or
Failed (Training Operator v1), a TrainJob's jobsStatus and, only once it ends, Complete or Failed (Trainer has no
Running condition). The processes outlive the launcher that created them, as a job outlives its launcher pod.

    python -m tests.local_cluster ROOT --run-id R --step sft --nodes 2 --model M --data D --output O [--set K=V]

runs the launcher (klear.training.trainjob.plan_job + launch_job) against the jobs under ROOT, as a launching
pod of run R runs it; `--cut-log-after N` breaks its first log stream after N lines, `--trainer-api v2` makes
the launcher create a TrainJob.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

WORKFLOW = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "klear-reasoner-x7k2p",
            "uid": "5d0c6a1e-0000-4000-8000-000000000001", "controller": True, "blockOwnerDeletion": True}
# The launching pod of `main`, as the API returns it: the run's Workflow owns it; its klear.io/ label and scheduling
# are what the job's pods take from it.
LAUNCHER_POD = {"metadata": {"ownerReferences": [WORKFLOW], "labels": {"klear.io/runs-untrusted-code": "true"}},
                "spec": {"serviceAccountName": "pipeline-runner", "nodeSelector": {"pool": "gpu"},
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}
# Trainer's own torch-distributed ClusterTrainingRuntime (v2.3 manifests/base/runtimes/torch_distributed.yaml): its
# replicated jobs, the only ones a runtime patch may name, and the pod template each of them starts from.
RUNTIME_JOBS = {"node": {"spec": {"containers": [{"name": "node",
                                                  "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}]}}}
ENV_SET_BY_TRAINER = {"node", "dataset-initializer", "model-initializer"}  # a runtime patch may not give them env
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _free_port() -> int:
    from tests.conftest import free_port

    return free_port()


class LocalJobs:
    """A JobCluster whose jobs are local processes (see the module's docstring)."""

    def __init__(self, root: Path, cut_log_after: int | None = None, poll_seconds: float = 0.1) -> None:
        self.root, self.cut_log_after, self.poll_seconds = root, cut_log_after, poll_seconds
        root.mkdir(parents=True, exist_ok=True)

    def _manifest(self, name: str) -> dict[str, Any] | None:
        path = self.root / name / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else None

    def _nodes(self, name: str) -> int:
        return len(list((self.root / name).glob("node-*.pid")))

    def get(self, name: str) -> dict[str, Any] | None:
        manifest = self._manifest(name)
        if manifest is None:
            return None
        codes = {rank: int(path.read_text()) for rank in range(self._nodes(name))
                 if (path := self.root / name / f"node-{rank}.exit").exists() and path.read_text().strip()}
        return {**manifest, "status": job_status(manifest["kind"], self._nodes(name), codes)}

    def create(self, manifest: dict[str, Any]) -> None:
        name, kind = manifest["metadata"]["name"], manifest["kind"]
        folder = self.root / name
        if folder.exists():
            raise FileExistsError(f"job {name} already exists")  # the API server answers 409 AlreadyExists
        # The API server answers 400/422; a job whose pods it would refuse stays without pods: refused here, louder.
        if kind == "TrainJob" and (refusals := trainjob_refusals(manifest)):
            raise ValueError(f"{kind} {name} refused: " + "; ".join(refusals))
        pod = node_pod(manifest)
        if refusals := pod_refusals(pod):
            raise ValueError(f"{kind} {name} refused: " + "; ".join(refusals))
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
        (folder / "pod.json").write_text(json.dumps(pod))
        (folder / "created").write_text("")
        port = str(_free_port())
        for rank, (command, variables) in enumerate(_node_commands(manifest, port)):
            # A short path of its own: multiprocessing's sockets live under TMPDIR and a socket path has 107 bytes.
            disk = Path(tempfile.mkdtemp(prefix=f"node{rank}-"))
            (folder / f"node-{rank}.tmpdir").write_text(str(disk))
            env = {**os.environ, **variables, "TMPDIR": str(disk),
                   "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            exit_file = folder / f"node-{rank}.exit"
            line = f"{shlex.join(command)}; echo $? > {shlex.quote(str(exit_file))}"
            with (folder / f"node-{rank}.log").open("wb") as log:
                node = subprocess.Popen(["bash", "-c", line], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            (folder / f"node-{rank}.pid").write_text(str(node.pid))

    def delete(self, name: str) -> None:
        folder = self.root / name
        for pid_file in folder.glob("node-*.pid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        for disk in folder.glob("node-*.tmpdir"):
            shutil.rmtree(disk.read_text(), ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)

    def names(self, labels: Mapping[str, str]) -> list[str]:
        return sorted(path.parent.name for path in self.root.glob("*/manifest.json")
                      if labels.items() <= json.loads(path.read_text())["metadata"]["labels"].items())

    def master_log(self, name: str, after: str | None) -> Iterator[tuple[str, str]]:
        """node-0's log, followed until it exits; a line's mark is its number. The first stream breaks after
        `cut_log_after` lines when that is set, as a connection to the API server can."""
        import time

        start = -1 if after is None else int(after)
        log_path, exit_path = self.root / name / "node-0.log", self.root / name / "node-0.exit"
        sent, number, buffer = 0, -1, b""
        with log_path.open("rb") as log:
            while True:
                done = exit_path.exists()  # before the read: every line written before the exit is read
                buffer += log.read()
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    number += 1
                    if number <= start:
                        continue
                    if self.cut_log_after is not None and sent == self.cut_log_after:
                        self.cut_log_after = None
                        raise ConnectionResetError("the log stream was cut (tests.local_cluster)")
                    sent += 1
                    yield f"{number:012d}", raw.decode(errors="replace")
                if done:
                    return
                time.sleep(self.poll_seconds)

    def delete_all(self) -> None:
        for manifest in self.root.glob("*/manifest.json"):
            self.delete(manifest.parent.name)


def job_status(kind: str, nodes: int, codes: Mapping[int, int]) -> dict[str, Any]:
    """A job's status as its operator writes it, from the exit codes of the nodes that ended (rank -> code)."""
    failed = {rank: code for rank, code in codes.items() if code != 0}
    done = not failed and len(codes) == nodes
    if kind == "TrainJob":  # Trainer: the JobSet's counts of child Jobs (one: `node`); Complete or Failed at the end
        counts = {"active": int(not (failed or done)), "ready": int(not (failed or done)), "succeeded": int(done),
                  "failed": int(bool(failed)), "suspended": 0}
        status: dict[str, Any] = {"jobsStatus": [{"name": "node", **counts}]}
        if failed:
            status["conditions"] = [{"type": "Failed", "status": "True", "reason": "FailedJobs",
                                     "message": f"nodes exited with {failed}"}]
        elif done:
            status["conditions"] = [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted",
                                     "message": "jobset completed"}]
        return status
    conditions = [{"type": "Created", "status": "True"},
                  {"type": "Running", "status": "False" if failed or done else "True"}]
    if failed:
        conditions.append({"type": "Failed", "status": "True", "message": f"nodes exited with {failed}"})
    elif done:
        conditions.append({"type": "Succeeded", "status": "True"})
    return {"conditions": conditions}


def _at(obj: Any, *keys: str) -> Any:
    for key in keys:
        obj = (obj or {}).get(key)
    return obj


def trainjob_refusals(manifest: dict[str, Any]) -> list[str]:
    """Why a Kubeflow Trainer v2.3 cluster would refuse to create this TrainJob: the API server's strict field
    validation against Trainer's CRD, then Trainer's webhook (a runtime patch's manager is a domain-prefixed path,
    it names only the runtime's replicated jobs and their containers, and gives Trainer's containers no env)."""
    from tests.deploy.helpers import validation_errors

    if refusals := validation_errors(manifest):
        return refusals  # the webhook only sees what the schema let through
    for patch in _at(manifest, "spec", "runtimePatches") or []:
        host, _, path = str(patch.get("manager")).partition("/")
        if not (DNS_SUBDOMAIN.fullmatch(host) and path):
            refusals.append(f"runtimePatches: manager {patch.get('manager')!r} is not a domain-prefixed path")
        for job in _at(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs") or []:
            if job["name"] not in RUNTIME_JOBS:
                refusals.append(f"runtimePatches: the runtime has no replicated job {job['name']!r}")
                continue
            known = {c["name"] for c in RUNTIME_JOBS[job["name"]]["spec"]["containers"]}
            for container in _at(job, "template", "spec", "template", "spec", "containers") or []:
                if container["name"] not in known:
                    refusals.append(f"runtimePatches: job {job['name']} has no container {container['name']!r}")
                elif container.get("env") and container["name"] in ENV_SET_BY_TRAINER:
                    refusals.append(f"runtimePatches: container {container['name']!r} takes env from spec.trainer only")
    return refusals


def strategic_merge(base: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge as far as pod patches use it: maps merge, lists of named items merge by name
    (new ones appended), anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{key: strategic_merge(base[key], value) if key in base else value
                           for key, value in patch.items()}}
    if (isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(item, dict) and "name" in item for item in base + patch)):
        named = {item["name"]: item for item in patch}
        merged = [strategic_merge(item, named.pop(item["name"])) if item["name"] in named else item for item in base]
        return merged + list(named.values())
    return patch


def node_pod(manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod template a job's nodes run, as its operator builds it: a PyTorchJob's Master template; for a TrainJob
    the runtime's `node` template, the trainer's image, command, env and resources in its `node` container, and
    every runtime patch of the `node` job merged in."""
    if manifest["kind"] != "TrainJob":
        return dict(manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    trainer = manifest["spec"].get("trainer") or {}
    fields = {"image": trainer.get("image"), "command": trainer.get("command"), "args": trainer.get("args"),
              "env": trainer.get("env"), "resources": trainer.get("resourcesPerNode")}
    container = {"name": "node", **{key: value for key, value in fields.items() if value is not None}}
    pod = strategic_merge(RUNTIME_JOBS["node"], {"spec": {"containers": [container]}})
    for patch in manifest["spec"].get("runtimePatches") or []:
        for job in _at(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs") or []:
            if job.get("name") == "node":
                pod = strategic_merge(pod, _at(job, "template", "spec", "template") or {})
    return pod


def pod_refusals(pod: dict[str, Any]) -> list[str]:
    """Why the API server would refuse a pod of this template: Kubernetes' strict Pod schema, and a volume mount
    that names no volume of the pod."""
    from tests.deploy.helpers import validation_errors

    refusals = validation_errors({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "node-0", **pod.get("metadata", {})},
                                  "spec": pod["spec"]})
    volumes = {volume["name"] for volume in pod["spec"].get("volumes") or []}
    for container in pod["spec"].get("containers") or []:
        refusals += [f"pod: container {container['name']} mounts {mount['name']!r}, which is no volume of the pod"
                     for mount in container.get("volumeMounts") or [] if mount["name"] not in volumes]
    return refusals


def _node_commands(manifest: dict[str, Any], port: str) -> list[tuple[list[str], dict[str, str]]]:
    """(command, variables) of each node of a PyTorchJob or TrainJob, master first."""
    if manifest["kind"] == "TrainJob":
        trainer = manifest["spec"]["trainer"]
        return [(trainer["command"], {"PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1",
                                      "PET_MASTER_PORT": port}) for rank in range(trainer["numNodes"])]
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    commands = [replicas["Master"]["template"]["spec"]["containers"][0]["command"]]
    if "Worker" in replicas:
        commands += [replicas["Worker"]["template"]["spec"]["containers"][0]["command"]] * replicas["Worker"]["replicas"]
    return [(command, {"RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                       "WORLD_SIZE": str(len(commands))}) for rank, command in enumerate(commands)]


def main(argv: list[str] | None = None) -> None:
    from klear.sft.stage import STAGE as SFT
    from klear.training.trainjob import launch_job, plan_job

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--step", default="sft")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", nargs="+", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--cut-log-after", type=int)
    parser.add_argument("--trainer-api", choices=["v1", "v2"], default="v1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    environ = {"KLEAR_TRAIN_IMAGE": "klear/klear-cpu:test", "KLEAR_RUN_ID": args.run_id,
               "KLEAR_TRAINER_API": args.trainer_api}
    spec, v2 = plan_job(SFT, args.step, args.model, args.data, args.output, args.preset, args.overrides, args.nodes,
                        1, environ, "kubeflow", LAUNCHER_POD)
    decision = launch_job(LocalJobs(args.root, args.cut_log_after), spec, v2, poll_seconds=0.5)
    print(f"launcher: {decision} {spec.name}", file=sys.stderr)


if __name__ == "__main__":
    main()
