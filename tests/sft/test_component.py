"""The sft KFP component: single-stage pipeline under kfp.local with everything on S3; metrics and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klear.common import storage
from klear.demo.generate import generate
from klear.demo.tiny_model import build
from klear.sft.report import metric_items, render_markdown
from klear.sft.stage import STAGE as SFT
from klear.training.launch import accelerate_command, shell_line


def test_report_to_metrics_and_markdown(reference_run: dict) -> None:
    report = reference_run["report"]
    items = dict(metric_items(report))
    assert items["records_kept"] == report["data"]["kept"] and items["skipped_no_assistant"] == 8
    assert {"final_loss", "final_learning_rate", "final_grad_norm", "tokens_per_second", "global_step"} <= set(items)
    text = render_markdown(report)
    assert "| no_assistant | 8 |" in text and f"Optimizer steps: {report['training']['global_step']}" in text


def test_node_command_uses_zero3_for_the_paper_preset() -> None:
    argv = accelerate_command(SFT, "s3://m/base", ["s3://d/sft"], "s3://o/sft", "paper", ["save_steps=100"], 8, nodes=4,
                              machine_rank="$PET_NODE_RANK", main_address="$PET_MASTER_ADDR", main_port="$PET_MASTER_PORT")
    assert argv[argv.index("--config_file") + 1].endswith("launch_configs/zero3.yaml")
    assert argv[argv.index("--num_processes") + 1] == "32" and argv[argv.index("--num_machines") + 1] == "4"
    line = shell_line(argv, ("$PET_NODE_RANK", "$PET_MASTER_ADDR", "$PET_MASTER_PORT"))
    assert "--machine_rank $PET_NODE_RANK" in line and "--set save_steps=100" in line
    tiny = accelerate_command(SFT, "m", ["d"], "o", "tiny", [], 2)
    assert tiny[tiny.index("--config_file") + 1].endswith("launch_configs/ddp.yaml")


@pytest.mark.slow
def test_single_stage_pipeline_on_s3(s3_bucket: str, tmp_path: Path) -> None:
    from pipelines.compile import compile_all
    from pipelines.run_local import run_compiled

    compile_all(tmp_path / "compiled")
    build(f"{s3_bucket}/models/tiny")
    generate(f"{s3_bucket}/data", math_count=40, code_count=8, seed=3, arithmetic_count=0, benchmark_count=0)
    task = run_compiled(
        "klear-sft", tmp_path / "kfp",
        {"base_model_uri": f"{s3_bucket}/models/tiny", "data_uri": f"{s3_bucket}/data", "preset": "tiny",
         "run_root": f"{s3_bucket}/runs", "gpus_per_node": 0},
        tmp_path / "compiled",
    )
    location = task.output.metadata["uri"]
    assert location.startswith(f"{s3_bucket}/runs/") and location.endswith("/sft")
    manifest = storage.read_manifest(location)
    assert "model.safetensors" in manifest.files and "chat_template.jinja" in manifest.files
    report = json.loads(storage.read_bytes(f"{location}/report.json"))
    assert report["data"]["read"] == 40 + 12 + 8 and task.output.metadata["global_step"] == report["training"]["global_step"]
    # The training curves as the task's HTML artifact, beside its metrics.
    (curves,) = [p for p in (tmp_path / "kfp").rglob("curves") if p.is_file()]
    assert "data:image/png;base64," in curves.read_text() and "train/loss" in curves.read_text()
