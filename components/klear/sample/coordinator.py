"""Sampling in one process: the backend chosen and started, the pending units handed to it as requests (made
as it takes them) and its completions written to shards as they come; then what the shards hold matched against
the run's units (choose) and written as the output's samples/, in prompt order (write_in_order)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib.util
import logging
import os
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from klear.common import storage
from klear.common.records import ParquetShardWriter
from klear.sample.backends.base import Backend, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.progress import Progress
from klear.sample.settings import check_settings, published_state, run_settings
from klear.sample.store import SCHEMA, Scan, WorkArea
from klear.sample.units import Plan, Prompt, canonical_hash, first_copies, unit_seed

log = logging.getLogger("klear.sample")


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
            began = time.perf_counter()
            progress.add(completion)
            (buffer if completion.ok else failed).append(completion)
            if not completion.ok:
                log.warning("%s#%d failed after %d attempts: %s: %s", completion.request.prompt.id,
                            completion.request.sample, completion.attempts, completion.error_kind,
                            completion.error[:300])
            if len(buffer) >= config.shard_size or (buffer and time.monotonic() - last_flush >= config.flush_seconds):
                area.write_shard(buffer)
                buffer, last_flush = [], time.monotonic()
            progress.own_work_s += time.perf_counter() - began
    finally:
        began = time.perf_counter()
        if buffer:
            area.write_shard(buffer)
        area.compact(final=True)  # one index object for everything this writer wrote
        progress.own_work_s += time.perf_counter() - began
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
    positions = np.empty(keys.num_rows, np.int64)  # filled in place: no list of pieces beside their concatenation
    start = 0
    for batch in keys.to_batches(LOCATE_ROWS):
        positions[start:start + batch.num_rows] = plan.locate(_decoded(batch.column("id")), batch.column("sample"),
                                                              _decoded(batch.column("prompt_hash")))
        start += batch.num_rows
    shard, row = np.asarray(keys.column("shard"), np.int32), np.asarray(keys.column("row"), np.int32)
    kept = first_copies(positions, shard)
    pa.default_memory_pool().release_unused()  # the keys' temporaries: back to the system, not held as RSS
    dropped, duplicates = keys.num_rows - len(kept), int(np.count_nonzero(positions >= 0)) - len(kept)
    # Every key kept, in the order read (one writer after another): the arrays as they are, no copies.
    if len(kept) < len(positions) or np.any(kept[1:] <= kept[:-1]):
        positions, shard, row = positions[kept], shard[kept], row[kept]
    del kept
    return Chosen(plan, scan.shards, positions, shard, row, dropped=dropped, duplicates=duplicates)


def release_freed_memory() -> None:
    """Give the memory the scan and choose freed back to the system before sampling or writing: glibc keeps freed
    heap chunks resident, so what comes next would pile on top of them instead of reusing them (malloc_trim;
    elsewhere than glibc, Arrow's pool only)."""
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


LARGE_ALLOCATION = 1 << 20  # bytes from which an allocation is mapped on its own (M_MMAP_THRESHOLD)
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


def map_large_allocations(threshold: int = LARGE_ALLOCATION) -> bool:
    """Map every allocation of `threshold` bytes or more on its own, so that freeing it hands it back at once.

    glibc's default threshold moves: once a large array has been freed, arrays of up to 32 MiB go on the heap,
    where a freed one stays resident until it is trimmed and the next, of another size, is put beside it. Which
    arrays land on the heap then depends on the order earlier ones were freed, so the same restart peaked 85 to
    171 B/unit from run to run (2.4M units, benchmarks/bench_sample_scale.py); with the threshold fixed, 78 to
    83. Setting it also stops the moving (mallopt(3)). Returns whether it was set (glibc only)."""
    return _LIBC is not None and _LIBC.mallopt(_M_MMAP_THRESHOLD, threshold) == 1


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 - both present: glibc
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


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
    # Positions ascend: each bucket's count from its bounds, without a temporary per unit.
    expected = np.diff(np.searchsorted(positions, np.arange(buckets + 1, dtype=np.int64) * bucket_rows))
    seen = np.zeros(buckets, np.int64)
    by_shard, numbers, starts = _by_shard(chosen.shard)
    ends = np.append(starts[1:], len(chosen.shard))

    def rows_of(k: int) -> slice | np.ndarray:  # the indexes (in `chosen`) of shard k's kept rows
        return slice(int(starts[k]), int(ends[k])) if by_shard is None else by_shard[starts[k]:ends[k]]
    held: dict[int, list[pa.Table]] = {}
    held_bytes: dict[int, int] = {}
    spilled: dict[int, list[Path]] = {}
    spill_schema = SCHEMA.append(pa.field(_POSITION, pa.int64()))

    def load(k: int) -> pa.Table:
        rows = rows_of(k)
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
    read_order = np.argsort(positions[starts if by_shard is None else by_shard[starts]], kind="stable").tolist()
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


def _by_shard(shard: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """The kept copies grouped by shard: (the order that groups them, None when they already are; each group's
    shard number; where each group starts in that order). Within a group, still in position order."""
    if len(shard) == 0:
        return None, np.zeros(0, np.int32), np.zeros(0, np.int64)
    steps = np.diff(shard)
    if not np.any(steps < 0):  # one writer after another (a run, then its restarts): no sort, no index per unit
        starts = np.concatenate([np.zeros(1, np.int64), np.flatnonzero(steps) + 1])
        return None, shard[starts], starts
    del steps
    order = np.argsort(shard, kind="stable")
    numbers, starts = np.unique(shard[order], return_index=True)
    return order, numbers, starts


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


PENDING_CHUNK = 1 << 18  # pending positions turned into (prompt, sample) at once


class PendingRequests(Sequence[Request]):
    """The requests of the pending units, in output order, each made when the backend takes it: two int32 per
    unit until then, not a Python object (a slice of a paper-scale run has millions pending)."""

    def __init__(self, items: Sequence[Prompt], plan: Plan, pending: np.ndarray, seed: int | None) -> None:
        self._items, self._seed = items, seed
        self._prompt, self._sample = np.empty(len(pending), np.int32), np.empty(len(pending), np.int32)
        for start in range(0, len(pending), PENDING_CHUNK):  # the int64 temporaries stay a fixed size
            prompt, sample = plan.units(pending[start:start + PENDING_CHUNK])
            self._prompt[start:start + len(prompt)], self._sample[start:start + len(sample)] = prompt, sample
        self._last: tuple[int, Prompt] | None = None  # a prompt's samples are taken one after another

    def __len__(self) -> int:
        return len(self._prompt)

    def _make(self, i: int, j: int) -> Request:
        last = self._last  # one read: other threads may replace it
        if last is None or last[0] != i:
            last = self._last = (i, self._items[i])
        prompt = last[1]
        return Request(prompt, j, None if self._seed is None else unit_seed(self._seed, prompt.id, j))

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


def make_requests(items: Sequence[Prompt], plan: Plan, pending: np.ndarray, seed: int | None) -> PendingRequests:
    """The requests of the pending positions of `plan` (over `items`), in output order; each seeded from `seed`
    (units.unit_seed), or unseeded when it is None."""
    return PendingRequests(items, plan, pending, seed)
