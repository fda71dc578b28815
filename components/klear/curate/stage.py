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
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import orjson
import pyarrow as pa

from klear import testsets as shipped_benchmarks
from klear.common.data_stage import DataStage
from klear.common.parallel import ordered_map, read_ahead, resolve_workers
from klear.common.records import (
    Chunk,
    Located,
    ParquetShardWriter,
    RecordError,
    Source,
    iter_chunks,
    iter_records,
    parse_chunk,
    parse_sources,
)
from klear.curate.arrays import bool_array, int64_array, text_array, text_list_array
from klear.curate.config import CurateConfig
from klear.curate.matching import BenchmarkItem, Match, NgramIndex, PackedTexts, dedup_key, pack_normalized
from klear.curate.report import render_markdown

log = logging.getLogger("klear.curate")
STAGE = DataStage("curate", CurateConfig, render_markdown)

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
_CURATED_FIELDS = set(PROMPT_SCHEMA.names)  # the fields of a row of curate's output


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


def _curated_record(record: dict[str, Any], prompt_field: str) -> str | None:
    """The original row's JSON when `record` is a row of curate's own output (id, source, prompt, record),
    so that curating a curated output keeps the source rows as they were instead of wrapping them again."""
    if prompt_field != "prompt" or record.keys() != _CURATED_FIELDS or not isinstance(record["record"], str):
        return None
    try:
        return record["record"] if isinstance(orjson.loads(record["record"]), dict) else None
    except orjson.JSONDecodeError:
        return None


def _prompt_fields(
    located: Located, source: Source, prompt_field: str, id_field: str, row_number: int | None = None
) -> tuple[str, str, str]:
    """(id, prompt, the row's other fields as JSON) of one source row; a missing or non-text prompt is
    an error naming it. A row without an id gets `<source>:<row_number>` (default: its line or row)."""
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
    row_number = located.number if row_number is None else row_number
    row_id = str(raw_id) if raw_id not in (None, "") else f"{source.name}:{row_number}"
    others = _curated_record(record, prompt_field)
    if others is None:
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


def analyze_packed(index: NgramIndex, packed: PackedTexts) -> BatchVerdicts:
    """Dedup keys, word counts and contamination matches of a batch of normalized prompts."""
    data = memoryview(packed.data)
    keys = [dedup_key(data[a:b]) for a, b in zip(packed.text_starts.tolist(), packed.text_ends.tolist())]
    return BatchVerdicts(keys, packed.word_counts().tolist(), index.match_packed(packed))


@dataclass(frozen=True)
class ParsedBatch:
    """One chunk of one source, parsed and normalized: its rows as an Arrow batch (id, source, prompt, record,
    where) and its prompts' normalized forms."""

    source: str
    rows: pa.RecordBatch
    packed: PackedTexts


@dataclass(frozen=True)
class PreparedBatch:
    """One chunk of one source, parsed and analyzed. Rows travel as an Arrow batch (id, source,
    prompt, record, where): cheap to send between processes and to filter and write."""

    source: str
    rows: pa.RecordBatch
    verdicts: BatchVerdicts


def read_chunk(source: Source, chunk: Chunk, prompt_field: str, id_field: str,
               first_row: int | None = None) -> ParsedBatch:
    """`first_row`: the number, within the whole source, of the chunk's first entry (default: its number in
    its file), so that rows of a source spanning several files get distinct `<source>:<row>` ids."""
    shift = 0 if first_row is None else first_row - chunk.first
    if chunk.lines is not None:
        ids, prompts, records, wheres = _jsonl_fields(source, chunk, prompt_field, id_field, shift)
    else:
        located = parse_chunk(chunk)
        fields = [_prompt_fields(row, source, prompt_field, id_field, row.number + shift) for row in located]
        ids, prompts, records = (list(column) for column in zip(*fields)) if fields else ([], [], [])
        wheres = [row.where for row in located]
    encoded = [prompt.encode() for prompt in prompts]
    columns: list[Sequence[str | bytes]] = [ids, [source.name] * len(ids), encoded, records, wheres]
    rows = pa.RecordBatch.from_arrays([text_array(column) for column in columns], schema=ROW_SCHEMA)
    return ParsedBatch(source.name, rows, pack_normalized(prompts, encoded))


