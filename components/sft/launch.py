"""The `accelerate launch` command line of one node, shared by the KFP component (single node, in its own
pod) and the Kubeflow Trainer job template (N nodes, one launcher per node)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

LAUNCH_CONFIGS = Path(__file__).resolve().parent / "launch_configs"


def accelerate_command(
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
    from klear.common.config import load_config
    from klear.sft.config import SftConfig

    config = load_config(SftConfig, preset, overrides)
    launch_config = "zero3.yaml" if config.deepspeed else "ddp.yaml"
    argv = [python, "-m", "accelerate.commands.launch", "--config_file", str(LAUNCH_CONFIGS / launch_config),
            "--num_machines", str(nodes), "--num_processes", str(nodes * processes_per_node),
            "--machine_rank", machine_rank, "--main_process_ip", main_address, "--main_process_port", main_port,
            "-m", "klear.cli", "sft", "--model", model, "--data", *data, "--output", output, "--config", preset]
    for override in overrides:
        argv += ["--set", override]
    return argv + (["--work-dir", work_dir] if work_dir else [])


def shell_line(argv: list[str], variables: tuple[str, ...] = ()) -> str:
    """A shell line for a container command; the named `$VARIABLES` are left for the shell to expand."""
    return " ".join(arg if arg in variables else shlex.quote(arg) for arg in argv)
