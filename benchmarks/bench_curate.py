"""Speed of the curate stage against a straightforward decontamination script, in one run.

    python benchmarks/bench_curate.py [--prompts 200000] [--baseline-prompts 20000]

Synthetic prompts of realistic length (60-400 words) drawn from the benchmarks' own vocabulary
mixed with other words (so many n-gram windows survive the vocabulary filter), with 0.5% of
them embedding a real AIME/HMMT problem and 2% exact duplicates. Prints prompts/s of
`klear curate` (paper preset: all cores, reading JSONL and publishing Parquet) and of the
baseline (per prompt: json.loads, the same normalization, a Python set of 9-gram tuples
intersected with the benchmark set, dedup on the normalized text), their ratio, peak memory (PSS)
of the curate process tree, and the time 1.5 million prompts would take at the measured rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def baseline(path: Path, limit: int, n: int = 9) -> tuple[float, int]:
    problems = [r["problem"] for name in benchmarks.NAMES for r in read_records(str(benchmarks.path(name)))]
    bench_ngrams: set[tuple[str, ...]] = set()
    for p in problems:
        ws = words(p)
        bench_ngrams.update(zip(*(ws[i:] for i in range(n))))
    started = time.perf_counter()
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
    return time.perf_counter() - started, contaminated


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


def run_curate(path: Path, output: Path) -> tuple[float, int, dict]:
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
    return elapsed, peak, json.loads(stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=200_000)
    parser.add_argument("--baseline-prompts", type=int, default=20_000)
    parser.add_argument("--data", type=Path, help="keep the generated prompts here and reuse them on later runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-curate-") as tmp:
        data = args.data or Path(tmp) / f"prompts-{args.prompts}.jsonl"
        if not data.exists():
            t0 = time.perf_counter()
            make_prompts(data, args.prompts)
            print(f"generated {args.prompts} prompts in {time.perf_counter() - t0:.1f} s")
        print(f"input: {data.stat().st_size / 1e6:.0f} MB of JSONL")
        elapsed, peak, totals = run_curate(data, Path(tmp) / "out")
        base_n = min(args.baseline_prompts, totals["read"])
        base_elapsed, _ = baseline(data, base_n)
        ours = totals["read"] / elapsed
        theirs = base_n / base_elapsed
        cores = len(os.sched_getaffinity(0))
        print(f"curate   : {totals['read']} prompts in {elapsed:.1f} s = {ours:,.0f} prompts/s ({cores} cores, "
              f"JSONL in, Parquet out, published); kept {totals['kept']}, contaminated {totals['contaminated']}, "
              f"duplicate {totals['duplicate']}")
        print(f"baseline : {base_n} prompts in {base_elapsed:.1f} s = {theirs:,.0f} prompts/s (1 process, no output)")
        print(f"ratio    : {ours / theirs:.1f}x the baseline (target >= 5x)")
        print(f"memory   : peak PSS of the curate process tree {peak / 2**20:,.0f} MiB (all processes together)")
        print(f"1.5M     : {1.5e6 / ours:.0f} s at this rate (target < 60 s)")


if __name__ == "__main__":
    main()
