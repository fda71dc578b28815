"""A judge merge of rows of a teacher's size: rows/s, MB/s, peak RSS and peak local disk, beside staging it whole.

    python benchmarks/bench_judge_merge.py [--prompts 2000] [--n 4] [--response-bytes 30000] [--rows-per-shard 1000]
                                           [--rows-per-part 1000] [--repeat 3] [--legacy-ref ede2286] [--local]

A published sample output of prompts x n rows, each response `--response-bytes` of reasoning (bench_sample_scale's
words, which compress as text does) and a boxed answer, in parts of `--rows-per-part` rows, on a SeaweedFS server
on loopback (pipelines/local_s3.py; --local: a folder). One slice (`klear judge --slice 0/1`, the real math scorer)
judges it once; then the merge (`--merge`, `--rows-per-shard` rows per judged part) runs `--repeat` times, each in
a process of its own, on a copy of the slice's work area and into a fresh output, its TMPDIR a scratch folder whose
size a thread polls every 50 ms (bench_sample_scale.DiskPeak): the merge's staging and the samples it downloads.

Printed per merge, then min / median / max: seconds, rows/s, MB/s of response text, peak RSS, peak local disk,
beside the output's size and its largest part's. `--legacy-ref REF` (default: the commit before the judge merge
streamed; '' to skip): the same merges with klear/judge/stage.py as it was at REF (the output staged whole, then
published; the samples fetched whole), taking turns with today's (each repeat the other goes first), and the ratios
today / earlier per repeat, min / median / max. The machine (CPU model, flags, load) and the package versions are
printed first.

Measured 2026-12-06 on 2 shared AMD EPYC cores (load ~1), `python benchmarks/bench_judge_merge.py --prompts 5000
--n 4 --rows-per-shard 2000 --rows-per-part 2000` (20,000 rows of 30 KB; samples and output 588 MiB each, 10 parts
of 59 MiB; 2 min in all), min / median / max of 3, today vs earlier: 1,597 / 1,661 / 1,805 rows/s (48 / 50 / 54 MB/s
of responses) vs 1,536 / 1,703 / 1,711; peak RSS 890 / 903 / 922 MiB vs 923 / 940 / 946; peak local disk 177 MiB
every time (3 parts: the samples' part being read, the judged part being written and the one going up) vs 1,162
MiB (the samples and the output whole). At the paper's 100,000 rows per part that is ~3 parts of ~3 GB however
many rows the merge writes, where it was twice the output.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # pipelines.local_s3
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_sample_scale
from bench_sample_scale import object_root, output_sizes, reasoning_text, rss_kb, run_phase  # noqa: E402

from benchmarks.repeat import add_repeat_argument, in_turns, preamble, spread  # noqa: E402

LEGACY_REF = "ede2286"  # before the judge merge streamed its parts and read its samples a part at a time
PRESET = "paper"


# --------------------------------------------------------------------------- the merge (child process)


def _load_legacy(ref: str) -> None:
    """The judge stage module as it was at `ref`, in place of today's."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:components/klear/judge/stage.py"],
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("klear.judge.stage")
    module.__file__ = f"<{ref}>/klear/judge/stage.py"
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)


def merge(args: argparse.Namespace) -> dict[str, Any]:
    import klear.judge.stage  # noqa: F401  (today's, or the legacy one below, imported before measuring)

    if args.legacy:
        _load_legacy(args.legacy)
    from klear.common import storage
    from klear.common.config import load_config
    from klear.judge.config import JudgeConfig

    stage = sys.modules["klear.judge.stage"]
    storage.list_files(args.work)  # the S3 client's own memory
    start_rss = rss_kb()
    config = load_config(JudgeConfig, PRESET, [f"rows_per_shard={args.rows_per_shard}", "progress_seconds=3600"])
    started = time.monotonic()
    report = stage.run(args.samples, args.output, config, work=args.work, merge=True)
    elapsed = time.monotonic() - started
    return {"elapsed_s": elapsed, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "start_kb": start_rss, "samples": report["totals"]["samples"]}


