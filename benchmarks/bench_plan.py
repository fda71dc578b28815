"""How long `klear plan klear-reasoner` takes (the goal: at most 5 s on 2 cores), beside importing its modules.

    python benchmarks/bench_plan.py [--repeat 5] [--cluster h100-80gb-x8]

Each repeat runs the real command in a fresh process from the checkout's root (pipelines/compiled/klear-reasoner.yaml
and the chart's values, as a person runs it) and the baseline: a fresh process that only imports the plan's
modules (klear.plan.command: the interpreter, PyYAML, pydantic and the stage configs), the two taking turns at going
first. Prints the machine (CPU model, cores, flags, load) and the package versions, then min / median / max of both,
of their ratio per repeat and of the plan's own seconds above the baseline. The figures depend on the machine: rerun
it on the one you care about.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, interleaved, preamble, spread  # noqa: E402

GOAL_S = 5.0


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):  # 1: a failed check, still a whole plan
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_repeat_argument(parser, default=5)
    parser.add_argument("--cluster", default="h100-80gb-x8")
    args = parser.parse_args()
    print(preamble("pydantic", "PyYAML"), flush=True)
    klear = [sys.executable, "-m", "klear.cli"]
    runs = list(interleaved(args.repeat, lambda: timed([*klear, "plan", "klear-reasoner", "--cluster", args.cluster]),
                            lambda: timed([sys.executable, "-c", "import klear.plan.command"])))
    plan = [p for p, _ in runs]
    print(spread(f"klear plan klear-reasoner --cluster {args.cluster}, s", plan))
    print(spread("baseline import klear.plan.command, s", [b for _, b in runs]))
    print(spread("plan / baseline", [p / b for p, b in runs], "x"))
    print(spread("the plan's own work (plan - baseline), s", [p - b for p, b in runs]))
    print(f"goal <= {GOAL_S:.0f} s: {'met' if max(plan) <= GOAL_S else 'NOT met'} (slowest run {max(plan):.2f} s)")


if __name__ == "__main__":
    main()