def prepare_chunk(source: Source, chunk: Chunk, prompt_field: str, id_field: str, index: NgramIndex,
                  first_row: int | None = None) -> PreparedBatch:
    parsed = read_chunk(source, chunk, prompt_field, id_field, first_row)
    return PreparedBatch(parsed.source, parsed.rows, analyze_packed(index, parsed.packed))


def _jsonl_fields(source: Source, chunk: Chunk, prompt_field: str, id_field: str,
                  shift: int) -> tuple[list[str], list[str], list[str], list[str]]:
    """(ids, prompts, other fields as JSON, file:line) of a chunk of JSONL lines: what parse_chunk and _prompt_fields
    give, in one loop for the common row (a text prompt, an id, a row that is not curate's own output); any other
    row, and every error, goes through them."""
    ids: list[str] = []
    prompts: list[str] = []
    records: list[str] = []
    wheres: list[str] = []
    plain_fields = prompt_field != "prompt"  # rows of curate's own output have a "prompt" field (_curated_record)
    origin = chunk.origin
    for number, line in enumerate(chunk.lines or (), start=chunk.first):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = None
        prompt = record.get(prompt_field) if type(record) is dict else None
        raw_id = record.get(id_field) if type(record) is dict else None
        if type(prompt) is not str or type(raw_id) is not str or not raw_id or not (plain_fields or "record" not in record):
            for located in parse_chunk(Chunk(origin, number, lines=[line])):  # blank: none; malformed: the error
                row_id, prompt, others = _prompt_fields(located, source, prompt_field, id_field, number + shift)
                ids.append(row_id)
                prompts.append(prompt)
                records.append(others)
                wheres.append(located.where)
            continue
        assert type(record) is dict
        del record[prompt_field]
        ids.append(raw_id)
        prompts.append(prompt)
        records.append(orjson.dumps(record, default=str).decode())
        wheres.append(f"{origin}:{number}")
    return ids, prompts, records, wheres


def _prepare_in_worker(task: tuple[Source, Chunk, str, str, int]) -> PreparedBatch:
    assert _INDEX is not None, "worker started without the benchmark index"
    source, chunk, prompt_field, id_field, first_row = task
    return prepare_chunk(source, chunk, prompt_field, id_field, _INDEX, first_row)


def _tasks(sources: Sequence[Source], config: CurateConfig) -> Iterator[tuple[Source, Chunk, str, str, int]]:
    """The chunks of every source in order, each with the number of its first entry within its source: rows
    are numbered on across the files of a published folder and across inputs given one name (#source=)."""
    entries_before: Counter[str] = Counter()
    for source in sources:
        fields = source.field("prompt", config.prompt_field), source.field("id", config.id_field)
        for chunk in iter_chunks(source, config.batch_size):
            yield source, chunk, *fields, entries_before[source.name] + 1
            # Blank JSONL lines count, so that a single file's rows keep their line numbers.
            entries_before[source.name] += len(chunk.lines if chunk.lines is not None else chunk.rows or ())


# --------------------------------------------------------------------------- the stage


class Decision(NamedTuple):
    reason: str | None  # None: kept
    matched: list[str]  # benchmark items (contaminated, short_match) or the kept prompt (duplicate)
    ngram: str
    id: str  # the prompt's id in the output: its own, or qualified when an earlier kept prompt has it


