"""Entry point of the rl-filter stage: the RL training set, filtered by the filter model's pass rate.

    klear rl-filter --problems URI --samples URI --output URI [--task math|code] [--benchmark URI ...]
                    [--config paper|tiny|FILE]

`--problems`: candidate RL problems (curate's output, or files mapped with `#prompt=..&id=..&answer=..&tests=..`).
`--samples`: the filter model's samples of them (paper: DeepSeek-R1-0120, 16 per problem), the output of
`klear sample` or of `klear judge`. In order, a problem is dropped when it shares a 9-gram with a test set
(contaminated / short_match) or duplicates an earlier one (duplicate, curate's matching), lacks its reference
(no_answer / no_tests), has fewer than `min_tests` tests (code: few_tests), has no judged samples (no_samples),
or when the fraction of its first k samples judged correct (code: every test passed; math: answer verified) is
not above `keep_above` (low_pass_rate); an optional band drops too_hard / too_easy. Publishes

    prompts/part-*.parquet   kept problems in the format `klear gppo` reads: id, source, prompt, answer (math),
                             tests (JSON) + fn_name (code), task, n_tests, samples, passed, pass_rate
    removed/part-*.parquet   dropped problems: id, source, task, reason, n_tests, samples, passed, pass_rate,
                             matched (test-set items), ngram
    report.json, report.md, pass_rate_hist.png

atomically (manifest last). `klear gppo --data <output>` reads prompts/ only (as it reads curate's output).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from klear import testsets as shipped_benchmarks
from klear.common.data_stage import DataStage
from klear.common.records import ParquetShardWriter, RecordError, Source, iter_records
from klear.curate.matching import BenchmarkItem, NgramIndex, dedup_key, normalize_batch
from klear.judge import Judge, Problem, load_problems
from klear.judge.io import SampleInputError, iter_judged
from klear.judge.plots import histogram_png
from klear.judge.rates import first_k_pass_rate, histogram
from klear.rl_filter.config import RlFilterConfig
from klear.rl_filter.decide import REASONS, decide, missing_reference
from klear.rl_filter.report import render_markdown

log = logging.getLogger("klear.rl_filter")
STAGE = DataStage("rl-filter", RlFilterConfig, render_markdown)

KEPT_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("prompt", pa.string()), ("answer", pa.string()),
    ("tests", pa.string()), ("fn_name", pa.string()), ("task", pa.string()), ("n_tests", pa.int64()),
    ("samples", pa.int64()), ("passed", pa.int64()), ("pass_rate", pa.float64()),
])
REMOVED_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("task", pa.string()), ("reason", pa.string()),
    ("n_tests", pa.int64()), ("samples", pa.int64()), ("passed", pa.int64()), ("pass_rate", pa.float64()),
    ("matched", pa.list_(pa.string())), ("ngram", pa.string()),
])
_MATCH_BATCH = 4096


class RlFilterError(ValueError):
    """Problems or samples the filter cannot work with (none, or no sample of any problem); names the input."""


@dataclass
class Candidate:
    """One problem and what became of it."""

    where: str
    problem: Problem
    reason: str | None = None
    matched: list[str] = field(default_factory=list)
    ngram: str = ""
    passed: int = 0
    samples: int = 0

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.samples if self.samples else None


# --------------------------------------------------------------------------- before judging


def load_benchmark_items(specs: Sequence[str], text_field: str) -> list[BenchmarkItem]:
    """Test-set items (`URI[#problem=FIELD&id=FIELD]`), for curate's n-gram index."""
    items = []
    for spec in specs:
        source = Source.parse(spec)
        text_key, id_key = source.field("problem", text_field), source.field("id", "id")
        for located in iter_records(source):
            text = located.record.get(text_key)
            if not isinstance(text, str):
                raise RecordError(f"{located.where}: benchmark item has no text field {text_key!r}")
            items.append(BenchmarkItem(str(located.record.get(id_key) or located.where),
                                       str(located.record.get("benchmark") or source.name), text))
    return items


def mark_matches(candidates: Sequence[Candidate], index: NgramIndex | None, dedup: bool) -> None:
    """Contamination (curate's n-gram index) and exact duplicates of an earlier problem, in input order."""
    first_of: dict[bytes, str] = {}
    for start in range(0, len(candidates), _MATCH_BATCH):
        batch = candidates[start:start + _MATCH_BATCH]
        word_lists = normalize_batch([c.problem.prompt for c in batch])
        counts = pc.list_value_length(word_lists).to_numpy(zero_copy_only=False).tolist()
        joined = pc.binary_join(word_lists, pa.scalar(" ", pa.large_string())).view(pa.large_binary()).to_pylist()
        matches = index.match_batch(word_lists) if index is not None else [None] * len(batch)
        for i, candidate in enumerate(batch):
            short = index is not None and counts[i] < index.n
            match = index.match_short(word_lists[i].as_py()) if short else matches[i]  # type: ignore[union-attr]
            if match is not None:
                candidate.reason = "short_match" if short else "contaminated"
                candidate.matched, candidate.ngram = list(match.item_ids), match.ngram
                continue
            if dedup and counts[i]:
                key = dedup_key(joined[i])
                if key in first_of:
                    candidate.reason, candidate.matched = "duplicate", [first_of[key]]
                    continue
                first_of[key] = candidate.problem.id


