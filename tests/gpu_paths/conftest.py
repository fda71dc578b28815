"""The GPU code paths on vLLM's CPU build: collected only where vLLM is installed (`.venv-vllm`, made by
`make install-vllm`; `make test` runs them from there with `-m vllm_cpu`). The main environment has no vLLM and
does not collect them at all: a skip there would read as if they had been tried."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]

# vLLM's CPU build: a 1 GiB KV cache (the tiny model needs kilobytes), no hub, and the engine core in the same
# process as the caller where vLLM allows it (one core less to share on a 2-core runner).
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The untied tiny model with head_dim 32 (the CPU attention backend refuses 16): klear.demo.tiny_model's
    `vllm` spec, built by the real command."""
    out = tmp_path_factory.mktemp("vllm-model") / "model"
    klear("tiny-model", "--output", str(out), "--spec", "vllm")
    return str(out)


def klear(*args: str, env: dict[str, str] | None = None, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """The real `klear` command in a process of its own (vLLM spawns its engine: the caller needs a clean
    `__main__`, and its memory goes when the process ends)."""
    done = subprocess.run([sys.executable, "-m", "klear.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **VLLM_ENV, **(env or {})}, timeout=timeout)
    if done.returncode:
        raise AssertionError(f"klear {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def write_prompts(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)
