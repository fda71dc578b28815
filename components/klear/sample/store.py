"""The work area: completed units, in shards, on object storage; what survives a killed pod.

    <work>/settings.json            the settings (and their hash) the shards were sampled under
    <work>/shards/<name>.parquet    completed units, one object per shard, written whole (an S3 PUT is atomic;
                                    locally a temp file renamed into place), so a shard is complete or absent
    <work>/index/<name>.json        the shard's unit keys, written after the shard: a restart reads these
                                    small files, not the responses (a shard without its index is read itself)
    <work>/corrupt/<name>.parquet   a shard that could not be read, set aside (its units are sampled again)
    <work>/index/<writer>*.parquet  the unit keys of the shards one writer wrote: every `compact_every` shards
                                    a segment of those shards (then their per-shard indexes are deleted), and
                                    every `compact_every` segments one index of all it wrote, replacing its
                                    segments; a restart reads a bounded number of objects per writer (at most
                                    1 + 2 x (compact_every - 1)), not one per shard (~94K GETs at 24M units)

Names are `<writer>-<seq>`, the writer being a start time and a random tag: two pods writing at once (a
retry while the old pod still runs) never overwrite each other, and when both completed a unit the shard
whose name sorts first is kept. Only complete units are ever written: failures stay out of shards, so
nothing that failed can be taken for done. What a scan returns is Arrow columns, not a Python object per
unit: a work area may hold tens of millions.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import secrets
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from klear.common import storage
from klear.common.sample_rows import MESSAGES_TYPE, SAMPLE_SCHEMA
from klear.common.slices import refuse_foreign_work, slice_folder, work_file_pattern
from klear.sample.backends.base import Completion
from klear.sample.reasoning import render

SCHEMA = SAMPLE_SCHEMA  # the sample-row contract every later stage reads them by
FAILED_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("sample", pa.int32()),
    ("error_kind", pa.string()),
    ("error", pa.string()),
    ("attempts", pa.int16()),
    ("seed", pa.int64()),
    ("where", pa.string()),
])
# A slice's failed units carry their prompt hash: the merge counts only those of the prompts sampled now.
SLICE_FAILED_SCHEMA = FAILED_SCHEMA.append(pa.field("prompt_hash", pa.string()))
_KEY_COLUMNS = ["id", "sample", "prompt_hash"]
# A writer's index: the keys of its shards, by shard name and row.
WRITER_INDEX_SCHEMA = pa.schema([("shard", pa.string()), ("row", pa.int32()), ("id", pa.string()),
                                 ("sample", pa.int32()), ("prompt_hash", pa.string())])
# How one is held in memory: names dictionary-coded, a few bytes per unit (an id and hash repeat n times).
_NAME = pa.dictionary(pa.int32(), pa.string())
_HELD_INDEX_SCHEMA = pa.schema([("shard", _NAME), ("row", pa.int32()), ("id", _NAME), ("sample", pa.int32()),
                                ("prompt_hash", _NAME)])
# What a scan returns: every unit key the shards hold, with its shard (number in name order) and row.
KEYS_SCHEMA = pa.schema([("id", _NAME), ("sample", pa.int32()), ("prompt_hash", _NAME), ("shard", pa.int32()),
                         ("row", pa.int32())])
COMPACT_EVERY = 64  # shards between rewrites of a writer's index


log = logging.getLogger("klear.sample")

CORRUPT = "corrupt"  # shards that could not be read, kept for a look, out of every scan


class CorruptShardError(RuntimeError):
    """A shard of the work area could not be read: it was set aside and its units will be sampled again."""


class ResumeMismatchError(ValueError):
    """Units already sampled under other settings: mixing them would make a meaningless dataset."""


def new_writer_name() -> str:
    return f"{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


def completion_row(completion: Completion) -> dict[str, Any]:
    request, parsed = completion.request, completion.parsed
    assert parsed is not None, "failed units are never written to shards"
    return {
        "id": request.prompt.id, "sample": request.sample, "prompt": request.prompt.text,
        "response": render(parsed), "reasoning": parsed.reasoning, "final": parsed.final,
        "finish_reason": completion.finish_reason, "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens, "model": completion.model,
        "source": request.prompt.source, "record": request.prompt.record, "seed": request.seed,
        "attempts": completion.attempts, "prompt_hash": request.prompt.hash,
        "messages": list(request.prompt.messages),
    }


def current_rows(table: pa.Table) -> pa.Table:
    """Sample rows of a shard or published part as SCHEMA holds them now, also those written before a change of
    it: a column they lack is null, their `answer` (the final text, before the rename: `klear sample` never wrote
    a gold answer) is `final`, their `messages` as JSON text the list of turns."""
    names = table.column_names
    if "final" not in names and "answer" in names:
        table = table.rename_columns(["final" if n == "answer" else n for n in names])
    if "messages" in table.column_names and not pa.types.is_list(table.schema.field("messages").type):
        turns = [None if text is None else orjson.loads(text) for text in table.column("messages").to_pylist()]
        table = table.set_column(table.column_names.index("messages"), "messages", pa.array(turns, MESSAGES_TYPE))
    for name in SCHEMA.names:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, SCHEMA.field(name).type))
    return table.select(SCHEMA.names).cast(SCHEMA)


def failed_row(completion: Completion) -> dict[str, Any]:
    request = completion.request
    return {"id": request.prompt.id, "sample": request.sample, "error_kind": completion.error_kind,
            "error": completion.error, "attempts": completion.attempts, "seed": request.seed,
            "where": request.prompt.where}


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


@dataclass
class Scan:
    """What the work area holds: the unit keys of every shard (`keys`, KEYS_SCHEMA; shards numbered in name order,
    the first by name wins a unit two writers completed)."""

    shards: list[str] = field(default_factory=list)
    keys: pa.Table = field(default_factory=KEYS_SCHEMA.empty_table)
    repaired: int = 0  # shards whose index was missing (a kill between the two writes)
    objects: int = 0  # index objects (and shards) read

    @property
    def done(self) -> dict[tuple[str, int], tuple[str, str]]:
        """(id, sample) -> (prompt hash, shard name): Python objects per unit, for tests and small callers."""
        found: dict[tuple[str, int], tuple[str, str]] = {}
        order = np.lexsort((np.asarray(self.keys.column("row")), np.asarray(self.keys.column("shard"))))
        columns = [self.keys.column(c).to_pylist() for c in ("id", "sample", "prompt_hash", "shard")]
        for i in order.tolist():
            found.setdefault((columns[0][i], columns[1][i]), (columns[2][i], self.shards[columns[3][i]]))
        return found

    @property
    def duplicates(self) -> int:
        """Units held by more than one shard (concurrent writers)."""
        if self.keys.num_rows == 0:
            return 0
        plain = pa.table({"id": self.keys.column("id").cast(pa.string()), "sample": self.keys.column("sample")})
        return self.keys.num_rows - plain.group_by(["id", "sample"]).aggregate([]).num_rows

    def hashes(self) -> dict[tuple[str, int], str]:
        return {key: value[0] for key, value in self.done.items()}


class WorkArea:
    def __init__(self, uri: str | storage.Uri, compact_every: int = COMPACT_EVERY) -> None:
        self.uri = storage.Uri.parse(uri)
        self.writer = new_writer_name()
        self.compact_every = compact_every
        self._seq = 0
        self._written: list[pa.Table] = []  # this writer's index rows (Arrow, _HELD_INDEX_SCHEMA)
        self._uncompacted: list[str] = []  # its shards indexed only by their own index
        self._segments: list[str] = []  # its segment indexes since its last whole index

    def __str__(self) -> str:
        return str(self.uri)

    # ----------------------------------------------------------------------- settings

    def read_settings(self) -> dict[str, Any] | None:
        try:
            return orjson.loads(storage.read_bytes(self.uri.join("settings.json")))
        except FileNotFoundError:
            return None

    def write_settings(self, settings: dict[str, Any]) -> None:
        storage.write_bytes(self.uri.join("settings.json"), orjson.dumps(settings, option=orjson.OPT_INDENT_2))

    # ----------------------------------------------------------------------- slices

    def slice_uri(self, index: int, count: int) -> storage.Uri:
        """The folder of slice `index` of `count`: its lease (one pod per slice), failed units and report."""
        return slice_folder(self.uri, index, count)

    def write_slice_failed(self, index: int, count: int, rows: Sequence[dict[str, Any]]) -> None:
        table = pa.Table.from_pylist(list(rows), schema=SLICE_FAILED_SCHEMA)
        storage.write_bytes(self.slice_uri(index, count).join("failed.parquet"), table_bytes(table))

    def slice_files(self, name: str) -> list[str]:
        """`slices/<I-of-N>/<name>` of every slice that wrote one (any N: a run may be resliced)."""
        return sorted(rel for rel in storage.list_files(self.uri.join("slices"))
                      if rel.count("/") == 1 and rel.endswith("/" + name))

    def read_slice_failed(self) -> pa.Table:
        """The failed units every slice recorded (the last run of each slice); empty when none."""
        tables = [pq.read_table(pa.BufferReader(storage.read_bytes(self.uri.join("slices", rel))))
                  .cast(SLICE_FAILED_SCHEMA) for rel in self.slice_files("failed.parquet")]
        return pa.concat_tables(tables) if tables else SLICE_FAILED_SCHEMA.empty_table()

    # ----------------------------------------------------------------------- shards

    def write_shard(self, completions: Sequence[Completion], name: str | None = None) -> str:
        """One shard, then its index; returns the shard's name."""
        if name is None:
            name = f"{self.writer}-{self._seq:06d}"
            self._seq += 1
        table = pa.Table.from_pylist([completion_row(c) for c in completions], schema=SCHEMA)
        self.write_table(name, table)
        self._written.append(_writer_index_rows(name, table))
        self._uncompacted.append(name)
        if len(self._uncompacted) >= self.compact_every:
            self.compact()
        return name

    def compact(self, final: bool = False) -> None:
        """Index this writer's shards indexed one by one in one segment, then delete their own indexes; once it has
        `compact_every` segments, write one index of all it wrote and delete the segments (a kill in between
        leaves both: each index lists its shards, so a shard listed twice is still one shard). Each write of all
        keys comes after compact_every^2 shards, so a long writer rewrites its keys a few times, not once per
        segment. `final`: when the writer stops; one of fewer than `compact_every` shards keeps their own."""
        if not self._uncompacted or (final and len(self._written) == len(self._uncompacted)):
            return
        segment = pa.concat_tables(self._written[-len(self._uncompacted):]).combine_chunks()
        self._written[-len(self._uncompacted):] = [segment]
        name = f"{self.writer}.{self._uncompacted[0].rsplit('-', 1)[-1]}"
        storage.write_bytes(self.uri.join("index", f"{name}.parquet"), table_bytes(segment))
        self._delete_indexes([f"{shard}.json" for shard in self._uncompacted])
        self._uncompacted = []
        self._segments.append(name)
        if len(self._segments) >= self.compact_every:
            whole = pa.concat_tables(self._written).combine_chunks()
            self._written = [whole]
            storage.write_bytes(self.uri.join("index", f"{self.writer}.parquet"), table_bytes(whole))
            self._delete_indexes([f"{segment}.parquet" for segment in self._segments])
            self._segments = []

    def _delete_indexes(self, names: Sequence[str]) -> None:
        def delete(name: str) -> None:
            with contextlib.suppress(FileNotFoundError):
                storage.delete(self.uri.join("index", name))

        with ThreadPoolExecutor(max_workers=16) as pool:  # on object storage each is a round trip
            list(pool.map(delete, names))

    def write_table(self, name: str, table: pa.Table) -> None:
        storage.write_bytes(self.uri.join("shards", f"{name}.parquet"), table_bytes(table))
        storage.write_bytes(self.uri.join("index", f"{name}.json"), _index_bytes(table))

    def read_shard(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """A shard's rows (all of its columns: as SCHEMA has them now, `current_rows`); a shard that cannot be read
        (truncated or overwritten on disk) is moved out of the way with its index, so that the next scan no longer
        counts its units as done, and CorruptShardError names it."""
        uri = self.uri.join("shards", f"{name}.parquet")
        data = storage.read_bytes(uri)
        try:
            table = pq.read_table(pa.BufferReader(data), columns=columns)
        except (pa.ArrowInvalid, OSError) as exc:
            self._set_aside(name, data)
            raise CorruptShardError(
                f"{uri}: the shard cannot be read ({exc}); it was moved to {self.uri.join(CORRUPT, f'{name}.parquet')} "
                "and its units count as not done: run the sampling again (the slices, then the merge) to sample "
                "them again; nothing was published") from None
        return current_rows(table) if columns is None else table

    def _set_aside(self, name: str, data: bytes) -> None:
        storage.write_bytes(self.uri.join(CORRUPT, f"{name}.parquet"), data)
        storage.delete(self.uri.join("shards", f"{name}.parquet"))
        with contextlib.suppress(FileNotFoundError):
            storage.delete(self.uri.join("index", f"{name}.json"))

    def shard_names(self) -> list[str]:
        return sorted(_stems(storage.list_files(self.uri.join("shards")), ".parquet"))

    def scan(self, threads: int = 16) -> Scan:
        """Every unit the shards hold, from the writer indexes, then the per-shard indexes of shards no writer
        index covers (the shard itself when its index is missing). The reads go in parallel: on object storage
        each is a round trip. Shards are listed first: a shard listed has its keys in one of those places."""
        shards = self.shard_names()
        listed = storage.list_files(self.uri.join("index"))
        indexed = set(_stems(listed, ".json"))
        with ThreadPoolExecutor(max_workers=threads) as pool:
            # Fetched in parallel, decoded here: decoding in many threads leaves each thread's allocator holding
            # memory that the process keeps as resident.
            writers = [_held_index(data) for data in pool.map(self._fetch_writer_index, _stems(listed, ".parquet"))]
            covered: set[str] = set()
            for table in writers:
                for chunk in table.column("shard").chunks:
                    covered.update(chunk.dictionary.take(pc.unique(chunk.indices)).to_pylist())
            rest = [name for name in shards if name not in covered]
            loose = list(pool.map(lambda name: self._shard_keys(name, name in indexed), rest))
        scan = Scan(shards=shards, repaired=sum(repaired for _, repaired in loose), objects=len(writers) + len(rest))
        numbers = pa.array(shards, pa.string())
        pieces = []
        for table in [*writers, *(keys for keys, _ in loose)]:
            number = _shard_numbers(table.column("shard"), numbers)  # null: a shard deleted since
            table = table.set_column(0, "shard", number)
            if number.null_count:
                table = table.filter(pc.is_valid(number))
            pieces.append(table.select(KEYS_SCHEMA.names))  # no copies: tens of millions of keys at paper scale
        scan.keys = pa.concat_tables(pieces) if pieces else KEYS_SCHEMA.empty_table()
        return scan

    def _fetch_writer_index(self, stem: str) -> bytes | None:
        try:
            return storage.read_bytes(self.uri.join("index", f"{stem}.parquet"))
        except FileNotFoundError:  # a segment merged into its writer's index since: its shards are read below
            return None

    def _shard_keys(self, name: str, indexed: bool) -> tuple[pa.Table, bool]:
        """One shard's keys (_HELD_INDEX_SCHEMA) and whether its index had to be rebuilt."""
        if indexed:
            try:
                keys = orjson.loads(storage.read_bytes(self.uri.join("index", f"{name}.json")))
                table = pa.table({c: keys[c] for c in _KEY_COLUMNS})
                return _writer_index_rows(name, table), False
            except FileNotFoundError:  # covered by its writer's index since it was listed: read the shard
                return _writer_index_rows(name, self.read_shard(name, _KEY_COLUMNS)), False
        try:
            table = self.read_shard(name, _KEY_COLUMNS)
        except CorruptShardError as exc:  # set aside: its units are sampled again
            log.warning("%s", exc)
            return _held_index(None), False
        storage.write_bytes(self.uri.join("index", f"{name}.json"), _index_bytes(table))
        return _writer_index_rows(name, table), True

    def iter_tables(self, names: Sequence[str]) -> Iterator[tuple[str, pa.Table]]:
        for name in names:
            yield name, self.read_shard(name)

    def check_own(self) -> None:
        """Refuse a work area holding files that are not a sample work area's (a data folder given as --work, or
        a judge's work area, say)."""
        refuse_foreign_work(self.uri, is_work_file, "sample")

    def delete_all(self) -> None:
        """Delete the work area's own files, then the folder if nothing else is left in it."""
        storage.delete_files(self.uri, is_work_file)


# What a work area holds: its settings, shards and their indexes, the report and failed units of a run that
# failed, each slice's lease, failed units and report, and the hidden temp files of an interrupted local write.
_WORK_FILE = work_file_pattern(r"settings\.json|report\.json|report\.md|shards/[^/]+\.parquet|index/[^/]+\.(json|parquet)"
                               r"|failed/[^/]+\.parquet|corrupt/[^/]+\.parquet|slices/[0-9]+-of-[0-9]+/(_LEASE\.json|failed\.parquet|report\.json)")


def is_work_file(rel: str) -> bool:
    return _WORK_FILE.fullmatch(rel) is not None


def _writer_index_rows(name: str, table: pa.Table) -> pa.Table:
    """A shard's keys as a writer index holds them (_HELD_INDEX_SCHEMA; written out, they read as WRITER_INDEX_SCHEMA)."""
    rows = table.num_rows
    shard = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array([name], pa.string()))
    id_, sample, digest = (table.column(c).cast(WRITER_INDEX_SCHEMA.field(c).type) for c in _KEY_COLUMNS)
    return pa.table([shard, pa.array(np.arange(rows, dtype=np.int32)), pc.dictionary_encode(id_), sample,
                     pc.dictionary_encode(digest)], schema=_HELD_INDEX_SCHEMA)