def mark_references(candidates: Sequence[Candidate], task: str, min_tests: int) -> None:
    """Problems without their reference, ids seen before (samples could not tell them apart), too few tests."""
    seen: set[str] = set()
    for c in candidates:
        if c.reason is None:
            if c.problem.id in seen:
                c.reason, c.matched = "duplicate_id", [c.problem.id]
            else:
                c.reason = missing_reference(task, c.problem.kind)
        seen.add(c.problem.id)
        if c.reason is None and c.problem.kind == "code" and c.problem.n_tests < min_tests:
            c.reason = "few_tests"  # decided before judging: no sandbox time on problems that cannot be kept


class _SampleFilter:
    """Which sample rows to judge (those of problems still in the running); counts the rest."""

    def __init__(self, wanted: Mapping[str, Problem], known: set[str]) -> None:
        self.wanted, self.known = wanted, known
        self.read = self.orphans = self.of_dropped = 0
        self.orphan_ids: list[str] = []

    def __call__(self, row: Mapping[str, Any]) -> bool:
        self.read += 1
        pid = str(row["id"])
        if pid in self.wanted:
            return True
        if pid in self.known:
            self.of_dropped += 1
        else:
            self.orphans += 1
            if len(self.orphan_ids) < 20 and pid not in self.orphan_ids:
                self.orphan_ids.append(pid)
        return False


# --------------------------------------------------------------------------- the stage


def run(problems: str, samples: str, output: str, config: RlFilterConfig, benchmark_specs: Sequence[str] | None = None,
        task: str | None = None) -> dict[str, Any]:
    """Filter the RL `problems` by the filter model's `samples` and publish to `output`; returns the report."""
    started = time.monotonic()
    task = task or config.task
    specs = list(benchmark_specs) if benchmark_specs else [str(p) for p in shipped_benchmarks.all_paths()]
    checked = STAGE.check(output, {"problems": problems, "samples": samples, "benchmark": specs}, config=config)
    candidates = [Candidate(where, problem) for where, problem in load_problems(problems, task)]
    if not candidates:
        raise RlFilterError(f"{problems} holds no problems: nothing to filter, nothing published")
    index = NgramIndex(load_benchmark_items(specs, config.benchmark_field), config.ngram_size) if config.decontaminate else None
    mark_matches(candidates, index, config.dedup)
    mark_references(candidates, task, config.min_tests)
    wanted = {c.problem.id: c.problem for c in candidates if c.reason is None}
    by_id = {c.problem.id: c for c in candidates if c.reason is None}
    sample_filter = _SampleFilter(wanted, {c.problem.id for c in candidates})
    judged: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    with checked.open() as out, Judge(config.judge) as judge:
        staging = out.staging
        verdicts: Counter[str] = Counter()
        for rows in iter_judged(samples, judge, wanted, config.batch_size,
                                columns=("id", "sample", "response", "finish_reason"), wanted=sample_filter):
            for row in rows:
                judged[str(row["id"])].append((int(row["sample"]), bool(row["correct"])))
                verdicts[str(row.get("verdict"))] += 1
        if sample_filter.read == 0:
            raise SampleInputError(f"{samples} holds no sample rows: nothing published")
        if sample_filter.orphans == sample_filter.read:
            raise RlFilterError(f"none of the {sample_filter.read} samples in {samples} belongs to a problem of "
                                f"{problems} (sample ids such as {sample_filter.orphan_ids[:5]}): wrong --samples?")
        if sample_filter.orphans:
            log.warning("%d of %d samples in %s belong to no problem of %s (ids such as %s): not judged; see report.md",
                        sample_filter.orphans, sample_filter.read, samples, problems,
                        ", ".join(sample_filter.orphan_ids[:5]))
        for pid, c in by_id.items():
            c.passed, c.samples = first_k_pass_rate(judged.get(pid, ()), config.samples_per_problem)
            c.reason = decide(c.problem.kind or "", c.problem.n_tests, c.passed, c.samples, config)
        judge.check_scorer_works()
        kept, removed = _write(staging, candidates, config)
        elapsed = time.monotonic() - started
        report = _report(problems, samples, specs, task, config, candidates, sample_filter, verdicts, judge, elapsed)
        histogram_png(staging / "pass_rate_hist.png",
                      {"kept": [c.pass_rate for c in candidates if c.reason is None and c.pass_rate is not None],
                       "removed": [c.pass_rate for c in candidates if c.reason is not None and c.pass_rate is not None]},
                      bins=[i / 16 for i in range(17)], title="Filter-model pass rate per problem", xlabel="pass rate")
        out.publish(report, {"kept": kept, "removed": removed, "task": task})
    if kept == 0:
        log.warning("rl-filter kept no problem of %s: see %s/report.md", problems, output)
    log.info("published %s: %d of %d problems kept (%.1f s)", output, kept, len(candidates), elapsed)
    return report


