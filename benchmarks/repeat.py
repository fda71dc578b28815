"""What every benchmark prints around its figures: the machine, the package versions, and a figure as the
min / median / max of repeated runs (one run on a shared machine is an anecdote, not a figure).

    parser = argparse.ArgumentParser(); add_repeat_argument(parser)
    print(preamble("torch", "vllm"))  # the machine line, then the versions line
    for ours, theirs in interleaved(args.repeat, run_ours, run_theirs): ratios.append(ours / theirs)
    print(spread("ratio", ratios, "x"))

More than two sides (kinds of a loss, modes of a judge): `in_turns(args.repeat, [a, b, c])`, each round starting
with the next side.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")

# The CPU flags that change what the CPU paths measure: vLLM's CPU kernels and torch's matmuls pick their code by
# these (AMX for bf16/int8 matmuls, AVX-512 for the rest).
FLAGS_THAT_MATTER = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def add_repeat_argument(parser: argparse.ArgumentParser, default: int = 3) -> None:
    parser.add_argument("--repeat", type=int, default=default,
                        help=f"how many times to run the comparison, the two sides taking turns (default {default})")


def cpu_model(cpuinfo: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                platform.processor() or platform.machine())


def cpu_flags(cpuinfo: str) -> dict[str, bool]:
    present = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    return {flag: flag in present for flag in FLAGS_THAT_MATTER}


def machine() -> str:
    """One line naming the machine: CPU model, the cores this process may use, the flags that matter, the load."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = " ".join(f"{name}={'yes' if on else 'no'}" for name, on in cpu_flags(info).items())
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"machine: {cpu_model(info)}, {cores} cores usable, {flags}; load {load}; Python {platform.python_version()}"


def versions(*packages: str) -> str:
    found = []
    for name in packages:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return "versions: " + ", ".join(found)


def preamble(*packages: str) -> str:
    """What a benchmark prints before its figures: the machine line, then the versions of `packages` (none: the
    machine line alone, which names Python)."""
    return f"{machine()}\n{versions(*packages)}" if packages else machine()


def interleaved(times: int, first: Callable[[], T], second: Callable[[], U]) -> Iterator[tuple[T, U]]:
    """Run the two sides `times` times, taking turns and swapping which goes first each round, so both see the
    same drift in the machine's load and neither always runs on a warm (or cold) cache."""
    if times < 1:
        raise ValueError(f"--repeat must be at least 1, not {times}")
    for round_ in range(times):
        if round_ % 2 == 0:
            a = first()
            b = second()
        else:
            b = second()
            a = first()
        yield a, b


def in_turns(times: int, sides: Sequence[Callable[[], T]]) -> Iterator[list[T]]:
    """Run every side once per round, `times` rounds, each round starting one side further on (a, b, c; then b, c,
    a; ...), so no side always runs first or last. Yields each round's results in the order of `sides`."""
    if times < 1:
        raise ValueError(f"--repeat must be at least 1, not {times}")
    if not sides:
        raise ValueError("no sides to run")
    for round_ in range(times):
        done: dict[int, T] = {}
        for step in range(len(sides)):
            index = (round_ + step) % len(sides)
            done[index] = sides[index]()
        yield [done[index] for index in range(len(sides))]


def timed(call: Callable[[], T]) -> tuple[float, T]:
    """(wall seconds, result) of one call."""
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def spread(label: str, values: Sequence[float], unit: str = "", digits: int = 2) -> str:
    """`label: median M (min A, max B; N runs)`: the median is the figure, the range says how much to trust it."""
    if not values:
        raise ValueError(f"{label}: no runs to summarize")
    med, low, high = statistics.median(values), min(values), max(values)
    return (f"{label}: median {med:,.{digits}f}{unit} (min {low:,.{digits}f}{unit}, max {high:,.{digits}f}{unit}; "
            f"{len(values)} runs: {'; '.join(f'{v:,.{digits}f}' for v in values)})")
