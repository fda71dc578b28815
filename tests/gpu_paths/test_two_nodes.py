"""Distributed training as a cluster runs it: the command of a Kubeflow Trainer TrainJob's pods (rendered by
klear.training.trainjob, `exec python -m accelerate.commands.launch ...` with $PET_NODE_RANK, $PET_MASTER_ADDR,
$PET_MASTER_PORT) started twice on loopback as two nodes x one process, SFT under DeepSpeed ZeRO-3 on gloo
(DeepSpeed's CPU accelerator). Each "node" has its own $TMPDIR, as each pod has its own disk.

Resuming across node counts: with ZeRO-3 a checkpoint holds one optimizer partition per rank, which DeepSpeed
cannot re-split, so a run with another number of processes is refused by name (checkpoints.world_size_problem);
without DeepSpeed it resumes with a warning. Same node count: resumes (tests/sft, tests/gppo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from klear.common import storage
from klear.sft.stage import STAGE as SFT
from klear.training import checkpoints
from klear.training.trainjob import JobSpec, render_trainjob
from tests.conftest import free_port

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]


def node_command(nodes: int, model: str, data: list[str], output: str) -> list[str]:
    spec = JobSpec(name="klear-sft-test", image="klear/klear-cpu:test", stage=SFT, nodes=nodes, gpus_per_node=1,
                   model=model, data=data, output=output, preset="tiny",
                   overrides=["deepspeed=zero3", "num_epochs=1", "save_steps=4"])
    return list(render_trainjob(spec)["spec"]["trainer"]["command"])


def start_node(command: list[str], rank: int, port: int, tmp: Path) -> subprocess.Popen[str]:
    """One pod: the variables Trainer injects, `python` on PATH being this environment's interpreter."""
    (tmp / f"node-{rank}").mkdir(exist_ok=True)
    env = {**os.environ, "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "TMPDIR": str(tmp / f"node-{rank}")}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def two_nodes(tiny_model: str, demo_files: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("two-nodes")
    output = str(tmp / "sft")
    command, port = node_command(2, tiny_model, demo_files, output), free_port()
    assert command[:2] == ["bash", "-c"] and "--num_machines 2" in command[2] and "$PET_NODE_RANK" in command[2]
    nodes = [start_node(command, rank, port, tmp) for rank in (0, 1)]
    logs = [node.communicate(timeout=480)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    return {"output": output, "logs": logs, "tmp": tmp}


def test_sft_zero3_on_two_nodes_then_refused_on_one(two_nodes: dict[str, Any], tiny_model: str,
                                                    demo_files: list[str]) -> None:
    output = two_nodes["output"]
    assert all(log.count("INFO klear.sft: data:") == 1 for log in two_nodes["logs"]), "one rank per node"
    report = json.loads(storage.read_bytes(f"{output}/report.json"))
    assert report["training"]["global_step"] > 0 and report["metrics"]["final_loss"] < report["metrics"]["first_loss"]
    assert _newest_checkpoint(output).meta["world_size"] == 2

    # The same job on one node: the checkpoint's two ZeRO-3 partitions cannot be re-split for one process.
    one = start_node(node_command(1, tiny_model, demo_files, output), 0, free_port(), two_nodes["tmp"])
    log = one.communicate(timeout=300)[0]
    assert one.returncode != 0, log[-3000:]
    assert "the checkpoint was written by 2 processes and this run has 1: DeepSpeed ZeRO partitions cannot be " \
           "re-split" in log, log[-3000:]


@pytest.mark.xfail(strict=True, reason="known gap: only the world's rank 0 publishes a checkpoint, from its own "
                   "node's disk, so on several nodes the other nodes' ZeRO-3 partitions are not in it (a resume on "
                   "as many nodes would miss them). On one node all ranks share the disk and it is complete.")
def test_a_two_node_checkpoint_holds_every_ranks_partition(two_nodes: dict[str, Any]) -> None:
    names = sorted(n.split("/")[-1] for n in _newest_checkpoint(two_nodes["output"]).files
                   if n.endswith("optim_states.pt"))
    assert names == [f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)], names


def _newest_checkpoint(output: str) -> Any:
    return storage.read_manifest(str(checkpoints.checkpoint_uri(output, checkpoints.published_steps(output)[-1])))
