"""`klear plan` through the real command: the recipe's defaults on both shipped node shapes, and one planted
violation per check, named by stage, pipeline parameter and key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import klear
from tests.plan.conftest import CHART, COMPILED, ROOT


def run_in_root(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "klear.cli", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def failed(report: dict) -> list[dict]:
    return [c for c in report["checks"] if not c["ok"]]


@pytest.mark.parametrize("cluster", ["h100-80gb-x8", "h200-141gb-x8"])
def test_the_recipe_defaults(cluster: str) -> None:
    """By name from the checkout's root: pipelines/compiled/klear-reasoner.yaml and the chart's own values."""
    done = run_in_root("klear-reasoner", "--cluster", cluster, "--format", "json")
    report = json.loads(done.stdout)
    kinds = {c["check"].split(":")[0] for c in report["checks"]}
    assert {"settings", "context", "layout"} <= kinds
    assert failed(report) == [] and done.returncode == 0, failed(report)  # the shipped defaults pass
    layouts = [c for c in report["checks"] if c["check"].startswith("layout")]
    assert len(layouts) == 12 and all(c["ok"] for c in layouts)  # GPPO math and code, SFT: at 1, 2, 4, 8 nodes
    teacher = next(c for c in report["checks"] if c["check"] == "context: teacher_overrides server")
    assert teacher["ok"] and "40960" in teacher["detail"]
    assert report["estimates"]["cluster"]["name"] == cluster
    text = run_in_root("klear-reasoner", "--cluster", cluster)
    assert text.returncode == done.returncode and "STAGE" in text.stdout and "layout: gppo_math_overrides at 8 x 8 GPUs" in text.stdout


def test_a_typo_in_an_override_is_named() -> None:
    code, report = plan_in_root("--arg", 'gppo_code_overrides=["eps_hihg=0.3"]')
    bad = [c for c in failed(report) if c["check"] == "settings"]
    assert code == 1 and len(bad) == 1
    assert bad[0]["stage"] == "gppo" and "gppo_code_overrides" in bad[0]["detail"] and "eps_hihg" in bad[0]["detail"]


def test_a_wrong_type_and_a_range_are_named() -> None:
    code, report = plan_in_root("--arg", 'sft_overrides=["max_length=long"]', "--arg",
                                'reference_overrides=["top_p=2"]')
    bad = {c["stage"]: c["detail"] for c in failed(report) if c["check"] == "settings"}
    assert code == 1 and "sft_overrides" in bad["sft"] and "max_length" in bad["sft"]
    assert "reference_overrides" in bad["sample"] and "top_p" in bad["sample"]


def test_the_teacher_server_too_short_for_prompt_and_max_tokens() -> None:
    code, report = plan_in_root("--arg", 'teacher_overrides=["max_tokens=40000"]')
    (bad,) = [c for c in failed(report) if c["check"] == "context: teacher_overrides server"]
    assert code == 1 and bad["stage"] == "sample"
    assert "teacher.maxModelLen 40960" in bad["detail"] and "max_tokens 40000" in bad["detail"]


def test_chart_values_given_by_file(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("teacher:\n  maxModelLen: 32768\n")
    code, report = plan_in_root("--values", str(values))
    (bad,) = [c for c in failed(report) if c["check"] == "context: teacher_overrides server"]
    assert code == 1 and f"{values}: teacher.maxModelLen 32768 < prompt 4096" in bad["detail"]


def test_a_layout_that_does_not_split_is_named() -> None:
    code, report = plan_in_root("--arg", "rl_nodes=16")
    bad = [c for c in failed(report) if c["check"].startswith("layout")]
    assert code == 1 and [c["check"] for c in bad] == ["layout: gppo_math_overrides at rl_nodes=16 x 8 GPUs"]
    assert "per_device_batch_size" in bad[0]["detail"] and "128 processes" in bad[0]["detail"]
    code, report = plan_in_root("--arg", 'gppo_code_overrides=["per_device_batch_size=8"]', "--nodes", "8")
    bad = [c for c in failed(report) if c["check"].startswith("layout")]
    assert code == 1 and [c["check"] for c in bad] == ["layout: gppo_code_overrides at 8 x 8 GPUs"]
    assert bad[0]["detail"].startswith("gppo_code_overrides: per_device_batch_size")


def test_an_sft_batch_that_changes_with_the_node_count_is_named() -> None:
    code, report = plan_in_root("--arg", 'sft_overrides=["global_batch_size=48"]')
    bad = [c["check"] for c in failed(report)]
    assert code == 1 and bad == ["layout: sft_overrides at 4 x 8 GPUs", "layout: sft_overrides at 8 x 8 GPUs"]
    code, report = plan_in_root("--arg", 'sft_overrides=["global_batch_size=0", "gradient_accumulation_steps=4"]',
                                "--nodes", "2")
    (layout,) = [c for c in report["checks"] if c["check"].startswith("layout: sft")]
    assert code == 0 and layout["ok"] and "64 rows per optimizer step here, another at another node count" in \
        layout["detail"]


def test_the_policy_declares_the_context_sft_gave_it() -> None:
    """The SFT model keeps the base's 32,768 positions without max_position_embeddings: RL's engine of prompt +
    32,768 tokens, and evaluation's, no longer fit."""
    code, report = plan_in_root("--arg", 'sft_overrides=["max_position_embeddings=0"]')
    bad = sorted(c["check"] for c in failed(report))
    assert code == 1 and bad == ["context: evaluate_overrides engine", "context: gppo_code_overrides vLLM engine",
                                 "context: gppo_math_overrides vLLM engine"]
    assert all("qwen3-8b-base's max_position_embeddings 32768" in c["detail"] or "32768 <" in c["detail"]
               for c in failed(report))


