"""Distributed training as a cluster runs it: the command of a Kubeflow Trainer TrainJob's pods (rendered by
klear.training.trainjob, `exec python -m accelerate.commands.launch ...` with $PET_NODE_RANK, $PET_MASTER_ADDR,
$PET_MASTER_PORT) started twice on loopback as two nodes x one process, SFT and GPPO (colocated vLLM on each node,
every weight sync checked) under DeepSpeed ZeRO-3 on gloo (DeepSpeed's CPU accelerator). Each "node" has a $TMPDIR of
its own, new each time it starts, as each pod has its own disk: a checkpoint is complete only with the partitions both
nodes uploaded.

Resuming across node counts: with ZeRO-3 a checkpoint holds one optimizer partition per rank, which DeepSpeed
cannot re-split, so a run with another number of processes is refused by name, both ways
(checkpoints.world_size_problem); without DeepSpeed it resumes with a warning. Same node count: resumes
(tests/sft, tests/gppo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from klear.common import storage, tracking
from klear.gppo.stage import STAGE as GPPO
from klear.sft.stage import STAGE as SFT
from klear.training import checkpoints
from klear.training.stage import TrainingStage
from klear.training.trainjob import JobSpec, render_trainjob
from tests.conftest import free_port
from tests.gpu_paths.conftest import VLLM_ENV
from tests.gpu_paths.test_gppo_vllm import TOLERANCE
from tests.training import kill, kill_after_checkpoint

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]

SFT_SETS = ["deepspeed=zero3", "num_epochs=1", "save_steps=4"]
NODE_DISKS: list[Path] = []  # the nodes' $TMPDIRs, removed after each test


@pytest.fixture(autouse=True)
def remove_node_disks() -> Iterator[None]:
    yield
    while NODE_DISKS:
        shutil.rmtree(NODE_DISKS.pop(), ignore_errors=True)


def node_command(nodes: int, model: str, data: list[str], output: str, stage: TrainingStage = SFT,
                 preset: str = "tiny", overrides: list[str] = SFT_SETS, processes_per_node: int = 1) -> list[str]:
    spec = JobSpec(name=f"klear-{stage.name}-test", image="klear/klear-cpu:test", stage=stage, nodes=nodes,
                   gpus_per_node=processes_per_node, model=model, data=data, output=output, preset=preset, overrides=overrides)
    return list(render_trainjob(spec)["spec"]["trainer"]["command"])


def run_nodes(command: list[str], nodes: int, tmp: Path, timeout: float = 480,
              env: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """`nodes` pods of one job, run to their end: (exit status, output) of each."""
    started = start_nodes(command, nodes, tmp, env)
    try:
        return [(node.wait(timeout=timeout), log.read_text()) for node, log in started]
    finally:
        kill(started)


def start_nodes(command: list[str], nodes: int, tmp: Path,
                env: dict[str, str] | None = None) -> list[tuple[subprocess.Popen[bytes], Path]]:
    port = free_port()
    return [start_node(command, rank, port, tmp, env or {}) for rank in range(nodes)]


def start_node(command: list[str], rank: int, port: int, tmp: Path,
               extra_env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    """One pod: the variables Trainer injects, `python` on PATH being this environment's interpreter; its output
    goes to a file (a pipe nobody reads while the other node is awaited fills up and stalls the job). Its disk is a
    short path of its own: multiprocessing's sockets live under $TMPDIR and a socket's path has 107 bytes, which a
    test's tmp_path under a pytest-xdist worker (popen-gw0/...) leaves too few of."""
    disk = Path(tempfile.mkdtemp(prefix=f"node{rank}-"))
    NODE_DISKS.append(disk)
    env = {**os.environ, **extra_env, "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "TMPDIR": str(disk)}
    log = tmp / f"node-{rank}-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        node = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    return node, log


@pytest.fixture(scope="module")
def two_nodes(tiny_model: str, demo_files: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("two-nodes")
    output = str(tmp / "sft")
    command = node_command(2, tiny_model, demo_files, output)
    assert command[:2] == ["bash", "-c"] and "--num_machines 2" in command[2] and "$PET_NODE_RANK" in command[2]
    nodes = run_nodes(command, 2, tmp)
    logs = [log for _, log in nodes]
    assert [code for code, _ in nodes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    return {"output": output, "logs": logs, "tmp": tmp}


def test_sft_zero3_on_two_nodes_then_refused_on_one(two_nodes: dict[str, Any], tiny_model: str,
                                                    demo_files: list[str]) -> None:
    output = two_nodes["output"]
    assert all(log.count("INFO klear.sft: data:") == 1 for log in two_nodes["logs"]), "one rank per node"
    report = json.loads(storage.read_bytes(f"{output}/report.json"))
    assert report["training"]["global_step"] > 0 and report["metrics"]["final_loss"] < report["metrics"]["first_loss"]

    # The same job on one node: the checkpoint's two ZeRO-3 partitions cannot be re-split for one process.
    [(code, log)] = run_nodes(node_command(1, tiny_model, demo_files, output), 1, two_nodes["tmp"], timeout=300)
    assert code != 0 and _refusal(output, 2, 1) in log, log[-3000:]


def test_a_two_node_checkpoint_holds_every_ranks_files(two_nodes: dict[str, Any]) -> None:
    _assert_complete(two_nodes["output"], ranks=2)


def test_a_one_node_checkpoint_is_refused_on_two_nodes(tiny_model: str, demo_files: list[str], tmp_path: Path) -> None:
    output, data, sets = str(tmp_path / "sft"), tmp_path / "few.jsonl", [*SFT_SETS[:2], "save_steps=2"]
    data.write_text("".join(Path(demo_files[0]).read_text().splitlines(keepends=True)[:24]))  # a few steps
    [(code, log)] = run_nodes(node_command(1, tiny_model, [str(data)], output, overrides=sets), 1, tmp_path)
    assert code == 0, log[-3000:]
    _assert_complete(output, ranks=1)
    for code, log in run_nodes(node_command(2, tiny_model, [str(data)], output, overrides=sets), 2, tmp_path, 300):
        assert code != 0 and _refusal(output, 1, 2) in log, log[-3000:]  # every node refuses, none trains


def test_a_checkpoint_resumes_on_another_layout_of_as_many_processes(two_nodes: dict[str, Any], tiny_model: str,
                                                                     demo_files: list[str], tmp_path: Path) -> None:
    """Two nodes x 1 process, killed after a checkpoint; one node x 2 processes resumes it and is killed after a
    later one; two nodes x 1 process resume that and finish. Each resume loads every rank's partitions, whichever
    node's disk wrote them, and the run ends as the uninterrupted two-node run ended. Reporting to W&B (offline):
    rank 0 alone reports, and the three attempts are one W&B run."""
    output, sets = str(tmp_path / "sft"), [*SFT_SETS[:2], "save_steps=2", "report_to=tensorboard,wandb"]
    (tmp_path / "wandb").mkdir()
    wandb = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb"), "WANDB_SILENT": "true"}
    two_nodes_command = node_command(2, tiny_model, demo_files, output, overrides=sets)
    one_node_command = node_command(1, tiny_model, demo_files, output, overrides=sets, processes_per_node=2)
    first = kill_after_checkpoint(start_nodes(two_nodes_command, 2, tmp_path, wandb), output, newer_than=0)
    second = kill_after_checkpoint(start_nodes(one_node_command, 1, tmp_path, wandb), output, newer_than=first)
    uninterrupted = json.loads(storage.read_bytes(f"{two_nodes['output']}/report.json"))
    total = uninterrupted["training"]["global_step"]
    assert first < second < total and not storage.exists(f"{output}/{storage.MANIFEST_NAME}"), "a run had finished"

    nodes = run_nodes(two_nodes_command, 2, tmp_path, env=wandb)
    assert [code for code, _ in nodes] == [0, 0], "\n".join(log[-3000:] for _, log in nodes)
    assert all(f"resuming from checkpoint checkpoint-{second}" in log for _, log in nodes)
    report = json.loads(storage.read_bytes(f"{output}/report.json"))
    assert report["training"]["resumed_from_step"] == second and report["training"]["global_step"] == total
    # Same partitions, data position and per-rank RNG after each resume: the last loss is the uninterrupted run's.
    assert report["metrics"]["final_loss"] == pytest.approx(uninterrupted["metrics"]["final_loss"], rel=1e-3)
    _assert_complete(output, ranks=2)
    ids = json.loads(storage.read_bytes(checkpoints.checkpoint_uri(output, total).join(tracking.RUN_FILE)))
    attempts = sorted(path.name for path in (tmp_path / "wandb").rglob("run-*.wandb"))
    assert attempts == [f"run-{ids['wandb']}.wandb"] * 3, attempts


def _refusal(output: str, written_by: int, now: int) -> str:
    uri = checkpoints.checkpoint_uri(output, checkpoints.published_steps(output)[-1])
    return f"the checkpoint {uri} was written by {written_by} processes and this run has {now}: DeepSpeed ZeRO " \
           "partitions cannot be re-split"


def _assert_complete(output: str, ranks: int) -> None:
    """The newest checkpoint lists every rank's ZeRO-3 partitions and RNG state, and nothing else is beside them."""
    uri = checkpoints.checkpoint_uri(output, checkpoints.published_steps(output)[-1])
    manifest = storage.read_manifest(uri)
    assert manifest.meta["world_size"] == ranks and manifest.meta["nodes"] == ranks
    names = sorted(name.split("/")[-1] for name in manifest.files)
    for kind in ("optim_states.pt", "model_states.pt"):  # bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt, ...
        partitions = [n for n in names if n.endswith(kind) and "zero_pp_rank_" in n]
        assert sorted(int(n.split("zero_pp_rank_")[1].split("_")[0]) for n in partitions) == list(range(ranks)), names
    if ranks > 1:
        assert {f"rng_state_{r}.pth" for r in range(ranks)} <= set(names), names
    # Exactly what the manifest lists (each node's record of its files went when the manifest was written).
    assert set(storage.list_files(uri)) - {storage.MANIFEST_NAME, storage.LEASE_NAME} == set(manifest.files)


def test_gppo_zero3_with_colocated_vllm_on_two_nodes(vllm_model: str, demo_files: list[str], tmp_path: Path) -> None:
    output = str(tmp_path / "gppo")
    sets = ["deepspeed=zero3", "max_steps=2", "save_steps=2", "use_vllm=true", f"vllm_sync_tolerance={TOLERANCE}",
            "reward.scorer=tests.gppo.toy_scorers:digit_fraction"]
    command = node_command(2, vllm_model, demo_files[:1], output, GPPO, "tiny-math", sets)
    nodes = run_nodes(command, 2, tmp_path, env=VLLM_ENV)
    assert [code for code, _ in nodes] == [0, 0], "\n".join(log[-3000:] for _, log in nodes)
    for _, log in nodes:  # each node's engine was synced and checked against its own copy of the policy
        gaps = [float(line.rsplit(" ", 1)[1]) for line in log.splitlines() if "log-prob gap after the weight sync" in line]
        assert gaps and max(gaps) < TOLERANCE, log[-3000:]
    _assert_complete(output, ranks=2)
