"""Entry point of the curate stage.

    klear curate --input URI [URI ...] [--benchmark URI ...] --output URI [--config paper|tiny|FILE]

Reads every prompt source in order, removes (1) prompts that share a word n-gram with a test set
("contaminated"), or, when shorter than n words, whose whole text occurs inside one ("short_match"),
and (2) exact duplicates of an earlier kept prompt after normalization ("duplicate"). Publishes

    prompts/part-*.parquet   kept prompts: id, source, prompt, record (the row's other fields as JSON)
    removed/part-*.parquet   removed rows: id, source, where, reason, matched, ngram
    report.json, report.md   counts per source, per reason, per benchmark; short prompts listed

atomically: nothing is visible as complete until the manifest is written, last.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from klear import testsets as shipped_benchmarks
from klear.common import storage
from klear.common.config import load_config
from klear.common.parallel import ordered_map, resolve_workers
from klear.common.records import Chunk, Located, ParquetShardWriter, RecordError, Source, iter_chunks, iter_records, parse_chunk
from klear.curate.config import CurateConfig
from klear.curate.matching import BenchmarkItem, Match, NgramIndex, dedup_key, normalize_batch
from klear.curate.report import render_markdown

log = logging.getLogger("klear.curate")

PROMPT_SCHEMA = pa.schema(
    [("id", pa.string()), ("source", pa.string()), ("prompt", pa.string()), ("record", pa.string())]
)
REMOVED_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("where", pa.string()),
        ("reason", pa.string()),
        ("matched", pa.list_(pa.string())),
        ("ngram", pa.string()),
    ]
)
REASONS = ("duplicate", "contaminated", "short_match", "empty")
ROW_SCHEMA = pa.schema([*PROMPT_SCHEMA, ("where", pa.string())])


# --------------------------------------------------------------------------- reading


def load_benchmark_items(specs: Sequence[str], config: CurateConfig) -> list[BenchmarkItem]:
    items: list[BenchmarkItem] = []
    for spec in specs:
        source = Source.parse(spec)
        text_field = source.field("problem", config.benchmark_field)
        id_field = source.field("id", config.benchmark_id_field)
        for located in iter_records(source):
            text = located.record.get(text_field)
            if not isinstance(text, str):
                raise RecordError(
                    f"{located.where}: benchmark item has no text field {text_field!r} "
                    f"(fields present: {sorted(located.record)})"
                )
            item_id = str(located.record.get(id_field) or located.where)
            benchmark = str(located.record.get("benchmark") or source.name)
            items.append(BenchmarkItem(item_id, benchmark, text))
    return items


def _prompt_fields(located: Located, source: Source, prompt_field: str, id_field: str) -> tuple[str, str, str]:
    """(id, prompt, the row's other fields as JSON) of one source row; a missing or non-text prompt is
    an error naming it."""
    record = located.record
    prompt = record.get(prompt_field)
    if not isinstance(prompt, str):
        if prompt_field not in record:
            raise RecordError(
                f"{located.where}: no prompt field {prompt_field!r} (fields present: {sorted(record)}); "
                f"map it with {source.uri}#prompt=FIELD or --set prompt_field=FIELD"
            )
        raise RecordError(f"{located.where}: field {prompt_field!r} is {type(prompt).__name__}, expected a string")
    raw_id = record.get(id_field)
    row_id = str(raw_id) if raw_id not in (None, "") else f"{source.name}:{located.number}"
    others = orjson.dumps({k: v for k, v in record.items() if k != prompt_field}, default=str).decode()
    return row_id, prompt, others


# --------------------------------------------------------------------------- worker side

_INDEX: NgramIndex | None = None


def _set_index(index: NgramIndex) -> None:
    global _INDEX
    _INDEX = index


@dataclass(frozen=True)
class BatchVerdicts:
    keys: list[bytes]  # dedup key per prompt
    word_counts: list[int]
    matches: list[Match | None]  # n-gram or short-prompt match per prompt


def analyze_batch(index: NgramIndex, texts: Sequence[str]) -> BatchVerdicts:
    """Dedup keys, word counts and contamination matches for a batch of prompt texts."""
    word_lists = normalize_batch(texts)
    counts = pc.list_value_length(word_lists).to_numpy(zero_copy_only=False).tolist()
    joined = pc.binary_join(word_lists, pa.scalar(" ", pa.large_string())).view(pa.large_binary()).to_pylist()
    keys = [dedup_key(text) for text in joined]
    matches = index.match_batch(word_lists)
    for i, count in enumerate(counts):
        if count < index.n:
            matches[i] = index.match_short(word_lists[i].as_py())
    return BatchVerdicts(keys, counts, matches)


@dataclass(frozen=True)
class PreparedBatch:
    """One chunk of one source, parsed and analyzed. Rows travel as an Arrow batch (id, source,
    prompt, record, where): cheap to send between processes and to filter and write."""

    source: str
    rows: pa.RecordBatch
    verdicts: BatchVerdicts


def prepare_chunk(source: Source, chunk: Chunk, prompt_field: str, id_field: str, index: NgramIndex) -> PreparedBatch:
    located = parse_chunk(chunk)
    fields = [_prompt_fields(row, source, prompt_field, id_field) for row in located]
    ids, prompts, records = (list(column) for column in zip(*fields)) if fields else ([], [], [])
    rows = pa.record_batch(
        [ids, [source.name] * len(ids), prompts, records, [row.where for row in located]],
        schema=ROW_SCHEMA,
    )
    return PreparedBatch(source.name, rows, analyze_batch(index, prompts))


def _prepare_in_worker(task: tuple[Source, Chunk, str, str]) -> PreparedBatch:
    assert _INDEX is not None, "worker started without the benchmark index"
    return prepare_chunk(*task, _INDEX)


# --------------------------------------------------------------------------- the stage


class Decider:
    """Turns verdicts into decisions, in input order: removal reason per prompt, first occurrence
    kept among duplicates; keeps the counts and the short-prompt list for the report."""

    def __init__(self, items: Sequence[BenchmarkItem], config: CurateConfig, sources: Sequence[Source]) -> None:
        self.config = config
        self.kept_keys: dict[bytes, str] = {}  # dedup key -> id of the kept prompt
        # Every source appears in the report, even an empty one.
        self.per_source: dict[str, Counter[str]] = {source.name: Counter() for source in sources}
        self.benchmark_of = {item.id: item.benchmark for item in items}
        self.prompts_per_benchmark: Counter[str] = Counter()
        self.items_hit: dict[str, set[str]] = defaultdict(set)
        self.short_listed: list[dict[str, Any]] = []
        self.short_count = 0
        self.short_removed = 0

    def split(self, batch: PreparedBatch) -> tuple[pa.RecordBatch, pa.Table]:
        """The batch's kept rows, and its removed rows with reason, matched ids and n-gram."""
        ids = batch.rows.column("id").to_pylist()
        counts = self.per_source[batch.source]
        verdicts = batch.verdicts
        keep = np.zeros(len(ids), dtype=bool)
        removed_at: list[int] = []
        removal: dict[str, list[Any]] = {"reason": [], "matched": [], "ngram": []}
        for i, row_id in enumerate(ids):
            reason, matched, ngram = self.decide(row_id, batch.source, verdicts.keys[i], verdicts.word_counts[i],
                                                 verdicts.matches[i])
            counts[reason or "kept"] += 1
            if reason is None:
                keep[i] = True
            else:
                removed_at.append(i)
                removal["reason"].append(reason)
                removal["matched"].append(matched)
                removal["ngram"].append(ngram)
        counts["read"] += len(ids)
        removed = pa.Table.from_batches([batch.rows.take(pa.array(removed_at, pa.int64()))])
        for name, values in removal.items():
            field = REMOVED_SCHEMA.field(name)
            removed = removed.append_column(field, pa.array(values, field.type))
        return batch.rows.filter(pa.array(keep)), removed

    def decide(
        self, row_id: str, source: str, key: bytes, word_count: int, match: Match | None
    ) -> tuple[str | None, list[str], str]:
        """The removal reason of one prompt (None = keep), the ids it matched and the shared n-gram."""
        n = self.config.ngram_size
        if word_count == 0:
            return "empty", [], ""
        if word_count < n:
            removed = match is not None and self.config.drop_short_matches
            self.short_count += 1
            if len(self.short_listed) < self.config.report_short_limit:
                self.short_listed.append({"id": row_id, "source": source, "words": word_count, "removed": removed})
            if removed:
                assert match is not None
                self.short_removed += 1
                self._count_match(match)
                return "short_match", list(match.item_ids), match.ngram
        elif match is not None:
            self._count_match(match)
            return "contaminated", list(match.item_ids), match.ngram
        first = self.kept_keys.get(key)
        if first is not None:
            return "duplicate", [first], ""
        self.kept_keys[key] = row_id
        return None, [], ""

    def _count_match(self, match: Match) -> None:
        for benchmark in {self.benchmark_of.get(item, "?") for item in match.item_ids}:
            self.prompts_per_benchmark[benchmark] += 1
        for item in match.item_ids:
            self.items_hit[self.benchmark_of.get(item, "?")].add(item)


def run(
    inputs: Sequence[str], output: str, config: CurateConfig, benchmark_specs: Sequence[str] | None = None
) -> dict[str, Any]:
    """Curate `inputs` against the benchmarks and publish to `output`; returns the report."""
    started = time.monotonic()
    specs = list(benchmark_specs) if benchmark_specs else [str(p) for p in shipped_benchmarks.all_paths()]
    items = load_benchmark_items(specs, config)
    index = NgramIndex(items, n=config.ngram_size)
    log.info("benchmark index: %d items, %d distinct %d-grams", len(items), index.ngram_count, index.n)
    sources = [Source.parse(spec) for spec in inputs]
    workers = resolve_workers(config.workers)
    decider = Decider(items, config, sources)
    tasks = (
        (source, chunk, source.field("prompt", config.prompt_field), source.field("id", config.id_field))
        for source in sources
        for chunk in iter_chunks(source, config.batch_size)
    )
    with tempfile.TemporaryDirectory(prefix="klear-curate-") as staging_dir:
        staging = Path(staging_dir)
        kept = ParquetShardWriter(staging / "prompts", "part", PROMPT_SCHEMA, config.rows_per_shard,
                                  dictionary_columns=("source",))
        removed = ParquetShardWriter(staging / "removed", "part", REMOVED_SCHEMA, config.rows_per_shard,
                                     dictionary_columns=("source", "reason"))
        read, last_log = 0, time.monotonic()
        # This process only moves bytes and decides duplicates; workers parse, normalize and match.
        # Batches come back in input order, so "first occurrence kept" holds for any number of workers.
        for batch in ordered_map(_prepare_in_worker, tasks, workers, initializer=_set_index, initargs=(index,)):
            kept_rows, removed_rows = decider.split(batch)
            kept.write(kept_rows)
            removed.write(removed_rows)
            read += batch.rows.num_rows
            if time.monotonic() - last_log >= config.progress_seconds:
                last_log = time.monotonic()
                log.info("%d prompts read, %d kept, %.0f prompts/s", read, kept.rows, read / (last_log - started))
        kept.close()
        removed.close()
        elapsed = time.monotonic() - started
        report = _report(inputs, specs, items, config, decider, read, kept.rows, elapsed, workers)
        (staging / "report.json").write_text(json.dumps(report, indent=2))
        (staging / "report.md").write_text(render_markdown(report))
        storage.publish_dir(staging, output, meta={"stage": "curate", "kept": kept.rows, "read": read})
    log.info("published %s: %d of %d prompts kept (%.1f s)", output, kept.rows, read, elapsed)
    return report


def _report(
    inputs: Sequence[str],
    benchmark_specs: Sequence[str],
    items: Sequence[BenchmarkItem],
    config: CurateConfig,
    decider: Decider,
    read: int,
    kept: int,
    elapsed: float,
    workers: int,
) -> dict[str, Any]:
    totals = Counter({reason: 0 for reason in REASONS})
    for counts in decider.per_source.values():
        totals.update({reason: counts[reason] for reason in REASONS})
    items_per_benchmark = Counter(item.benchmark for item in items)
    return {
        "stage": "curate",
        "inputs": list(inputs),
        "benchmarks": list(benchmark_specs),
        "empty_input": read == 0,
        "totals": {"read": read, "kept": kept, "removed": read - kept, **dict(totals)},
        "per_source": {
            source: {"read": c["read"], "kept": c["kept"], **{r: c[r] for r in REASONS}}
            for source, c in decider.per_source.items()
        },
        "per_benchmark": {
            name: {
                "items": items_per_benchmark[name],
                "items_matched": len(decider.items_hit.get(name, ())),
                "prompts_removed": decider.prompts_per_benchmark.get(name, 0),
            }
            for name in sorted(items_per_benchmark)
        },
        "short_prompts": {
            "note": f"prompts under {config.ngram_size} words cannot share a {config.ngram_size}-gram; "
            "they are removed only if their whole text occurs inside a benchmark item",
            "count": decider.short_count,
            "removed": decider.short_removed,
            "listed": decider.short_listed,
        },
        "config": config.model_dump(mode="json"),
        "workers": workers,
        "elapsed_s": round(elapsed, 3),
        "prompts_per_s": round(read / elapsed, 1) if elapsed > 0 else None,
    }


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from klear.common.cli import add_config_arguments

    parser = subparsers.add_parser(
        "curate",
        help="exact dedup and n-gram decontamination of prompt sources",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--input", nargs="+", required=True, metavar="URI", help="prompt sources, URI[#prompt=FIELD&id=FIELD&source=NAME]"
    )
    parser.add_argument(
        "--benchmark", nargs="+", default=None, metavar="URI", help="test sets (default: the shipped AIME24/25, HMMT25)"
    )
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    add_config_arguments(parser)
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    config = load_config(CurateConfig, args.config, args.overrides)
    report = run(args.input, args.output, config, args.benchmark)
    print(json.dumps(report["totals"]))
    return 0
