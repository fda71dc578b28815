"""`make gpu-check`: the GPU paths of the pipeline on one GPU, each with its figures; without a GPU the same
paths on vLLM's CPU build (`make install-vllm`), with CPU figures.

    python benchmarks/gpu/gpu_check.py [--model PATH] [--workdir DIR]

1. vLLM sampling through `klear sample` (backend=vllm): output tokens/s and samples/s.
2. SFT through the stage's own launcher (`accelerate launch`, one process; bf16 on a GPU): seconds per step.
3. GPPO with vLLM rollouts colocated with training (bf16 on a GPU): seconds per step; on CPU every weight sync
   is checked against the policy's log-probs (vllm_sync_tolerance).

The model is a small Qwen3-architecture model built here (no model hub): random weights, so the figures
measure the machinery, not learning; on CPU the untied tiny spec `vllm` (head_dim 32, what the CPU attention
takes). Exits 0 with a message where vLLM is not installed at all (the CPU image, the main .venv), non-zero when
a path fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm_sample import build_model, klear_sample, vllm_device  # noqa: E402

RECORDS = 64  # SFT and RL problems: a few steps' worth


def write_problems(directory: Path) -> Path:
    """Column-addition problems of the demo, with worked solutions (SFT) and answers (RL)."""
    from klear.demo import tasks

    path = directory / "arithmetic.jsonl"
    with open(path, "w") as fh:
        for row in tasks.train_items(RECORDS, seed=0, held_out=0):
            fh.write(json.dumps(row) + "\n")
    return path


def timed_stage(stage: Any, step: str, model: str, data: Path, output: Path, preset: str,
                overrides: list[str]) -> tuple[dict[str, Any], float]:
    from klear.training.launch import run_training_stage

    started = time.perf_counter()
    report = run_training_stage(stage, model, [str(data)], str(output), preset, overrides, gpus_per_node=1, nodes=1,
                                step=step)
    return report, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: a small random Qwen3 model built here)")
    parser.add_argument("--workdir", type=Path, help="keep outputs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    device = vllm_device()
    if device is None:
        print("gpu-check: skipped, vllm is not installed (it is in the GPU image; `make install-vllm` makes "
              ".venv-vllm with its CPU build, and `make gpu-check` runs there).")
        return 0
    import torch

    gpu = device == "cuda"
    if gpu and not torch.cuda.is_available():
        print("gpu-check: vLLM is a CUDA build but torch sees no GPU", file=sys.stderr)
        return 1
    # CPU: fewer, shorter samples, fp32 training, the CPU engine settings of the tiny-vllm-cpu preset.
    prompts, output_len, half = (64, 256, ["bf16=true"]) if gpu else (16, 64, ["bf16=false"])
    if not gpu:  # TRL's colocated engine (GPPO) takes no cache size: vLLM's CPU build reads it from here
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory(prefix="klear-gpu-check-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        where = torch.cuda.get_device_name(0) if gpu else f"CPU (vLLM's CPU build, {torch.get_num_threads()} threads)"
        print(f"gpu-check on {where}, torch {torch.__version__}", flush=True)
        model = args.model or build_model(work / "model", "" if gpu else "vllm")
        tokens_per_s, samples_per_s, prompt_len = klear_sample(
            model, prompts=prompts, n=4, output_len=output_len, work=work, preset="paper" if gpu else "tiny-vllm-cpu")
        print(f"1. vLLM sampling (klear sample): {tokens_per_s:,.0f} output tokens/s, {samples_per_s:.1f} samples/s "
              f"({prompts} prompts x 4, ~{prompt_len} prompt tokens, {output_len} new tokens)", flush=True)

        from klear.gppo.stage import STAGE as GPPO
        from klear.sft.stage import STAGE as SFT

        problems = write_problems(work)
        sft, sft_s = timed_stage(SFT, "sft", model, problems, work / "sft", "tiny",
                                 [*half, "num_epochs=1", "per_device_batch_size=8", "attn_implementation=sdpa"])
        steps = sft["training"]["global_step"]
        print(f"2. SFT {'bf16, 1 GPU' if gpu else 'fp32, CPU'}: {steps} optimizer steps in {sft_s:.1f} s including launch "
              f"({sft_s / max(steps, 1):.2f} s/step), final loss {sft['metrics'].get('train_loss', 'n/a')}", flush=True)

        rl, rl_s = timed_stage(GPPO, "gppo-math", str(work / "sft"), problems, work / "gppo", "tiny-math",
                               [*half, "use_vllm=true", "vllm_mode=colocate", "vllm_gpu_memory_utilization=0.3",
                                "max_steps=2", f"max_completion_length={output_len}",
                                *([] if gpu else ["vllm_sync_tolerance=0.05"])])
        steps = rl["training"]["global_step"]
        precision = "bf16, 1 GPU" if gpu else "fp32, CPU"
        print(f"3. GPPO with colocated vLLM rollouts, {precision}: {steps} steps in {rl_s:.1f} s including launch "
              f"({rl_s / max(steps, 1):.2f} s/step)", flush=True)
        print(json.dumps({"device": device, "sample_tokens_per_s": tokens_per_s, "sft_seconds": sft_s,
                          "sft_steps": sft["training"]["global_step"],
                          "gppo_seconds": rl_s, "gppo_steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
