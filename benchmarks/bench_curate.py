"""Speed of the curate stage against a straightforward decontamination script, repeated.

    python benchmarks/bench_curate.py [--prompts 100000] [--baseline-prompts 100000] [--repeat 3] [--data FILE]

Synthetic prompts of realistic length (60-400 words) drawn from the benchmarks' own vocabulary
mixed with other words (so many n-gram windows survive the vocabulary filter), with 0.5% of
them embedding a real AIME/HMMT problem and 2% exact duplicates. Prints prompts/s of
`klear curate` (paper preset: all cores, reading JSONL and publishing Parquet) and of the
baseline (per prompt: json.loads, the same normalization, a Python set of 9-gram tuples
intersected with the benchmark set, dedup on the normalized text), their ratio, peak memory (PSS)
of the curate process tree, and the time 1.5 million prompts would take at the measured rate.

The prompts are generated once per run and every repetition reads the same file. The two sides take
turns (`--repeat` rounds, benchmarks/repeat.py), and each figure is printed as median (min, max). The
baseline reads the first `--baseline-prompts` prompts (default: all of them, up to 100,000, since one
pass of the baseline over 1.5M prompts takes minutes): its figure is a rate, prompts/s, either way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/repeat.py, when run as a script

from repeat import add_repeat_argument, interleaved, machine, spread, versions  # noqa: E402

from klear import testsets as benchmarks
from klear.common.records import read_records
from klear.curate.matching import _NOT_WORD, baseline_contaminated, words


def make_prompts(path: Path, count: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    problems = [r["problem"] for name in benchmarks.NAMES for r in read_records(str(benchmarks.path(name)))]
    bench_vocab = sorted({w for p in problems for w in words(p)})
    other = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10))) for _ in range(20000)]
    recent: list[str] = []
    with open(path, "w") as fh:
        for i in range(count):
            roll = rng.random()
            if roll < 0.02 and recent:
                text = rng.choice(recent)
            else:
                n = rng.randint(60, 400)
                ws = [rng.choice(bench_vocab) if rng.random() < 0.5 else rng.choice(other) for _ in range(n)]
                for j in range(0, n, rng.randint(6, 14)):
                    ws[j] = ws[j].capitalize() + rng.choice((",", ".", " $x$", ":", "?"))
                text = " ".join(ws)
                if roll > 0.995:
                    text = f"{text} {rng.choice(problems)}"
                recent = (recent + [text])[-100:]
            fh.write(json.dumps({"id": f"p{i}", "problem": text}) + "\n")


def baseline(path: Path, limit: int, n: int = 9) -> tuple[float, int, float]:
    """Wall seconds, prompts found contaminated, CPU seconds (the index of benchmark n-grams not counted)."""
    problems = [r["problem"] for name in benchmarks.NAMES for r in read_records(str(benchmarks.path(name)))]
    bench_ngrams: set[tuple[str, ...]] = set()
    for p in problems:
        ws = words(p)
        bench_ngrams.update(zip(*(ws[i:] for i in range(n))))
    started, cpu_started = time.perf_counter(), time.process_time()
    seen: set[str] = set()
    contaminated = 0
    with open(path) as fh:
        for count, line in enumerate(fh):
            if count >= limit:
                break
            prompt = json.loads(line)["problem"]
            if baseline_contaminated(prompt, bench_ngrams, n):
                contaminated += 1
                continue
            seen.add(" ".join(_NOT_WORD.sub(" ", prompt.lower()).split()))
    return time.perf_counter() - started, contaminated, time.process_time() - cpu_started


def _tree_pss(pid: int) -> int:
    """Proportional set size of a process and all its descendants, in bytes: pages shared by the
    forked workers count once in total, not once per process as with RSS."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/smaps_rollup") as fh:
                total += next(int(line.split()[1]) * 1024 for line in fh if line.startswith("Pss:"))
            with open(f"/proc/{current}/task/{current}/children") as fh:
                stack.extend(int(c) for c in fh.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_curate(path: Path, output: Path) -> tuple[float, int, dict, float]:
    """Wall seconds, peak PSS, totals, and CPU seconds of the curate process and every process it started."""
    cpu_before = _children_cpu()
    command = [sys.executable, "-m", "klear.cli", "curate", "--input", f"{path}#prompt=problem",
               "--output", str(output), "--config", "paper"]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = 0

    def sample() -> None:
        nonlocal peak
        while process.poll() is None:
            peak = max(peak, _tree_pss(process.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = process.communicate()
    elapsed = time.perf_counter() - started
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"curate failed with exit code {process.returncode}")
    return elapsed, peak, json.loads(stdout.splitlines()[-1]), _children_cpu() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--baseline-prompts", type=int, default=None,
                        help="prompts the baseline reads (default: all, at most 100,000)")
    parser.add_argument("--data", type=Path, help="keep the generated prompts here and reuse them on later runs")
    add_repeat_argument(parser)
    args = parser.parse_args()
    print(machine())
    print(versions("pyarrow", "numpy", "xxhash", "orjson"))
    with tempfile.TemporaryDirectory(prefix="bench-curate-") as tmp:
        data = args.data or Path(tmp) / f"prompts-{args.prompts}.jsonl"
        if not data.exists():
            t0 = time.perf_counter()
            make_prompts(data, args.prompts)
            print(f"generated {args.prompts} prompts in {time.perf_counter() - t0:.1f} s")
        print(f"input: {data.stat().st_size / 1e6:.0f} MB of JSONL")
        base_n = min(args.baseline_prompts or 100_000, args.prompts)
        runs: list[tuple[float, int, dict, float]] = []
        base_cpu: list[float] = []

        def ours() -> float:
            run = run_curate(data, Path(tmp) / f"out-{len(runs)}")
            runs.append(run)
            return run[2]["read"] / run[0]

        def theirs() -> float:
            elapsed, _, cpu = baseline(data, base_n)
            base_cpu.append(cpu)
            return base_n / elapsed

        pairs = list(interleaved(args.repeat, ours, theirs))
        totals = runs[0][2]
        if any(run[2] != totals for run in runs):
            raise SystemExit(f"curate's totals differ between runs: {[run[2] for run in runs]}")
        cores = len(os.sched_getaffinity(0))
        print(f"curate   : {totals['read']} prompts ({cores} cores, JSONL in, Parquet out, published); kept "
              f"{totals['kept']}, contaminated {totals['contaminated']}, duplicate {totals['duplicate']}")
        print(spread("curate   prompts/s", [o for o, _ in pairs], digits=0))
        sample = "all" if base_n == totals["read"] else f"the first {base_n} (a fixed sample; its rate is compared)"
        print(f"baseline : {sample} prompts, 1 process, no output")
        print(spread("baseline prompts/s", [t for _, t in pairs], digits=0))
        print(spread("ratio", [o / t for o, t in pairs], "x") + " (target >= 5x)")
        # CPU seconds per prompt: what a shared machine's load changes least (it stretches the wall clock).
        cpu_ratios = [(cpu / base_n) / (run[3] / run[2]["read"]) for run, cpu in zip(runs, base_cpu)]
        print(spread("curate   CPU s (all its processes)", [run[3] for run in runs]))
        print(spread("baseline CPU s", base_cpu))
        print(spread("CPU ratio (baseline CPU per prompt / curate CPU per prompt)", cpu_ratios, "x"))
        print(f"memory   : peak PSS of the curate process tree {max(run[1] for run in runs) / 2**20:,.0f} MiB "
              "(all processes together, the largest of the runs)")
        print(f"1.5M     : {1.5e6 / statistics.median(o for o, _ in pairs):.0f} s at the median rate (target < 60 s)")
        print(machine())  # the load again: it may have changed during the runs


if __name__ == "__main__":
    main()
