"""Kubeflow Trainer jobs as local processes, for the launcher's tests (klear.training.trainjob.JobCluster).

A job is a folder under the cluster's root holding its manifest. Creating it starts one process per node, in a
session of its own, running the manifest's command with the variables the operator injects (PyTorchJob: RANK,
MASTER_ADDR, MASTER_PORT, WORLD_SIZE; TrainJob: PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT) on a loopback
rendezvous, each node with its own TMPDIR as each pod has its own disk (removed with the job). A node's exit status is written beside
its log when it ends; the job's status conditions say Running, Succeeded or Failed as the operator's do. The
processes outlive the launcher that created them, as a job outlives its launcher pod.

    python -m tests.local_cluster ROOT --run-id R --step sft --nodes 2 --model M --data D --output O [--set K=V]

runs the launcher (klear.training.trainjob.plan_job + launch_job) against the jobs under ROOT, as a launching
pod of run R runs it; `--cut-log-after N` breaks its first log stream after N lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
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
        if failed := {rank: code for rank, code in codes.items() if code != 0}:
            condition = {"type": "Failed", "status": "True", "message": f"nodes exited with {failed}"}
        elif len(codes) == self._nodes(name):
            condition = {"type": "Succeeded", "status": "True"}
        else:
            condition = {"type": "Running", "status": "True"}
        return {**manifest, "status": {"conditions": [condition]}}

    def create(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        folder = self.root / name
        if folder.exists():
            raise FileExistsError(f"job {name} already exists")  # the API server answers 409 AlreadyExists
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    environ = {"KLEAR_TRAIN_IMAGE": "klear/klear-cpu:test", "KLEAR_RUN_ID": args.run_id}
    spec, v2 = plan_job(SFT, args.step, args.model, args.data, args.output, args.preset, args.overrides, args.nodes,
                        1, environ, "kubeflow", {"metadata": {"ownerReferences": [WORKFLOW]}})
    decision = launch_job(LocalJobs(args.root, args.cut_log_after), spec, v2, poll_seconds=0.5)
    print(f"launcher: {decision} {spec.name}", file=sys.stderr)


if __name__ == "__main__":
    main()
