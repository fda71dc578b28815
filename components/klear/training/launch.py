"""The `accelerate launch` command line of one node for a training stage, shared by the KFP components (single
node, in their own pod) and the Kubeflow Trainer job template (N nodes, one launcher per node).

Every function takes the stage's `TrainingStage` spec (klear.training.stage), which the stage module builds
and the caller passes in: this module never imports a stage.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from klear.training.stage import TrainingStage

LAUNCH_CONFIGS = Path(__file__).resolve().parent / "launch_configs"


def accelerate_command(
    stage: TrainingStage,
    model: str,
    data: list[str],
    output: str,
    preset: str,
    overrides: list[str],
    processes_per_node: int,
    nodes: int = 1,
    machine_rank: str = "0",
    main_address: str = "127.0.0.1",
    main_port: str = "29500",
    python: str = sys.executable,
    work_dir: str | None = None,
) -> list[str]:
    """argv for one node. With DeepSpeed in the config (the paper preset), the ZeRO-3 launch config is used;
    otherwise plain DDP. Rank, address and port may be shell variables (`$PET_NODE_RANK`) in a job template."""
    config = stage.config(preset, overrides)
    launch_config = "zero3.yaml" if config.deepspeed else "ddp.yaml"
    argv = [python, "-m", "accelerate.commands.launch", "--config_file", str(LAUNCH_CONFIGS / launch_config),
            "--num_machines", str(nodes), "--num_processes", str(nodes * processes_per_node),
            "--machine_rank", machine_rank, "--main_process_ip", main_address, "--main_process_port", main_port,
            "-m", "klear.cli", stage.name, "--model", model, "--data", *data, "--output", output, "--config", preset]
    for override in overrides:
        argv += ["--set", override]
    return argv + (["--work-dir", work_dir] if work_dir else [])


def shell_line(argv: list[str], variables: tuple[str, ...] = ()) -> str:
    """A shell line for a container command; the named `$VARIABLES` are left for the shell to expand."""
    return " ".join(arg if arg in variables else shlex.quote(arg) for arg in argv)


def gpu_count(gpus_per_node: int | str) -> int:
    """GPUs per node as a number. The pipelines pass a string: the same pipeline parameter sets the pod's
    accelerator limit, which the KFP driver only resolves from string parameters."""
    try:
        count = int(str(gpus_per_node).strip())
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(f"gpus_per_node must be a whole number >= 0, got {gpus_per_node!r}")
    return count


def run_training_stage(stage: TrainingStage, model: str, data: list[str], output: str, preset: str,
                       overrides: list[str], gpus_per_node: int, nodes: int, step: str) -> dict[str, Any]:
    """Run a training stage from its KFP component and return its report.

    0 GPUs (CPU, kfp.local, tests): in this process. One node with GPUs: one `accelerate launch` process per
    GPU in this pod. More nodes: a Kubeflow Trainer job runs the same command on every node; this pod creates
    it (or, retried, re-attaches to the one its earlier attempt created), streams its logs and fails if it fails.
    `step` names the job with the run id (sft, gppo-math, gppo-code)."""
    import json
    import subprocess

    from klear.common import storage

    if nodes > 1:
        from klear.training.trainjob import run_trainjob

        run_trainjob(stage, step, model, data, output, preset, overrides, nodes, gpus_per_node)
    elif gpus_per_node > 0:
        subprocess.run(accelerate_command(stage, model, data, output, preset, overrides, gpus_per_node), check=True)
    else:
        return stage.run(model, data, output, stage.config(preset, overrides))
    return json.loads(storage.read_bytes(storage.Uri.parse(output).join("report.json")))


def run_training_component(stage: TrainingStage, step: str, model_in: Any, data: Any, preset: str,
                           overrides: list[str], gpus_per_node: int | str, nodes: int, run_root: str,
                           model_out: Any, summary: Any, metrics: Any) -> None:
    """The body of a training stage's KFP component: train into a fixed location under run_root (a retried pod
    resumes from its checkpoints), then fill the KFP outputs: the model, the Markdown summary, the metrics."""
    from klear.common import kfp_io

    target = kfp_io.output_location(run_root, step)
    report = run_training_stage(stage, kfp_io.input_location(model_in), [kfp_io.input_location(data)], target, preset,
                                overrides, gpu_count(gpus_per_node), nodes, step)
    kfp_io.record_output(model_out, target, {"global_step": report["training"]["global_step"],
                                             "kept": report["data"]["kept"]})
    kfp_io.publish_report(summary, stage.render_markdown(report), metrics, stage.metric_items(report))
