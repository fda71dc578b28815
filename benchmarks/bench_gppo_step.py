"""Where a GPPO step's time goes on CPU with the tiny setup: generation, rewards, update.

    python benchmarks/bench_gppo_step.py [--steps 8] [--tasks math code] [--tracking]

Builds the tiny model and the demo data, fine-tunes the model briefly (so its rollouts have think
blocks, answers and programs for the verifiers to judge), runs the gppo stage with the tiny presets
(real verifiers: math-verify in the reward workers, code in the sandbox) and prints, per task, the
mean seconds of each phase per generation round (one round feeds `updates_per_step` optimizer
steps) and its share.

--tracking: one more math run reporting to MLflow (a real server from .venv-mlflow on loopback when there,
else a local file store) and W&B (offline) with validation every 2 steps; prints the seconds the tracking
callbacks took per optimizer step beside the step time (goal: <= 3 %), and the seconds per validation call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from klear.common.config import load_config
from klear.demo.generate import generate
from klear.demo.tiny_model import build
from klear.gppo.config import GppoConfig
from klear.gppo.stage import run
from klear.sft.config import SftConfig
from klear.sft.stage import run as sft

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import preamble  # noqa: E402

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


class CallbackClock:
    """Wraps the event methods of the callbacks klear.common.tracking installs and sums the seconds spent in them."""

    EVENTS = ("on_train_begin", "on_log", "on_step_end", "on_save", "on_train_end")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(self.EVENTS, 0.0)

    def wrap(self, callback: Any) -> None:
        for event in self.EVENTS:
            method = getattr(callback, event)

            def timed(*args: Any, _method: Any = method, _event: str = event, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return _method(*args, **kwargs)
                finally:
                    self.seconds[_event] += time.perf_counter() - started

            setattr(callback, event, timed)


@contextlib.contextmanager
def tracking_server(root: Path) -> Iterator[str]:
    """A real MLflow server on loopback when .venv-mlflow exists (make install-mlflow), else a local file store."""
    binary = Path(__file__).resolve().parents[1] / ".venv-mlflow" / "bin" / "mlflow"
    if not binary.is_file():
        yield f"file://{root / 'mlruns'}"
        return
    port = 5917
    process = subprocess.Popen([str(binary), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                                "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(240):
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                break
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)


def tracking_overhead(root: Path, steps: int) -> None:
    """Seconds in the tracking callbacks per optimizer step vs the step time; seconds per validation call."""
    from klear.common import tracking
    from klear.demo.tasks import benchmark_items

    clock = CallbackClock()
    install = tracking.install

    def timed_install(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        before = len(trainer.callback_handler.callbacks)
        result = install(trainer, *args, **kwargs)
        for callback in trainer.callback_handler.callbacks[before:]:
            clock.wrap(callback)
        return result

    bench = root / "validation.jsonl"
    bench.write_text("".join(json.dumps(item) + "\n" for item in benchmark_items(8)))
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(root), WANDB_SILENT="true")
    tracking.install = timed_install
    try:
        with tracking_server(root) as uri:
            config = load_config(GppoConfig, "tiny-math", [f"max_steps={steps}", "save_steps=2", "report_to=tensorboard,mlflow,wandb",
                                                           f"tracking_uri={uri}", f"val_data=[{bench}]", "val_every=2",
                                                           "val_config=demo"])
            report = run(str(root / "sft"), [str(root / "data" / "math.jsonl")], str(root / "out-tracking"), config,
                         work_dir=str(root / "work-tracking"))
    finally:
        tracking.install = install
    validation = [row["val/seconds"] for row in report["validation"]]
    # The step's own time: the run's wall time less validation, which the run timed itself.
    steps = report["training"]["global_step"]
    step = (report["metrics"]["train_runtime"] - sum(validation)) / steps
    seconds = clock.seconds
    # Every step: the log rows to the trackers, the progress line. Every save: ids and the curves page. Once per
    # attempt: opening and closing the tracker runs (W&B's service, MLflow's params).
    per_step = (seconds["on_log"] + seconds["on_step_end"]) / steps
    per_save = seconds["on_save"] / max(steps // 2, 1)
    once = seconds["on_train_begin"] + seconds["on_train_end"]
    print(f"\ntracking (TensorBoard + MLflow at {uri.split(':')[0]} + W&B offline), {steps} steps:")
    print(f"  step time {step:.3f} s; tracking per step {per_step * 1000:.1f} ms = {per_step / step:.2%} (goal <= 3 %)")
    print(f"  per checkpoint (run ids, curves page) {per_save * 1000:.0f} ms = {per_save / (step * 50):.2%} of the steps "
          f"between checkpoints at save_steps 50 (math preset); once per attempt (open/close runs) {once:.1f} s")
    print(f"  validation: {len(validation)} calls (8 problems x k 4, 64 tokens), {sum(validation) / len(validation):.2f} s per call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per task")
    parser.add_argument("--tasks", nargs="+", default=["math", "code"], choices=["math", "code"])
    parser.add_argument("--tracking", action="store_true", help="also measure tracking and validation overhead")
    parser.add_argument("--tracking-only", action="store_true", help="only the tracking and validation measurement")
    args = parser.parse_args()
    print(preamble("torch", "transformers", "trl", "math-verify"), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(str(root / "model"))
        generate(str(root / "data"), math_count=120, code_count=16, seed=0)
        data = [str(root / "data" / f"{task}.jsonl") for task in ("math", "code")]
        sft(str(root / "model"), data, str(root / "sft"), load_config(SftConfig, "tiny", ["num_epochs=2"]),
            work_dir=str(root / "work-sft"))
        print(f"{'task':6} {'generation s':>13} {'rewards s':>10} {'update s':>9}   shares (gen / rewards / update)   wall s")
        for task in [] if args.tracking_only else args.tasks:
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
        if args.tracking or args.tracking_only:
            tracking_overhead(root, args.steps)


if __name__ == "__main__":
    main()
