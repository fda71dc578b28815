"""How long `klear plan klear-reasoner` takes (the goal: at most 5 s on 2 cores), beside importing its modules.

    python benchmarks/bench_plan.py [--repeats 5] [--cluster h100-80gb-x8]

Each repeat runs the real command in a fresh process from the checkout's root (pipelines/compiled/klear-reasoner.yaml
and the chart's values, as a person runs it), then the baseline: a fresh process that only imports the plan's
modules (klear.plan.command: the interpreter, PyYAML, pydantic and the stage configs). Prints min / median / max
of both, the plan's share above the baseline, and the machine (CPU model, cores). The figures depend on the
machine: rerun it on the one you care about.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 5.0


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores visible, Python {platform.python_version()}"


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):  # 1: a failed check, still a whole plan
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def spread(values: list[float]) -> str:
    return f"min {min(values):.2f} / median {statistics.median(values):.2f} / max {max(values):.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cluster", default="h100-80gb-x8")
    args = parser.parse_args()
    klear = [sys.executable, "-m", "klear.cli"]
    plan, baseline = [], []
    for _ in range(args.repeats):
        plan.append(timed([*klear, "plan", "klear-reasoner", "--cluster", args.cluster]))
        baseline.append(timed([sys.executable, "-c", "import klear.plan.command"]))
    median = statistics.median(plan)
    print(f"machine: {machine()}")
    print(f"klear plan klear-reasoner --cluster {args.cluster}: {spread(plan)} ({args.repeats} runs)")
    print(f"baseline import klear.plan.command:      {spread(baseline)}")
    print(f"plan / baseline (medians): {median / statistics.median(baseline):.2f}x; "
          f"the plan's own work: {median - statistics.median(baseline):.2f} s")
    print(f"goal <= {GOAL_S:.0f} s: {'met' if max(plan) <= GOAL_S else 'NOT met'} (slowest run {max(plan):.2f} s)")


if __name__ == "__main__":
    main()