@pytest.mark.parametrize(("args", "message"), [
    (["--arg", "rl_nodez=2"], "no parameter 'rl_nodez'"),
    (["--cluster", "a100"], "unknown cluster 'a100'"),
    (["--nodes", "0"], "node counts start at 1"),
])
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    done = klear("plan", str(COMPILED), *args, timeout=60)
    assert done.returncode == 2 and message in done.stderr


def test_an_unknown_pipeline_is_named() -> None:
    done = klear("plan", "klear-nothing", timeout=60)
    assert done.returncode == 2 and "klear-nothing" in done.stderr


def plan_in_root(*args: str) -> tuple[int, dict]:
    """The real command on the compiled recipe and the chart's values, named by path (any working folder)."""
    done = klear("plan", str(COMPILED), "--values", str(CHART), "--format", "json", *args, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_more_slices_than_the_gpu_quota_are_named() -> None:
    """40 reference slices of 1 GPU beside 8 base-evaluation slices on a 32-GPU quota: the phases that want more at
    once are named with their uses; the teacher (an endpoint) counts no GPU."""
    code, report = plan_in_root("--arg", "reference_slices=40", "--arg", "eval_slices=8", "--gpu-quota", "32")
    bad = {c["check"]: c["detail"] for c in failed(report)}
    assert code == 1 and set(bad) == {"pods: phase 1 teacher + reference", "pods: phase 2 reference + filter + eval-base"}
    assert "reference slices 40 x 1" in bad["pods: phase 2 reference + filter + eval-base"]
    assert "eval-base slices 8 x 1" in bad["pods: phase 2 reference + filter + eval-base"]
    assert "> quota 32" in bad["pods: phase 1 teacher + reference"]
    # The quota by default: the shape's 8 nodes of 8 GPUs.
    code, report = plan_in_root("--arg", "reference_slices=40")
    assert code == 0, failed(report)


def test_a_pod_larger_than_a_node_and_a_model_without_a_gpu_are_named() -> None:
    code, report = plan_in_root("--arg", 'eval_gpus="16"', "--arg", 'reference_gpus="0"')
    bad = {c["check"]: c["detail"] for c in failed(report)}
    assert code == 1 and "eval_gpus 16 GPUs per pod > 8 GPUs per node" in bad["pods: eval_gpus per pod"]
    assert "would run on CPU" in bad["pods: reference model"] and "qwen3-8b" in bad["pods: reference model"]


def test_a_merge_larger_than_its_scratch_is_named() -> None:
    """1M curated prompts x 8 reference samples of ~13K tokens (~400 GiB of judged rows): every merge uploads each
    part as it closes, a judge merge reads its samples a part at a time, and each fits its volume. A judge merge
    told to write 10M rows per part, at 2M prompts, holds two such parts: more than its volume, and named."""
    code, report = plan_in_root("--prompts", "1000000")
    assert code == 0, failed(report)
    judged = next(c for c in report["checks"] if c["check"] == "disk: reference_overrides judge merge")
    assert judged["ok"] and "8,000,000 rows" in judged["detail"] and "~15 GiB <= scratch volume" in judged["detail"]
    assert "1 samples part of rows_per_part 100,000" in judged["detail"], judged
    assert "at most 2 parts of sft_data_overrides judge.rows_per_shard 100,000" in judged["detail"], judged
    teacher = next(c for c in report["checks"] if c["check"] == "disk: teacher_overrides merge")
    assert teacher["ok"] and "16,000,000 rows" in teacher["detail"] and "at most 2 parts" in teacher["detail"]
    code, report = plan_in_root("--prompts", "2000000", "--arg", 'sft_data_overrides=["judge.rows_per_shard=10000000"]')
    (bad,) = failed(report)
    assert code == 1 and bad["check"] == "disk: reference_overrides judge merge", bad
    assert "judge.rows_per_shard 10,000,000" in bad["detail"] and "> scratch volume 512Gi" in bad["detail"], bad
    # A teacher folder downloaded into each slice pod rather than served: refused, with the way out.
    code, report = plan_in_root("--arg", "teacher_model_uri=s3://models/r1", "--arg", 'teacher_gpus="8"')
    (bad,) = failed(report)
    assert bad["check"] == "disk: teacher_model_uri download" and "teacher server" in bad["detail"]


def test_the_plan_prints_gpu_hours_and_every_value_with_its_origin() -> None:
    code, report = plan_in_root("--arg", 'sft_overrides=["learning_rate=1e-4"]')
    assert code == 0
    sft = report["configurations"]["sft_overrides"]
    assert sft["values"]["learning_rate"] == 1e-4 and sft["origins"]["learning_rate"] == "override learning_rate=1e-4"
    assert "presets/paper.yaml" in sft["origins"]["num_epochs"] and sft["origins"]["report_to"] == "default"
    hours = report["estimates"]["gpu_hours"]
    uses = {(row["stage"], row["use"]) for row in hours["rows"]}
    assert {("sample", "teacher"), ("sft", "sft"), ("gppo", "math rollouts"), ("gppo", "code training")} <= uses
    assert hours["total"]["gpu_hours"] == pytest.approx(sum(row["gpu_hours"] for row in hours["rows"]))
    assert "sft_prompts" in hours["assumptions"]
    text = run_in_root("klear-reasoner").stdout
    assert "learning_rate = 8e-05  (preset 'paper'" in text and "GPU-HOURS" in text and "assumption sft_prompts" in text
