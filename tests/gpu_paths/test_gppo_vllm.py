"""GPPO's rollouts through a colocated vLLM engine on vLLM's CPU build, with the weight sync checked: vLLM's
log-probabilities of a fixed completion must equal the policy's after every sync, and a sync that leaves vLLM on
old weights must be seen. Tied and untied output layers alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.gpu_paths.conftest import VLLM_ENV, klear

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]

DIGITS = "reward.scorer=tests.gppo.toy_scorers:digit_fraction"
TOLERANCE = 0.05  # measured: 0.003-0.015 after a sync (fp32 CPU kernels), 1-5 on the weights before it


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tests' tiny model at head_dim 32 (hidden 128): tied embeddings, as Qwen3's small models."""
    out = tmp_path_factory.mktemp("tied") / "model"
    klear("tiny-model", "--output", str(out), "--hidden", "128")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    return str(out)


def _probe(model: str, only: str = "") -> dict[str, float]:
    env = {**os.environ, **VLLM_ENV, "MASTER_PORT": str(free_port()), "PROBE_ONLY": only}
    done = subprocess.run([sys.executable, "-m", "tests.gpu_paths.sync_probe", model], capture_output=True, text=True,
                          env=env, timeout=300)
    line = next((x for x in done.stdout.splitlines() if x.startswith("GAPS ")), None)
    assert line, f"sync probe exited {done.returncode}:\n{done.stderr[-4000:]}"
    return dict(json.loads(line[5:]))


@pytest.mark.parametrize("which", ["untied", "tied"])
def test_a_sync_is_checked_and_a_stale_engine_is_seen(which: str, vllm_model: str, tied_model: str) -> None:
    # Tied: only the embeddings change, so the logits move only if vLLM's output layer follows them.
    gaps = _probe(vllm_model, "") if which == "untied" else _probe(tied_model, "embed_tokens")
    assert gaps["loaded"] < TOLERANCE, gaps
    assert gaps["stale"] > 10 * TOLERANCE, gaps  # the check sees an engine on the old weights
    assert gaps["synced"] < TOLERANCE, gaps


def test_gppo_trains_on_vllm_rollouts_with_every_sync_checked(vllm_model: str, demo_files: list[str],
                                                              tmp_path: Path) -> None:
    output = tmp_path / "gppo"
    done = klear("gppo", "--model", vllm_model, "--data", demo_files[0], "--output", str(output), "--config",
                 "tiny-math", "--work-dir", str(tmp_path / "work"), "--set", "use_vllm=true", "--set", "max_steps=4",
                 "--set", f"vllm_sync_tolerance={TOLERANCE}", "--set", DIGITS)
    gaps = [float(line.rsplit(" ", 1)[1]) for line in done.stderr.splitlines()
            if "log-prob gap after the weight sync" in line]
    assert len(gaps) == 2 and max(gaps) < TOLERANCE, done.stderr[-3000:]  # one generation round per 2 steps
    report = json.loads((output / "report.json").read_text())
    assert report["training"]["global_step"] == 4
    # TRL logs its vLLM-vs-trainer importance weights only for vLLM rollouts.
    assert "sampling/importance_sampling_ratio/mean" in done.stdout + done.stderr
