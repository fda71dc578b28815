"""Paper-scale sampling bookkeeping: memory per unit, merge speed and restart time, beside the earlier path.

    python benchmarks/bench_sample_scale.py [--prompts 150000] [--n 16] [--small] [--local] [--legacy-ref REF]
                                            [--response-bytes 30000] [--rows-per-part 100000] [--repeat 3]

A synthetic run of `prompts` x `n` units (2.4M by default) through the real `klear sample` coordinator, work
area and merge (klear.sample.stage.run with --slice 0/1, then --merge), with an in-process backend that answers
every request at once (what the bookkeeping costs, not the model), the work area on a SeaweedFS server on
loopback (pipelines/local_s3.py; --local: a folder). Each phase is its own process, so each peak RSS is that
phase's alone:

1. fill     a slice samples 60% of the units, then its pod is preempted (the backend stops answering)
2. restart  the slice again: time from the start of the run to the first request (load the prompts, read the
            work area's indexes, find the 40% missing), then it samples the rest
3. merge    `--merge`: checks every unit, writes the output in prompt order; rows/s over the whole merge

Each phase stages on a scratch folder of its own (its TMPDIR, as KLEAR_SCRATCH is on a pod), whose size a thread
polls every 50 ms: the merge's peak local disk (its Parquet parts and spilled buckets) is printed beside the
output's size and its largest part. `--rows-per-part R`: the output's part size (default: the paper preset's).

The same phases run with the code of `--legacy-ref` (git; default the commit before the ordered, Arrow-based
merge: per-unit dicts and sets, one index object per 256-unit shard) on a work area of its own. Memory per
unit is (peak RSS - RSS after imports) / units: the prompts' own objects are included (per prompt, not per
unit). The 24M-unit lines scale the per-unit figures linearly (memory) and the restart by the index objects.
`--repeat N`: the three phases run N times on each side, on fresh work areas, the sides taking turns (each repeat
the other first); every figure is printed as its median (min-max) over the repeats, after the machine and the package
versions, with the ratios today / earlier per repeat. `--small`: 10,000 prompts x 16 (about a minute a repeat).
`--response-bytes B`: each response's reasoning is B bytes
(default: a ~25-byte line): a teacher row is ~30 KB, so `--response-bytes 30000` measures a merge of realistic rows
(rows/s and MB/s of response text) instead of the bookkeeping alone.

Measured 2026-12-07, `python benchmarks/bench_sample_scale.py --legacy-ref '' --repeat 3` (AMD EPYC, 2 cores, otherwise
idle; allocations of 1 MiB or more mapped on their own, coordinator.map_large_allocations): peak 66 (66-66) B/unit
first run, 82 (82-83) restart, 108 (108-110) merge; restart to the first request 5.0 s; merge 39,484 rows/s. Before
that setting the restart's peak varied with glibc's moving mmap threshold: 109 (106-200) B/unit the same morning.

Measured 2026-12-06, `python benchmarks/bench_sample_scale.py --legacy-ref '' --repeat 3` (machine: AMD EPYC, 2 cores
usable, avx2=yes avx512f=yes avx512_bf16=yes avx512_vnni=yes amx_bf16=no amx_tile=no; load 7-9, shared): peak
65 (63-65) B/unit first run, 92 (90-109) restart, 112 (107-113) merge; coordinator state after the scan 34 (34-34)
/ 45 (44-45) B/unit (the scan's freed memory handed back: coordinator.release_freed_memory). At 24M units: peak
2.0 GiB, merge 2.5 GiB.

Measured 2026-12-05 on 2 shared cores, `python benchmarks/bench_sample_scale.py`, one run of each side (8 min in all; today's three
phases 82 + 70 + 54 s), today vs earlier: coordinator state after the scan 50 / 75 B/unit (first run / restart)
vs 321 / 267; peak 85 / 110 B/unit vs 327 / 444; merge 115 B/unit vs 703, 44,225 rows/s vs 22,671; restart to
the first request 6.92 s vs 29.61 s (25 index objects vs 5,625). At 24M units: coordinator peak 2.5 GiB, merge
2.6 GiB, merge 9.0 min (earlier 9.9 GiB, 15.7 GiB, 17.6 min). At 600K units (`--prompts 37500 --legacy-ref ''`)
the fixed part weighs more: 93 / 119 / 138 B/unit. Those responses are ~30 bytes: with a teacher's 30 KB rows
(`--prompts 6250 --n 16 --response-bytes 30000 --legacy-ref ''`: 100,000 rows; 2026-12-06, 2 cores shared with
other work, load ~4) the merge runs at 941 rows/s (28 MB/s of text), peak RSS 1.5 GiB, peak local disk 2,940 MiB
for an output of 2,940 MiB: at the paper's rows_per_part (100,000) the output is one part. With `--rows-per-part
10000` (10 parts of 294 MiB; LZ4 barely shrinks these words): 946 rows/s, peak RSS 1.5 GiB, peak local disk
404 MiB (1.4 parts), the output 2,940 MiB. Before parts were streamed to the output (the merge staged them all,
then published), the same 10 parts held 2,940 MiB; alternating merges of one work area with both (load ~2-3):
1,362 / 1,445 rows/s streamed vs 1,365 / 1,329 staged, the same peak RSS. 24M such rows: ~5-7 h at these rates
(1,933 rows/s on a quieter day: ~3.4 h), on a part or two of local disk plus the spill (write_in_order).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # pipelines.local_s3, benchmarks.repeat
from benchmarks.repeat import add_repeat_argument, in_turns, preamble, spread  # noqa: E402

LEGACY_REF = "7349012^"  # before the ordered Arrow merge and the writer indexes
PAPER_UNITS = 24_000_000


# --------------------------------------------------------------------------- a phase (child process)


def rss_kb() -> int:
    """This process's resident memory now, KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _load_legacy(ref: str) -> None:
    """The sample stage's units, store and stage modules as they were at `ref`, in place of today's."""
    for name in ("units", "store", "stage"):
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:components/klear/sample/{name}.py"],
                                check=True, capture_output=True, text=True).stdout
        module = types.ModuleType(f"klear.sample.{name}")
        module.__file__ = f"<{ref}>/klear/sample/{name}.py"
        sys.modules[module.__name__] = module
        setattr(sys.modules["klear.sample"], name, module)
        exec(compile(source, module.__file__, "exec"), module.__dict__)


