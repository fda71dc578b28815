"""The gppo stage as the pipeline runs it: two-process launch, Trainer job manifest, KFP outputs, single-stage rerun."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from klear.common import storage
from klear.gppo.report import metric_items, render_markdown
from klear.gppo.stage import STAGE as GPPO
from klear.training.launch import accelerate_command
from klear.training.trainjob import JobSpec, render_trainjob, validate_manifest
from tests.conftest import free_port

DIGITS = "reward.scorer=tests.gppo.toy_scorers:digit_fraction"


@pytest.mark.slow
def test_two_cpu_processes_share_rounds_and_refill(tiny_model: str, demo_files: list[str], tmp_path: Path) -> None:
    """The command the component runs on a GPU node, with 2 CPU processes (gloo): each rank generates for its own
    prompts, the filtering and refill decisions are taken together, and the step count matches one process."""
    argv = accelerate_command(GPPO, tiny_model, demo_files[:1], str(tmp_path / "out"), "tiny-math",
                              [DIGITS, "max_steps=4", "save_steps=2", "oversample=2.0"], processes_per_node=2,
                              main_port=str(free_port()), work_dir=str(tmp_path / "work"))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert done.stderr.count("INFO klear.gppo: data:") == 2, "two ranks"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["training"]["global_step"] == 4
    rows = [r for r in report["history"] if "reward" in r]
    assert len(rows) == 2 and all(r["fill_ratio"] == 1.0 for r in rows)


def test_trainer_job_runs_the_gppo_stage_on_every_node() -> None:
    spec = JobSpec(name="klear-gppo-run-1", image="registry/klear-gpu:0.1.0", stage=GPPO, nodes=2, gpus_per_node=8,
                   model="s3://b/sft", data=["s3://b/rl-code.parquet"], output="s3://b/gppo-code", preset="code",
                   overrides=["save_steps=4"])
    job = render_trainjob(spec)
    assert validate_manifest(job) == []
    line = json.dumps(job)
    assert "-m klear.cli gppo --model s3://b/sft" in line and "--config code --set save_steps=4" in line
    assert "launch_configs/zero3.yaml" in line  # the code preset trains under ZeRO-3


def _report(fill: float = 1.0) -> dict:
    return {"data": {"read": 10, "kept": 8, "skipped": {"no_answer": 2}, "skipped_examples": []},
            "training": {"global_step": 4, "max_steps": 4, "resumed_from_step": 2, "checkpoints_published": [2, 4],
                         "reward_timeouts": 1, "fill_ratio_min": fill},
            "history": [{"step": 1.0, "reward": 0.25, "accuracy": 0.5, "clip_frac_low": 0.0, "clip_frac_high": 0.0,
                         "entropy": 1.5, "completions/mean_length": 40.0, "groups_filtered_frac": 0.5},
                        {"step": 2.0, "clip_frac_low": 0.03, "clip_frac_high": 0.01}],
            "metrics": {"final_reward": 0.25, "nan_metric": float("nan")},
            "config": {"task": "math", "loss": "gppo", "eps_low": 0.2, "eps_high": 0.28, "sft_alpha": 0.1}}


def test_report_as_kfp_metrics_and_markdown() -> None:
    items = dict(metric_items(_report()))
    assert items["records_kept"] == 8 and items["skipped_no_answer"] == 2 and items["resumed_from_step"] == 2
    assert "nan_metric" not in items  # KFP rejects NaN
    text = render_markdown(_report(fill=0.5))
    assert "loss gppo" in text and "resumed from step 2" in text and "Reward timeouts: 1" in text
    assert "| 1 | 0.250 | 0.500 |" in text and "| 2 | - | - | 0.0300 | 0.0100 |" in text
    assert "fewer informative groups" in text


@pytest.mark.slow
def test_single_stage_math_rl_rerun_on_s3(tiny_model: str, s3_bucket: str, tmp_path: Path) -> None:
    from klear.demo.generate import generate
    from pipelines.compile import compile_all
    from pipelines.run_local import run_compiled

    compile_all(tmp_path / "compiled")
    generate(f"{s3_bucket}/data", math_count=24, code_count=4, seed=5, arithmetic_count=0, benchmark_count=0)
    task = run_compiled(
        "klear-gppo-math", tmp_path / "kfp",
        {"model_uri": tiny_model, "data_uri": f"{s3_bucket}/data", "preset": "tiny-math",
         "overrides": ["loss=cispo"], "run_root": f"{s3_bucket}/runs", "gpus_per_node": 0},
        tmp_path / "compiled",
    )
    location = task.output.metadata["uri"]
    assert location.startswith(f"{s3_bucket}/runs/") and location.endswith("/gppo-math")
    report = json.loads(storage.read_bytes(f"{location}/report.json"))
    data = report["data"]  # demo data: 24 math + 12 planted math prompts + 4 code problems (no answer)
    assert data["read"] == 40 and data["skipped"]["no_answer"] == 4
    assert data["kept"] + sum(data["skipped"].values()) == 40 and data["kept"] >= 30
    assert task.output.metadata["global_step"] == report["training"]["global_step"] == 4
    assert report["config"]["loss"] == "cispo"  # the ablation switch reached the stage
