"""Where a GPPO step's time goes on CPU with the tiny setup: generation, rewards, update.

    python benchmarks/bench_gppo_step.py [--steps 8] [--tasks math code]

Builds the tiny model and the demo data, fine-tunes the model briefly (so its rollouts have think
blocks, answers and programs for the verifiers to judge), runs the gppo stage with the tiny presets
(real verifiers: math-verify in the reward workers, code in the sandbox) and prints, per task, the
mean seconds of each phase per generation round (one round feeds `updates_per_step` optimizer
steps) and its share.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from klear.common.config import load_config
from klear.demo.generate import generate
from klear.demo.tiny_model import build
from klear.gppo.config import GppoConfig
from klear.gppo.stage import run
from klear.sft.config import SftConfig
from klear.sft.stage import run as sft

PHASES = ("time/generation_s", "time/rewards_s", "time/update_s")


def breakdown(history: list[dict[str, float]], updates_per_round: int) -> dict[str, float]:
    """Mean seconds per generation round of each phase (updates are logged per optimizer step)."""
    rounds = [r for r in history if "time/generation_s" in r]
    updates = [r["time/update_s"] for r in history if "time/update_s" in r]
    return {
        "generation": sum(r["time/generation_s"] for r in rounds) / len(rounds),
        "rewards": sum(r["time/rewards_s"] for r in rounds) / len(rounds),
        "update": sum(updates) / len(updates) * updates_per_round,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per task")
    parser.add_argument("--tasks", nargs="+", default=["math", "code"], choices=["math", "code"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(str(root / "model"))
        generate(str(root / "data"), math_count=120, code_count=16, seed=0)
        data = [str(root / "data" / f"{task}.jsonl") for task in ("math", "code")]
        sft(str(root / "model"), data, str(root / "sft"), load_config(SftConfig, "tiny", ["num_epochs=2"]),
            work_dir=str(root / "work-sft"))
        print(f"{'task':6} {'generation s':>13} {'rewards s':>10} {'update s':>9}   shares (gen / rewards / update)   wall s")
        for task in args.tasks:
            config = load_config(GppoConfig, f"tiny-{task}", [f"max_steps={args.steps}", "save_steps=1000"])
            started = time.perf_counter()
            report = run(str(root / "sft"), [str(root / "data" / f"{task}.jsonl")], str(root / f"out-{task}"), config,
                         work_dir=str(root / f"work-{task}"))
            wall = time.perf_counter() - started
            parts = breakdown(report["history"], config.updates_per_step)
            total = sum(parts.values())
            shares = " / ".join(f"{parts[k] / total:.0%}" for k in ("generation", "rewards", "update"))
            print(f"{task:6} {parts['generation']:13.3f} {parts['rewards']:10.3f} {parts['update']:9.3f}   "
                  f"{shares:32}  {wall:6.1f}")
        print("per generation round: prompts_per_step x num_generations rollouts, updates_per_step optimizer steps")


if __name__ == "__main__":
    main()