def reasoning_text(size: int) -> Any:
    """Unit k's reasoning: one short line, or `size` bytes of words drawn (Zipf-like) from a 4,096-word vocabulary,
    different for every unit, which zstd compresses about as it does English text (a few times), where one repeated
    line would compress to nothing and flatter the merge."""
    if not size:
        return lambda k: "Let me add the columns."
    import numpy as np

    rng = np.random.default_rng(0)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    vocab = np.array(["".join(rng.choice(letters, size=int(n))) for n in rng.integers(2, 10, size=4096)])
    weights = 1.0 / np.arange(1, 4097)
    weights /= weights.sum()
    words = size // 5 + 1

    def text(k: int) -> str:
        picked = vocab[np.random.default_rng(k + 1).choice(4096, size=words, p=weights)]
        return " ".join(picked.tolist())[:size]

    return text


class Preempted(Exception):
    """The pod goes away mid-run."""


def phase(args: argparse.Namespace) -> dict[str, Any]:
    import klear.sample.stage  # noqa: F401  (today's modules, or the legacy ones below, before measuring)

    if args.legacy:
        _load_legacy(args.legacy)
    import pyarrow as pa

    from klear.common import storage
    from klear.common.config import load_config
    from klear.sample import coordinator, stage
    from klear.sample.backends import openai_api  # noqa: F401  (imported by the run: not a cost per unit)
    from klear.sample.backends.base import Completion
    from klear.sample.config import SampleConfig
    from klear.sample.reasoning import Parsed

    storage.list_files(args.work)  # the S3 client's own memory, likewise
    pa.array(["warm"])  # and Arrow's memory pool (mimalloc maps ~35 MiB on its first allocation)
    start_rss = rss_kb()
    first_request: list[float] = []
    state_rss: list[int] = []

    class Instant:
        """Answers every request at once; stops after `stop_after` answers (a preempted pod) when given."""

        name = "instant"

        def identity(self) -> dict[str, Any]:
            return {"engine": "endpoint", "model": "bench"}

        def describe(self) -> dict[str, Any]:
            return {"backend": "instant", "served_model": "bench", "endpoint": "in-process"}

        def generate(self, requests: Any) -> Any:
            first_request.append(time.monotonic())
            state_rss.append(rss_kb())  # what the coordinator holds once it knows what to sample
            text = reasoning_text(args.response_bytes)
            for k, request in enumerate(requests):
                if args.stop_after is not None and k >= args.stop_after:
                    raise Preempted
                reasoning = text(k)
                yield Completion(request, Parsed(reasoning, "42", True), "stop", 30, max(12, len(reasoning) // 4),
                                 "bench")

        def close(self) -> None:
            pass

    coordinator.make_backend = lambda *a, **k: Instant()
    if args.legacy:  # a legacy ref's stage module makes its backend itself (mypy sees today's, which does not)
        stage.make_backend = coordinator.make_backend  # type: ignore[attr-defined]
    config = load_config(SampleConfig, "paper", [f"n={args.n}", "shard_size=256", "flush_seconds=3600",
                                                 "progress_seconds=3600", "keep_work=true",
                                                 *([f"rows_per_part={args.rows_per_part}"] if args.rows_per_part else [])])
    started = time.monotonic()
    flags: dict[str, Any] = {"merge": True} if args.phase == "merge" else {"slice_spec": "0/1"}
    try:
        report = stage.run([args.prompts_uri], args.output, config, endpoint="http://bench.invalid/v1",
                           served_model="bench", work=args.work, **flags)
    except Preempted:
        report = {}
    elapsed = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"elapsed_s": elapsed, "peak_kb": peak, "start_kb": start_rss, "state_kb": state_rss[0] if state_rss else None,
            "to_first_request_s": first_request[0] - started if first_request else None,
            "units": report.get("units", {})}