# --------------------------------------------------------------------------- the run


def publish_samples(uri: str, prompts: int, n: int, response_bytes: int, rows_per_part: int) -> int:
    """A `klear sample` output of prompts x n rows in parts of `rows_per_part`; returns its bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from klear.common import storage
    from klear.common.sample_rows import SAMPLE_SCHEMA

    text = reasoning_text(response_bytes)
    with tempfile.TemporaryDirectory(prefix="bench-judge-samples-") as tmp:
        folder = Path(tmp, "samples")
        folder.mkdir()
        rows = [(f"q{i:07d}", k) for i in range(prompts) for k in range(n)]
        for part, start in enumerate(range(0, len(rows), rows_per_part)):
            batch = []
            for number, (pid, k) in enumerate(rows[start:start + rows_per_part], start):
                reasoning, final = text(number), f"The answer is $\\boxed{{{42 + k % 2}}}$."
                record = {"id": pid, "problem": f"Problem {pid}: what is six times seven?", "answer": "42"}
                batch.append({"id": pid, "sample": k, "prompt": record["problem"],
                              "response": f"<think>\n{reasoning}\n</think>\n\n{final}", "reasoning": reasoning,
                              "final": final, "finish_reason": "stop", "prompt_tokens": 20,
                              "completion_tokens": len(reasoning) // 4, "model": "bench", "record": json.dumps(record)})
            pq.write_table(pa.Table.from_pylist(batch, schema=SAMPLE_SCHEMA), folder / f"part-{part:05d}.parquet",
                           compression="lz4")
        Path(tmp, "report.json").write_text(json.dumps({"stage": "sample", "rows": len(rows)}))
        manifest = storage.publish_dir(tmp, uri, meta={"stage": "sample"})
    return sum(entry["size"] for entry in manifest.files.values())


def copy_folder(source: str, target: str) -> None:
    """Every file under `source` to `target` (the slice's work area, for one merge: a merge deletes what it merged)."""
    from klear.common import storage

    src, dst = storage.Uri.parse(source), storage.Uri.parse(target)
    for rel in storage.list_files(src):
        storage.write_bytes(dst.join(rel), storage.read_bytes(src.join(rel)))


def _child(args: argparse.Namespace, samples: str, output: str, work: str, legacy: str | None, scratch: Path,
           env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, __file__, "--phase", "merge", "--samples", samples, "--output", output, "--work", work,
               "--rows-per-shard", str(args.rows_per_shard), *(["--legacy", legacy] if legacy else [])]
    scratch.mkdir(parents=True)
    return run_phase(command, scratch, env, f"merge ({legacy or 'today'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--response-bytes", type=int, default=30_000, help="bytes of reasoning per response")
    parser.add_argument("--rows-per-shard", type=int, default=1000, help="rows per judged part the merge writes")
    parser.add_argument("--rows-per-part", type=int, default=1000, help="rows per part of the sample output")
    add_repeat_argument(parser)
    parser.add_argument("--legacy-ref", default=LEGACY_REF, help="git ref of the earlier judge stage ('' to skip it)")
    parser.add_argument("--local", action="store_true", help="everything in local folders, not SeaweedFS")
    # The merge in its own process (internal).
    parser.add_argument("--phase", choices=["merge"])
    parser.add_argument("--samples")
    parser.add_argument("--output")
    parser.add_argument("--work")
    parser.add_argument("--legacy")
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(merge(args)))
        return
    rows = args.prompts * args.n
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "components"), str(ROOT)])}
    print(preamble("pyarrow", "boto3", "math-verify"), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-judge-merge-") as tmp:
        with object_root(Path(tmp), args.local, env) as root:
            samples, work = f"{root}/samples", f"{root}/judged.work"
            input_bytes = publish_samples(samples, args.prompts, args.n, args.response_bytes, args.rows_per_part)
            print(f"{args.prompts:,} prompts x {args.n} = {rows:,} rows of {args.response_bytes:,} bytes of "
                  f"reasoning: samples {input_bytes / 2**20:,.0f} MiB in parts of {args.rows_per_part:,} rows; merges "
                  f"write parts of {args.rows_per_shard:,} rows; on {'local folders' if args.local else 'SeaweedFS'}",
                  flush=True)
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "klear.cli", "judge", "--samples", samples, "--output",
                                   f"{root}/judged", "--work", work, "--slice", "0/1", "--config", PRESET],
                                  env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"the slice failed:\n{done.stderr[-4000:]}")
            print(f"slice 0/1 judged them in {time.monotonic() - started:.0f} s", flush=True)
            labels = [("today", None), *([("earlier", args.legacy_ref)] if args.legacy_ref else [])]
            results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in labels}
            sizes: dict[str, tuple[int, int, int]] = {}

            def one_merge(label: str, legacy: str | None) -> dict[str, Any]:
                repeat = len(results[label])
                output, copy = f"{root}/{label}-{repeat}", f"{root}/{label}-{repeat}.work"
                copy_folder(work, copy)
                result = _child(args, samples, output, copy, legacy, Path(tmp, f"scratch-{label}-{repeat}"), env)
                assert result["samples"] == rows, result
                sizes[label] = output_sizes(output, "judged/")
                results[label].append(result)
                print(f"  {label:8s} merge {repeat + 1}: {result['elapsed_s']:6.1f} s, "
                      f"{rows / result['elapsed_s']:7,.0f} rows/s, peak RSS {result['peak_kb'] / 1024:6,.0f} MiB, "
                      f"peak local disk {result['peak_disk'] / 2**20:6,.0f} MiB", flush=True)
                return result

            # Taking turns, the other first each repeat: both see the same drift in the machine's load.
            for _ in in_turns(args.repeat, [functools.partial(one_merge, label, legacy) for label, legacy in labels]):
                pass
            _print_table(results, sizes, rows, args.response_bytes)