class Decider:
    """Turns verdicts into decisions, in input order: removal reason per prompt, first occurrence
    kept among duplicates; keeps the counts and the short-prompt list for the report."""

    def __init__(self, items: Sequence[BenchmarkItem], config: CurateConfig, sources: Sequence[Source]) -> None:
        self.config = config
        self.kept_keys: dict[bytes, str] = {}  # dedup key -> id of the kept prompt
        self.kept_ids: set[str] = set()
        self.ids_qualified = 0  # kept prompts whose id an earlier kept prompt had
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
        out_ids = list(ids)  # ids as published: a kept prompt may get a qualified one
        n = self.config.ngram_size
        kept_keys, kept_ids = self.kept_keys, self.kept_ids
        kept_count = duplicates = 0
        for i, (row_id, key, word_count, match) in enumerate(zip(ids, verdicts.keys, verdicts.word_counts,
                                                                  verdicts.matches)):
            if match is None and word_count >= n:  # the common row, as `decide` would take it, inline
                first = kept_keys.get(key)
                if first is None and row_id not in kept_ids:
                    kept_keys[key] = row_id
                    kept_ids.add(row_id)
                    keep[i] = True
                    kept_count += 1
                    continue
                if first is not None:
                    duplicates += 1
                    removed_at.append(i)
                    removal["reason"].append("duplicate")
                    removal["matched"].append([first])
                    removal["ngram"].append("")
                    continue
            decision = self.decide(row_id, batch.source, key, word_count, match)
            counts[decision.reason or "kept"] += 1
            if decision.reason is None:
                keep[i] = True
                out_ids[i] = decision.id
            else:
                removed_at.append(i)
                removal["reason"].append(decision.reason)
                removal["matched"].append(decision.matched)
                removal["ngram"].append(decision.ngram)
        counts["kept"] += kept_count
        counts["duplicate"] += duplicates
        counts["read"] += len(ids)
        removed = pa.Table.from_batches([batch.rows.take(int64_array(removed_at))])
        for name, values in removal.items():
            field = REMOVED_SCHEMA.field(name)
            removed = removed.append_column(field, text_list_array(values) if name == "matched" else text_array(values))
        rows = batch.rows
        if out_ids != ids:
            rows = rows.set_column(0, PROMPT_SCHEMA.field("id"), text_array(out_ids))
        return rows.filter(bool_array(keep)), removed

    def decide(self, row_id: str, source: str, key: bytes, word_count: int, match: Match | None) -> Decision:
        """The removal reason of one prompt (None = keep), the ids it matched and the shared n-gram."""
        n = self.config.ngram_size
        if word_count == 0:
            return Decision("empty", [], "", row_id)
        if word_count < n:
            removed = match is not None and self.config.drop_short_matches
            self.short_count += 1
            if len(self.short_listed) < self.config.report_short_limit:
                self.short_listed.append({"id": row_id, "source": source, "words": word_count, "removed": removed})
            if removed:
                assert match is not None
                self.short_removed += 1
                self._count_match(match)
                return Decision("short_match", list(match.item_ids), match.ngram, row_id)
        elif match is not None:
            self._count_match(match)
            return Decision("contaminated", list(match.item_ids), match.ngram, row_id)
        first = self.kept_keys.get(key)
        if first is not None:
            return Decision("duplicate", [first], "", row_id)
        kept_id = self._claim_id(row_id, source)
        self.kept_keys[key] = kept_id
        return Decision(None, [], "", kept_id)

    def _claim_id(self, row_id: str, source: str) -> str:
        """`row_id`, or `<source>:<row_id>` (then `#2`, `#3`, ...) when an earlier kept prompt has it: later stages
        key their work by prompt id, so two kept prompts must never share one (sources often both count from 0)."""
        kept_id = row_id
        if kept_id in self.kept_ids:
            self.ids_qualified += 1
            kept_id, number = f"{source}:{row_id}", 2
            while kept_id in self.kept_ids:
                kept_id, number = f"{source}:{row_id}#{number}", number + 1
        self.kept_ids.add(kept_id)
        return kept_id

    def _count_match(self, match: Match) -> None:
        for benchmark in {self.benchmark_of.get(item, "?") for item in match.item_ids}:
            self.prompts_per_benchmark[benchmark] += 1
        for item in match.item_ids:
            self.items_hit[self.benchmark_of.get(item, "?")].add(item)


def curate_workers(requested: int, cores: int) -> int:
    """Worker processes for `requested` (0: one per core but one). This process reads, decides duplicates and
    writes, about a quarter of the work, and every prompt crosses a pipe to a worker and back: on 2 cores one
    process is faster than two workers beside it (benchmarks/bench_curate.py), so 0 leaves a core to this process,
    and 1 means no worker process at all. Without workers, this process still uses a second core: a thread reads,
    parses and normalizes the next chunk while the main thread matches and decides, and numpy, Arrow and Parquet,
    which release the GIL, run beside the Python work."""
    return requested if requested > 0 else max(1, cores - 1)


