"""`make gpu-check`: the GPU paths of the pipeline on one GPU, each with its figures.

    python benchmarks/gpu/gpu_check.py [--model PATH] [--workdir DIR]

1. vLLM sampling through `klear sample` (backend=vllm): output tokens/s and samples/s.
2. SFT in bf16 through the stage's own launcher (`accelerate launch`, one process): seconds per optimizer step.
3. GPPO with vLLM rollouts colocated with training, bf16: seconds per step, rollout tokens.

The model is a small Qwen3-architecture model built here (no model hub): random weights, so the figures
measure the machinery, not learning. Exits 0 with a message where there is no CUDA GPU or no vLLM (the
CPU image), non-zero when a GPU path fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm_sample import build_model, gpu_ready, klear_sample  # noqa: E402

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
    reason = gpu_ready()
    if reason:
        print(f"gpu-check: skipped, {reason}.")
        return 0
    import torch

    with tempfile.TemporaryDirectory(prefix="klear-gpu-check-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"gpu-check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
        model = args.model or build_model(work / "model")
        tokens_per_s, samples_per_s, prompt_len = klear_sample(model, prompts=64, n=4, output_len=256, work=work)
        print(f"1. vLLM sampling (klear sample): {tokens_per_s:,.0f} output tokens/s, {samples_per_s:.1f} samples/s "
              f"(64 prompts x 4, ~{prompt_len} prompt tokens, 256 new tokens)", flush=True)

        from klear.gppo.stage import STAGE as GPPO
        from klear.sft.stage import STAGE as SFT

        problems = write_problems(work)
        sft, sft_s = timed_stage(SFT, "sft", model, problems, work / "sft", "tiny",
                                 ["bf16=true", "num_epochs=1", "per_device_batch_size=8", "attn_implementation=sdpa"])
        steps = sft["training"]["global_step"]
        print(f"2. SFT bf16, 1 GPU: {steps} optimizer steps in {sft_s:.1f} s including launch "
              f"({sft_s / max(steps, 1):.2f} s/step), final loss {sft['metrics'].get('train_loss', 'n/a')}", flush=True)

        rl, rl_s = timed_stage(GPPO, "gppo-math", str(work / "sft"), problems, work / "gppo", "tiny-math",
                               ["bf16=true", "use_vllm=true", "vllm_mode=colocate", "vllm_gpu_memory_utilization=0.3",
                                "max_steps=2", "max_completion_length=256"])
        steps = rl["training"]["global_step"]
        print(f"3. GPPO bf16 with colocated vLLM rollouts, 1 GPU: {steps} steps in {rl_s:.1f} s including launch "
              f"({rl_s / max(steps, 1):.2f} s/step)", flush=True)
        print(json.dumps({"sample_tokens_per_s": tokens_per_s, "sft_seconds": sft_s, "sft_steps": sft["training"]["global_step"],
                          "gppo_seconds": rl_s, "gppo_steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