def _print_table(results: dict[str, list[dict[str, Any]]], sizes: dict[str, tuple[int, int, int]], rows: int,
                 response_bytes: int) -> None:
    def cell(values: list[float], form: str) -> str:
        return "/".join(format(v, form) for v in (min(values), statistics.median(values), max(values)))

    print(f"\n{'min / median / max':30s}" + "".join(f"{label:>28s}" for label in results))
    lines = [
        ("merge, s", lambda r: cell([x["elapsed_s"] for x in r], ".1f")),
        ("rows/s", lambda r: cell([rows / x["elapsed_s"] for x in r], ",.0f")),
        ("MB/s of responses", lambda r: cell([rows * response_bytes / x["elapsed_s"] / 1e6 for x in r], ".1f")),
        ("peak RSS, MiB", lambda r: cell([x["peak_kb"] / 1024 for x in r], ",.0f")),
        ("peak local disk, MiB", lambda r: cell([x["peak_disk"] / 2**20 for x in r], ",.0f")),
    ]
    for name, value in lines:
        print(f"{name:30s}" + "".join(f"{value(r):>28s}" for r in results.values()))
    for label, (total, part, parts) in sizes.items():
        print(f"{label}: output {total / 2**20:,.0f} MiB, {parts} judged parts, the largest {part / 2**20:,.0f} MiB")
    if "earlier" in results:  # each repeat's pair ran back to back
        pairs = list(zip(results["today"], results["earlier"]))
        print(spread("today / earlier, rows/s", [e["elapsed_s"] / t["elapsed_s"] for t, e in pairs], "x"))
        print(spread("today / earlier, peak RSS", [t["peak_kb"] / e["peak_kb"] for t, e in pairs], "x"))
        print(spread("today / earlier, peak local disk", [t["peak_disk"] / max(e["peak_disk"], 1) for t, e in pairs],
                     "x"))


if __name__ == "__main__":
    main()