def _write(kept: ParquetShardWriter, kept_rows: pa.RecordBatch, removed: ParquetShardWriter,
           removed_rows: pa.Table) -> None:
    kept.write(kept_rows)
    removed.write(removed_rows)


def run(
    inputs: Sequence[str], output: str, config: CurateConfig, benchmark_specs: Sequence[str] | None = None
) -> dict[str, Any]:
    """Curate `inputs` against the benchmarks and publish to `output`; returns the report."""
    started = time.monotonic()
    specs = list(benchmark_specs) if benchmark_specs else [str(p) for p in shipped_benchmarks.all_paths()]
    checked = STAGE.check(output, {"input": inputs, "benchmark": specs}, config=config)  # fails now, not after the work
    items = load_benchmark_items(specs, config)
    index = NgramIndex(items, n=config.ngram_size)
    log.info("benchmark index: %d items, %d distinct %d-grams", len(items), index.ngram_count, index.n)
    sources = parse_sources(inputs)  # distinct names: d1/math.jsonl and d2/math.jsonl are d1/math and d2/math
    workers = curate_workers(config.workers, resolve_workers(0))
    decider = Decider(items, config, sources)
    tasks = _tasks(sources, config)
    # Held from here to the manifest: a second run on the same output fails now (OutputBusyError).
    with checked.open() as out:
        staging = out.staging
        kept = ParquetShardWriter(staging / "prompts", "part", PROMPT_SCHEMA, config.rows_per_shard,
                                  dictionary_columns=("source",))
        removed = ParquetShardWriter(staging / "removed", "part", REMOVED_SCHEMA, config.rows_per_shard,
                                     dictionary_columns=("source", "reason"))
        read, last_log = 0, time.monotonic()
        # Batches come back in input order, so "first occurrence kept" holds for any number of workers.
        if workers > 1:  # workers parse, normalize and match; this process moves bytes and decides duplicates
            batches = ordered_map(_prepare_in_worker, tasks, workers, initializer=_set_index, initargs=(index,))
        else:  # one process: a thread reads, parses and normalizes the next chunk while this one matches and decides
            parsed = read_ahead((read_chunk(*task) for task in tasks), depth=1)
            batches = (PreparedBatch(rows.source, rows.rows, analyze_packed(index, rows.packed)) for rows in parsed)
        # Parquet encoding releases the GIL: a writer thread takes it off this one, one batch behind at most.
        with ThreadPoolExecutor(1, thread_name_prefix="curate-write") as writer:
            writing: deque[Future[None]] = deque()
            for batch in batches:
                kept_rows, removed_rows = decider.split(batch)
                writing.append(writer.submit(_write, kept, kept_rows, removed, removed_rows))
                if len(writing) > 1:
                    writing.popleft().result()
                read += batch.rows.num_rows
                if time.monotonic() - last_log >= config.progress_seconds:
                    last_log = time.monotonic()
                    log.info("%d prompts read, %d kept, %.0f prompts/s", read, kept.rows, read / (last_log - started))
            for written in writing:
                written.result()
        kept.close()
        removed.close()
        elapsed = time.monotonic() - started
        report = _report(inputs, specs, items, config, decider, read, kept.rows, elapsed, workers)
        out.publish(report, {"kept": kept.rows, "read": read})
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
        # Kept prompts whose id an earlier kept prompt already had: published as <source>:<id>.
        "ids_qualified": decider.ids_qualified,
        "config": config.model_dump(mode="json"),
        "workers": workers,
        "elapsed_s": round(elapsed, 3),
        "prompts_per_s": round(read / elapsed, 1) if elapsed > 0 else None,
    }


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "curate",
        help="exact dedup and n-gram decontamination of prompt sources",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--input", nargs="+", action="extend", required=True, metavar="URI",
        help="prompt sources, URI[#prompt=FIELD&id=FIELD&source=NAME]; repeat the flag or list several",
    )
    parser.add_argument(
        "--benchmark", nargs="+", action="extend", default=None, metavar="URI",
        help="test sets (default: the shipped AIME24/25, HMMT25); repeat the flag or list several",
    )
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    STAGE.add_main(parser, lambda args, config: run(args.input, args.output, config, args.benchmark),
                   lambda report: report["totals"])
