"""A published RL model served as the InferenceService serves it, evaluated through its endpoint: the pod's two
containers (klear.serve.manifest: the copy from S3, then vLLM's OpenAI server) run here on vLLM's CPU build, and
`klear evaluate --endpoint` scores the model as `klear evaluate --model` does in process.

The model: the fastest real published RL model, `klear gppo` for 2 steps on the tests' tiny vLLM model (make demo's RL
model takes minutes), published to a real S3 server with what a training run leaves beside the weights (its
checkpoint, model card and logs). A random-weight model solves nothing: its score is 0 either way, so the comparison
covers every per-problem figure the evaluation reports (pass rate, truncated share, response length), each within
twice the standard error of the paired per-problem differences."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from klear.common.chat import THINK_CLOSE, THINK_OPEN
from klear.demo.tasks import benchmark_items
from klear.sample.stage import iter_rows
from klear.serve.manifest import MODEL_DIR, ServeSpec, inference_service
from tests.conftest import free_port
from tests.gpu_paths.conftest import VLLM_ENV, klear, write_prompts
from tests.processes import served_on_loopback

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]

SERVED = "klear-rl"
DIGITS = "reward.scorer=tests.gppo.toy_scorers:digit_fraction"  # a reward a random model climbs: the weights move
PROBLEMS, K = 20, 4  # held-out demo additions, each sampled k times (the demo preset: avg@4, 64 tokens)


def pod_commands(spec: ServeSpec, model_dir: Path) -> tuple[list[str], list[str], dict[str, str]]:
    """The init container's and the server container's commands as the InferenceService runs them, for this machine:
    this interpreter for `python`, a folder for the /model volume, loopback for the pod's 0.0.0.0."""
    predictor = inference_service(spec)["spec"]["predictor"]
    (fetch,), (server,) = predictor["initContainers"], predictor["containers"]
    assert fetch["command"][-1] == MODEL_DIR and f"--model={MODEL_DIR}" in server["args"]
    replace = {f"--model={MODEL_DIR}": f"--model={model_dir}", "--host=0.0.0.0": "--host=127.0.0.1"}
    return ([sys.executable, *fetch["command"][1:-1], str(model_dir)],
            [sys.executable, *server["command"][1:], *[replace.get(a, a) for a in server["args"]]],
            {e["name"]: e["value"] for e in server.get("env", [])})


def per_problem(output: Path) -> dict[str, dict[str, Any]]:
    rows = pq.read_table(output / "problems.parquet").to_pylist()
    return {row["id"]: row for row in rows}


def generated(row: dict[str, Any]) -> str:
    """What the model wrote, whichever side of the reasoning parser it landed on: the reasoning and the answer without
    think tags, whitespace or a last partial UTF-8 character (the server holds back an unfinished byte sequence)."""
    text = (row["reasoning"] or "") + row["final"]
    return "".join(text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "").split()).rstrip("\ufffd")


def agreeing_units(served_samples: Path, local_samples: Path) -> tuple[int, int]:
    """Units (prompt, sample index) whose served text is what the in-process sampler wrote, of all units. vLLM's
    deepseek_r1 parser keeps only what follows a <think> the model writes mid-response: a suffix then agrees."""
    served = {(r["id"], r["sample"]): generated(r) for r in iter_rows(str(served_samples))}
    local = {(r["id"], r["sample"]): generated(r) for r in iter_rows(str(local_samples))}
    assert sorted(served) == sorted(local)
    return sum(bool(text) and local[unit].endswith(text) for unit, text in served.items()), len(local)


def paired(served: dict[str, dict[str, Any]], local: dict[str, dict[str, Any]], column: str) -> tuple[float, float]:
    """Mean difference served - local of one per-problem figure, and its standard error (sample sd / sqrt(n))."""
    diffs = [float(served[pid][column]) - float(local[pid][column]) for pid in sorted(local)]
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def test_served_model_evaluates_as_in_process(vllm_model: str, demo_files: list[str], s3_bucket: str,
                                              tmp_path: Path) -> None:
    uri = f"{s3_bucket}/runs/run-1/gppo-code"
    klear("gppo", "--model", vllm_model, "--data", demo_files[0], "--output", uri, "--config", "tiny-math",
          "--work-dir", str(tmp_path / "work"), "--set", "max_steps=2", "--set", DIGITS)
    port = free_port()
    # float32 as the in-process (hf) backend computes on CPU: vLLM's CPU build would pick bfloat16, whose rounding
    # flips the near-ties of a random model's flat logits (test_vllm_sample.py).
    spec = ServeSpec(name=SERVED, model_uri=uri, server_image="klear-gpu", fetch_image="klear-cpu",
                     served_model_name=SERVED, port=port, extra_args=("--dtype=float32",))
    fetch, server, server_env = pod_commands(spec, tmp_path / "model")
    copied = subprocess.run(fetch, capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert copied.returncode == 0, copied.stderr
    assert not (tmp_path / "model" / "checkpoints").exists() and not (tmp_path / "model" / "README.md").exists()
    # The server container gets no S3 credentials: only its own env.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | VLLM_ENV | server_env
    benchmark = write_prompts(tmp_path / "demo_benchmark.jsonl", benchmark_items(PROBLEMS, seed=0))
    common = ["--benchmark", benchmark, "--config", "demo"]
    with served_on_loopback(server, env, tmp_path / "server.log", port, "the served model", 240) as url:
        klear("evaluate", "--endpoint", url, "--served-model", SERVED, "--output", str(tmp_path / "served"), *common)
    klear("evaluate", "--model", uri, "--output", str(tmp_path / "local"), "--set", "sampling.backend=hf", *common)

    served, local = per_problem(tmp_path / "served"), per_problem(tmp_path / "local")
    assert sorted(served) == sorted(local) and len(local) == PROBLEMS
    assert {row["k"] for row in [*served.values(), *local.values()]} == {K}
    for output, engine in (("served", "endpoint"), ("local", "model")):
        (source,) = json.loads((tmp_path / output / "report.json").read_text())["settings"]["samples"]["model"]
        assert source["identity"]["engine"] == engine and source["check"] == "matches the protocol", source
    # The floor: the smallest difference one sample makes in the mean (its verdict, its truncation, one token).
    for column, one_sample in (("pass_rate", 1 / K), ("truncated", 1.0), ("mean_completion_tokens", 1 / K)):
        difference, stderr = paired(served, local, column)
        assert abs(difference) <= max(2 * stderr, one_sample / PROBLEMS), (column, difference, stderr)
    # Teeth where the scores are 0: the server and the hf backend draw a unit's tokens alike (each the exponential
    # race, probabilities over Exp(1) noise from the unit's seeded generator: vLLM's sampler and torch.multinomial's
    # one-sample path), so the same weights, template and settings write the same text. Served in its place, the
    # model before RL agreed on 0 of the 80 units; float rounding may flip a near-tie now and then, hence 3/4.
    agree, units = agreeing_units(tmp_path / "served.samples" / f"math-k{K}", tmp_path / "local.samples" / f"math-k{K}")
    assert units == PROBLEMS * K and agree >= 0.75 * units, (agree, units)