def _held_index(data: bytes | None) -> pa.Table:
    """A writer index's bytes as _HELD_INDEX_SCHEMA (empty for None): names read as dictionaries, since a shard name
    per row would cost more than the rest of the key."""
    if data is None:
        return _HELD_INDEX_SCHEMA.empty_table()
    return pq.read_table(pa.BufferReader(data), read_dictionary=["shard", "id", "prompt_hash"],
                         use_threads=False).cast(_HELD_INDEX_SCHEMA)


def _shard_numbers(shard: pa.ChunkedArray, numbers: pa.Array) -> pa.ChunkedArray:
    """The number in `numbers` of each row's shard name (null where absent), looked up once per distinct name."""
    chunks = [pc.index_in(chunk.dictionary, value_set=numbers).take(chunk.indices).cast(pa.int32())
              for chunk in shard.chunks]
    return pa.chunked_array(chunks, pa.int32())


def _index_bytes(table: pa.Table) -> bytes:
    return orjson.dumps({column: table.column(column).to_pylist() for column in _KEY_COLUMNS})


def _stems(names: Sequence[str], suffix: str) -> list[str]:
    # Temp files of an interrupted local write start with a dot: never a shard.
    return [n[: -len(suffix)] for n in names if n.endswith(suffix) and "/" not in n and not n.startswith(".")]