def _write(staging: Path, candidates: Sequence[Candidate], config: RlFilterConfig) -> tuple[int, int]:
    kept = ParquetShardWriter(staging / "prompts", "part", KEPT_SCHEMA, config.rows_per_shard,
                              dictionary_columns=("source", "task"))
    removed = ParquetShardWriter(staging / "removed", "part", REMOVED_SCHEMA, config.rows_per_shard,
                                 dictionary_columns=("source", "task", "reason"))
    keep_rows: dict[str, list[Any]] = {n: [] for n in KEPT_SCHEMA.names}
    drop_rows: dict[str, list[Any]] = {n: [] for n in REMOVED_SCHEMA.names}
    for c in candidates:
        p = c.problem
        common = {"id": p.id, "source": p.source, "task": p.kind or "none", "n_tests": p.n_tests, "samples": c.samples,
                  "passed": c.passed, "pass_rate": c.pass_rate}
        if c.reason is None:
            row = {**common, "prompt": p.prompt, "answer": p.answer or "",
                   "tests": json.dumps(p.tests) if p.tests else "", "fn_name": p.fn_name or ""}
            for name in KEPT_SCHEMA.names:
                keep_rows[name].append(row[name])
        else:
            row = {**common, "reason": c.reason, "matched": c.matched, "ngram": c.ngram}
            for name in REMOVED_SCHEMA.names:
                drop_rows[name].append(row[name])
    kept.write(keep_rows)
    removed.write(drop_rows)
    kept.close()
    removed.close()
    return kept.rows, removed.rows


def _report(problems: str, samples: str, specs: Sequence[str], task: str, config: RlFilterConfig,
            candidates: Sequence[Candidate], sample_filter: _SampleFilter, verdicts: Counter[str], judge: Judge,
            elapsed: float) -> dict[str, Any]:
    reasons = Counter({r: 0 for r in REASONS})
    per_source: dict[str, Counter[str]] = defaultdict(Counter)
    per_task: dict[str, Counter[str]] = defaultdict(Counter)
    for c in candidates:
        outcome = c.reason or "kept"
        reasons[outcome] += c.reason is not None
        per_source[c.problem.source or "unknown"][outcome] += 1
        per_source[c.problem.source or "unknown"]["read"] += 1
        per_task[c.problem.kind or "none"][outcome] += 1
        per_task[c.problem.kind or "none"]["read"] += 1
    kept = sum(c.reason is None for c in candidates)
    return {
        "stage": "rl-filter",
        "problems": problems,
        "samples": samples,
        "benchmarks": list(specs),
        "task": task,
        "rule": (f"keep when the pass rate over the first {config.samples_per_problem or 'all'} samples is > "
                 f"{config.keep_above}; code also needs >= {config.min_tests} tests"
                 + (f"; band [{config.min_pass_rate}, {config.max_pass_rate}]"
                    if config.min_pass_rate is not None or config.max_pass_rate is not None else "")),
        "totals": {"problems": len(candidates), "kept": kept, "removed": len(candidates) - kept},
        "reasons": dict(reasons),
        "per_source": {s: dict(c) for s, c in sorted(per_source.items())},
        "per_task": {t: dict(c) for t, c in sorted(per_task.items())},
        "samples_read": sample_filter.read,
        "samples_judged": sum(verdicts.values()),
        "samples_of_dropped_problems": sample_filter.of_dropped,
        "orphan_samples": {"count": sample_filter.orphans, "ids": sample_filter.orphan_ids,
                           "note": "sample rows whose id is not among the problems: not judged"},
        "verdicts": dict(verdicts),
        "judge": {"budget_timeouts": judge.timeouts, "scorer_errors": judge.errors},
        "pass_rate_histogram": {
            "bins": 16,
            "kept": histogram([c.pass_rate for c in candidates if c.reason is None and c.pass_rate is not None], 16),
            "removed": histogram([c.pass_rate for c in candidates if c.reason is not None and c.pass_rate is not None], 16),
        },
        "config": config.model_dump(mode="json"),
        "elapsed_s": round(elapsed, 3),
    }


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rl-filter", help="RL data: keep problems the filter model solves reliably",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", required=True, metavar="URI",
                        help="candidate RL problems, URI[#prompt=F&id=F&answer=F&tests=F&fn_name=F]")
    parser.add_argument("--samples", required=True, metavar="URI", help="filter-model samples: output of `klear sample` or `klear judge`")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    parser.add_argument("--task", choices=("math", "code"), default=None, help="judge every problem as this task (default: config task)")
    parser.add_argument("--benchmark", nargs="+", action="extend", default=None, metavar="URI",
                        help="test sets for decontamination (default: the shipped AIME24/25, HMMT25)")
    STAGE.add_main(parser, lambda args, config: run(args.problems, args.samples, args.output, config, args.benchmark,
                                                    args.task),
                   lambda report: {**report["totals"], "reasons": {k: v for k, v in report["reasons"].items() if v}})