# --------------------------------------------------------------------------- the run


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` now (files that go while it is walked count as gone)."""
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except FileNotFoundError:
                pass
    return total


class DiskPeak:
    """The largest size `folder` reached while the block ran, polled every `every_s` seconds from a thread."""

    def __init__(self, folder: Path, every_s: float = 0.05) -> None:
        self.folder, self.every_s, self.peak = folder, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while True:
            self.peak = max(self.peak, folder_bytes(self.folder))
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _child(kind: str, legacy: str | None, prompts: str, output: str, work: str, n: int, stop_after: int | None,
           env: dict[str, str], response_bytes: int = 0, rows_per_part: int | None = None,
           scratch: Path | None = None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--phase", kind, "--prompts-uri", prompts, "--output", output, "--work", work,
               "--n", str(n), "--response-bytes", str(response_bytes)] + (["--legacy", legacy] if legacy else []) + \
              (["--stop-after", str(stop_after)] if stop_after is not None else []) + \
              (["--rows-per-part", str(rows_per_part)] if rows_per_part else [])
    scratch = scratch or Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    scratch.mkdir(parents=True, exist_ok=True)
    return run_phase(command, scratch, env, f"{kind} ({legacy or 'today'})")


def run_phase(command: list[str], scratch: Path, env: dict[str, str], what: str) -> dict[str, Any]:
    """Run one phase's process with `scratch` as its TMPDIR (as use_scratch makes KLEAR_SCRATCH on a pod): the JSON
    its last line prints, and the peak bytes it held there."""
    with DiskPeak(scratch) as disk:
        done = subprocess.run(command, env={**env, "TMPDIR": str(scratch)}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-4000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "peak_disk": disk.peak}


def output_sizes(output: str, folder: str = "samples/") -> tuple[int, int, int]:
    """The published output's bytes, its largest part's under `folder`, and its number of those parts (from its
    manifest)."""
    from klear.common import storage

    files = storage.read_manifest(output).files
    parts = [entry["size"] for rel, entry in files.items() if rel.startswith(folder)]
    return sum(entry["size"] for entry in files.values()), max(parts, default=0), len(parts)


def _index_objects(root: str) -> int:
    from klear.common import storage

    return len(storage.list_files(storage.Uri.parse(root).join("index")))



@contextlib.contextmanager
def object_root(tmp: Path, local: bool, env: dict[str, str]) -> Iterator[str]:
    """Where a benchmark keeps its data: a folder under `tmp`, or a bucket on a SeaweedFS server started on
    loopback for the benchmark (its credentials set here and in `env`, the subprocesses' environment)."""
    if local:
        yield str(tmp / "store")
        return
    import boto3

    from pipelines import local_s3

    server = local_s3.start(tmp / "seaweedfs")
    try:
        env.update(server.env)
        os.environ.update(server.env)
        boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        yield "s3://bench"
    finally:
        server.stop()

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=150_000)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--done", type=float, default=0.6, help="share of the units done when the pod goes")
    parser.add_argument("--small", action="store_true", help="10,000 prompts: a quick run")
    parser.add_argument("--local", action="store_true", help="the work area in a local folder, not SeaweedFS")
    parser.add_argument("--legacy-ref", default=LEGACY_REF, help="git ref of the earlier path ('' to skip it)")
    parser.add_argument("--response-bytes", type=int, default=0, help="bytes of reasoning per response (0: one line)")
    parser.add_argument("--rows-per-part", type=int, help="rows per published Parquet part (default: the preset's)")
    add_repeat_argument(parser)
    # A phase in its own process (internal).
    parser.add_argument("--phase", choices=["fill", "restart", "merge"])
    parser.add_argument("--prompts-uri")
    parser.add_argument("--output")
    parser.add_argument("--work")
    parser.add_argument("--legacy")
    parser.add_argument("--stop-after", type=int)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase(args)))
        return
    if args.small:
        args.prompts = 10_000
    units = args.prompts * args.n
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "components"), str(ROOT)])}
    print(preamble("pyarrow", "boto3"), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-sample-scale-") as tmp:
        prompts = Path(tmp, "prompts.jsonl")
        with prompts.open("w") as out:
            for i in range(args.prompts):
                out.write(json.dumps({"id": f"q{i:08d}", "prompt": f"Add the columns of {i} and {i * 7 % 9973}."})
                          + "\n")
        with object_root(Path(tmp), args.local, env) as root:
            print(f"{args.prompts:,} prompts x {args.n} = {units:,} units of {args.response_bytes or 23:,} bytes of "
                  f"reasoning; work area on {'a local folder' if args.local else 'SeaweedFS (loopback)'}", flush=True)
            labels = [("today", None), *([("earlier", args.legacy_ref)] if args.legacy_ref else [])]
            results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in labels}

            def one_run(label: str, legacy: str | None) -> None:
                repeat = len(results[label])
                output, work = f"{root}/{label}-{repeat}/samples", f"{root}/{label}-{repeat}/samples.work"
                row: dict[str, Any] = {}
                for kind, stop in (("fill", int(units * args.done)), ("restart", None), ("merge", None)):
                    row[kind] = _child(kind, legacy, str(prompts), output, work, args.n, stop, env, args.response_bytes,
                                       args.rows_per_part, Path(tmp, f"scratch-{label}-{repeat}-{kind}"))
                    print(f"  {label:8s} {repeat + 1} {kind:8s} {row[kind]['elapsed_s']:7.1f} s, peak RSS "
                          f"{row[kind]['peak_kb'] / 1024:7.0f} MiB, peak local disk "
                          f"{row[kind]['peak_disk'] / 2**20:7.0f} MiB", flush=True)
                    if kind == "fill":
                        row["index_objects"] = _index_objects(work)
                row["output_bytes"], row["part_bytes"], row["parts"] = output_sizes(output)
                results[label].append(row)

            # Taking turns, the other first each repeat: both see the same drift in the machine's load.
            for _ in in_turns(args.repeat, [functools.partial(one_run, label, legacy) for label, legacy in labels]):
                pass
            _print_table(results, units, args.response_bytes or 23)


def _print_table(results: dict[str, list[dict[str, Any]]], units: int, response_bytes: int) -> None:
    """Every figure as its median (min-max) over the repeats, a column per side; then today / earlier per repeat."""
    def per_unit(phase: dict[str, Any]) -> float:
        return float((phase["peak_kb"] - phase["start_kb"]) * 1024 / units)

    def state(phase: dict[str, Any]) -> float:
        return float((phase["state_kb"] - phase["start_kb"]) * 1024 / units)

    def rows_per_s(r: dict[str, Any]) -> float:
        return float(units / r["merge"]["elapsed_s"])

    def cell(values: list[float], form: str) -> str:
        return f"{statistics.median(values):{form}} ({min(values):{form}}-{max(values):{form}})"

    figures: list[tuple[str, str, Any]] = [
        ("coordinator state, first run: B/unit", ".0f", lambda r: state(r["fill"])),
        ("coordinator state, restart: B/unit", ".0f", lambda r: state(r["restart"])),
        ("coordinator, first run: B/unit", ".0f", lambda r: per_unit(r["fill"])),
        ("coordinator, restart:   B/unit", ".0f", lambda r: per_unit(r["restart"])),
        ("merge:                  B/unit", ".0f", lambda r: per_unit(r["merge"])),
        ("merge rows/s", ",.0f", rows_per_s),
        ("merge MB/s of responses", ",.1f", lambda r: rows_per_s(r) * response_bytes / 1e6),
        ("merge peak RSS, MiB", ",.0f", lambda r: r["merge"]["peak_kb"] / 1024),
        ("merge peak local disk, MiB", ",.0f", lambda r: r["merge"]["peak_disk"] / 2**20),
        ("output, MiB", ",.0f", lambda r: r["output_bytes"] / 2**20),
        ("output parts", ",.0f", lambda r: r["parts"]),
        ("largest part, MiB", ",.0f", lambda r: r["part_bytes"] / 2**20),
        ("peak disk / largest part", ".2f", lambda r: r["merge"]["peak_disk"] / max(r["part_bytes"], 1)),
        ("restart to first request, s", ".2f", lambda r: r["restart"]["to_first_request_s"]),
        ("index objects after the fill", ",.0f", lambda r: r["index_objects"]),
    ]
    repeats = len(next(iter(results.values())))
    print(f"\nmedian (min-max) of {repeats} {'repeats' if repeats > 1 else 'run'}")
    print(f"{'':38s}" + "".join(f"{label:>30s}" for label in results))
    for name, form, value in figures:
        print(f"{name:38s}" + "".join(f"{cell([value(r) for r in runs], form):>30s}" for runs in results.values()))
    if "earlier" in results:  # each repeat's pair ran back to back
        pairs = list(zip(results["today"], results["earlier"]))
        print()
        for name, _, value in figures[:6] + figures[13:14]:
            print(spread(f"today / earlier, {' '.join(name.split())}", [value(t) / value(e) for t, e in pairs], "x"))
    scale = PAPER_UNITS / units
    if response_bytes > 1000:  # memory is then the rows in flight (bounded by ASSEMBLY_MEMORY), not per unit
        for label, runs in results.items():
            hours = statistics.median(PAPER_UNITS / rows_per_s(r) / 3600 for r in runs)
            print(f"\n{label}: {PAPER_UNITS / 1e6:.0f}M such rows merge in ~{hours:.1f} h at the median rate (time only: "
                  "the merge holds a bounded share of the rows, so its memory does not grow with the units)")
        return
    print(f"\nExtrapolated to {PAPER_UNITS / 1e6:.0f}M units (linear in units; medians of the repeats):")
    for label, runs in results.items():
        coordinator = statistics.median(max(state(r["fill"]), state(r["restart"])) for r in runs) * PAPER_UNITS / 2**30
        peak = statistics.median(max(per_unit(r["fill"]), per_unit(r["restart"])) for r in runs) * PAPER_UNITS / 2**30
        merge = statistics.median(per_unit(r["merge"]) for r in runs) * PAPER_UNITS / 2**30
        minutes = statistics.median(PAPER_UNITS / rows_per_s(r) / 60 for r in runs)
        restart = statistics.median(r["restart"]["to_first_request_s"] for r in runs) * scale
        objects = "<= 127 per writer" if label == "today" else \
            f"~{statistics.median(r['index_objects'] for r in runs) * scale:,.0f}"
        print(f"  {label:8s} coordinator state {coordinator:5.1f} GiB, peak {peak:5.1f} GiB, merge {merge:5.1f} GiB, "
              f"merge {minutes:5.1f} min, restart ~{restart:5.0f} s, index objects {objects}")


if __name__ == "__main__":
    main()
