"""`accelerate launch` with 2 CPU processes: plain DDP and DeepSpeed ZeRO-3, through the shipped launch configs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from klear.common import storage
from klear.sft.stage import STAGE as SFT
from klear.training.launch import accelerate_command
from tests.conftest import free_port


def _launch(tiny_model: str, demo_files: list[str], tmp_path: Path, *sets: str) -> dict:
    # The very command the KFP component runs on a GPU node, here with 2 CPU processes.
    argv = accelerate_command(SFT, tiny_model, demo_files, str(tmp_path / "out"), "tiny",
                              ["num_epochs=1", "save_steps=4", *sets], processes_per_node=2, main_port=str(free_port()),
                              work_dir=str(tmp_path / "work"))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert done.stderr.count("INFO klear.sft: data:") == 2, "two ranks"
    return json.loads((tmp_path / "out" / "report.json").read_text())


def _single_process_steps(report: dict) -> int:
    return report["training"]["max_steps"] // 4  # the reference run: 4 epochs, one process


@pytest.mark.slow
def test_ddp_two_cpu_processes(tiny_model: str, demo_files: list[str], reference_run: dict, tmp_path: Path) -> None:
    # A checkpoint due by time after every step (save_minutes): the two ranks agree on it by rank 0's clock, or the
    # collective save would hang; save_steps=4 alone would publish every 4th step.
    report = _launch(tiny_model, demo_files, tmp_path, "save_minutes=0.00001", "keep_checkpoints=1000")
    one_process = _single_process_steps(reference_run["report"])
    # Each rank takes half of the packed rows: half the optimizer steps of one process (rounded up).
    assert report["training"]["global_step"] == -(-one_process // 2)
    assert report["training"]["checkpoints_published"] == list(range(1, report["training"]["global_step"] + 1))
    assert report["metrics"]["final_loss"] < report["metrics"]["first_loss"]


@pytest.mark.slow
def test_deepspeed_zero3_two_cpu_processes(tiny_model: str, demo_files: list[str], reference_run: dict,
                                           tmp_path: Path) -> None:
    report = _launch(tiny_model, demo_files, tmp_path, "deepspeed=zero3")
    steps = report["training"]["global_step"]
    assert steps == -(-_single_process_steps(reference_run["report"]) // 2)
    # The checkpoint holds both ranks' ZeRO-3 partitions; the final model is gathered into one full safetensors.
    ckpt = storage.read_manifest(str(tmp_path / "out" / "checkpoints" / f"step-{steps:09d}"))
    shards = [name for name in ckpt.files if "zero_pp_rank_" in name and name.endswith("optim_states.pt")]
    assert len(shards) == 2
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    reference = AutoModelForCausalLM.from_pretrained(reference_run["output"])
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
    assert all(p.abs().sum() > 0 for p in model.parameters())
