"""Record sources and sinks: JSONL files, Parquet files and shards, `datasets.save_to_disk` folders.

A source is named by a URI with an optional field mapping in its fragment, for data whose
fields are named differently from what a stage expects:

    s3://bucket/raw/numina.jsonl#prompt=problem&id=uid&source=numina

A directory is read only if it is a published stage output (its manifest lists the files) or a
Hugging Face `datasets` folder; anything else is refused rather than guessed at.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import storage

__all__ = ["Chunk", "Located", "ParquetShardWriter", "RecordError", "Source", "iter_chunks", "iter_records", "jsonl_chunks",
           "iter_training_records", "parse_chunk", "parse_sources", "primary_data_files", "read_records", "write_records"]

_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_PARQUET_SUFFIXES = (".parquet",)
_PUBLISHED_DATA_SUFFIXES = (".jsonl", ".ndjson", ".parquet")  # not .json: stages publish their reports as .json


class RecordError(ValueError):
    """A record that cannot be read or lacks a field; the message names file, line and field."""


@dataclass(frozen=True)
class Source:
    """A URI plus a mapping from the stage's field names to the source's (e.g. prompt -> problem)."""

    uri: str
    fields: dict[str, str] = field(default_factory=dict)
    name: str = ""

    @classmethod
    def parse(cls, spec: str) -> Source:
        uri, _, fragment = spec.partition("#")
        options = dict(parse_qsl(fragment, keep_blank_values=False, strict_parsing=False)) if fragment else {}
        name = options.pop("source", "") or _stem(uri)
        return cls(uri=uri, fields=options, name=name)

    def field(self, canonical: str, default: str | None = None) -> str:
        """The source's name for a field: its mapping, else `default`, else the canonical name."""
        return self.fields.get(canonical, default or canonical)


def _stem(uri: str) -> str:
    base = uri.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (*_JSONL_SUFFIXES, *_PARQUET_SUFFIXES):
        base = base.removesuffix(suffix)
    return base or "source"


def _path_parts(uri: str) -> list[str]:
    """The folders and stem of a URI's path: s3://b/d1/math.jsonl -> [b, d1, math]."""
    parts = [part for part in uri.split("://", 1)[-1].split("/") if part]
    return [*parts[:-1], _stem(parts[-1])] if parts else ["source"]


def parse_sources(specs: Iterable[str]) -> list[Source]:
    """The sources of several specs, named apart. A name taken from the file (no #source=) that another source
    also has gets parent folders until it differs (d1/math, d2/math), or a number when the URIs are alike:
    a report merging two sources, and their `<name>:<row>` ids colliding, would hide what came from where.
    Names given with #source= are kept: inputs named alike on purpose form one source."""
    specs = list(specs)
    sources = [Source.parse(spec) for spec in specs]
    names = [source.name for source in sources]
    implicit = [i for i, spec in enumerate(specs) if "source" not in dict(parse_qsl(spec.partition("#")[2]))]
    parts = {i: _path_parts(sources[i].uri) for i in implicit}
    depth = dict.fromkeys(implicit, 1)
    while True:
        holders: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            holders.setdefault(name, []).append(i)
        # Folders help only against a source at another path (an explicit name has none to compare).
        growing = [i for i in implicit if depth[i] < len(parts[i])
                   and any(j != i and parts.get(j) != parts[i] for j in holders[names[i]])]
        if not growing:
            break
        for i in growing:
            depth[i] += 1
            names[i] = "/".join(parts[i][-depth[i]:])
    used = {name for i, name in enumerate(names) if i not in depth}
    for i in implicit:  # what parent folders could not tell apart (the same file twice): numbered in input order
        name, number = names[i], 2
        while names[i] in used:
            names[i], number = f"{name} ({number})", number + 1
        used.add(names[i])
    return [replace(source, name=name) for source, name in zip(sources, names)]


class Located(NamedTuple):
    """One record and where it came from (file:line for JSONL, file:row for tabular data)."""

    where: str
    number: int  # line number (JSONL) or row number (tabular), from 1
    record: dict[str, Any]


@dataclass(frozen=True)
class Chunk:
    """Consecutive entries of one file, not parsed yet: JSONL lines (blank ones included, so line
    numbers stay exact) or rows of tabular data. Parsing is left to `parse_chunk`, which may run in
    a worker process: the reader only moves bytes."""

    origin: str
    first: int
    lines: list[bytes] | None = None
    rows: list[dict[str, Any]] | None = None


def parse_chunk(chunk: Chunk) -> list[Located]:
    if chunk.rows is not None:
        return [Located(f"{chunk.origin}:row {chunk.first + i}", chunk.first + i, row) for i, row in enumerate(chunk.rows)]
    out = []
    for i, line in enumerate(chunk.lines or ()):
        lineno = chunk.first + i
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise RecordError(f"{chunk.origin}:{lineno}: malformed JSON ({exc})") from None
        if not isinstance(record, dict):
            raise RecordError(f"{chunk.origin}:{lineno}: expected a JSON object, got {type(record).__name__}")
        out.append(Located(f"{chunk.origin}:{lineno}", lineno, record))
    return out


def jsonl_chunks(path: Path, origin: str, size: int) -> Iterator[Chunk]:
    """A local JSONL file as chunks of `size` lines (for `parse_chunk`, which names file:line in its errors)."""
    with open(path, "rb") as fh:
        first = 1
        while lines := list(itertools.islice(fh, size)):
            yield Chunk(origin, first, lines=lines)
            first += len(lines)


def _parquet_chunks(path: Path, origin: str, size: int) -> Iterator[Chunk]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RecordError(f"{origin}: not a readable Parquet file ({exc})") from None
    first = 1
    for batch in parquet.iter_batches(batch_size=size):
        rows = batch.to_pylist()
        yield Chunk(origin, first, rows=rows)
        first += len(rows)


def _hf_dataset_chunks(path: Path, origin: str, split: str | None, size: int) -> Iterator[Chunk]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split is None:
            raise RecordError(f"{origin}: a DatasetDict with splits {list(loaded)}; name one with #split=NAME")
        if split not in loaded:
            raise RecordError(f"{origin}: no split {split!r}; splits: {list(loaded)}")
        loaded = loaded[split]
    for start in range(0, len(loaded), size):
        columns = loaded[start : start + size]
        names = list(columns)
        rows = [dict(zip(names, values)) for values in zip(*(columns[n] for n in names))]
        yield Chunk(origin, start + 1, rows=rows)


def _file_chunks(path: Path, origin: str, size: int) -> Iterator[Chunk]:
    if origin.endswith(_JSONL_SUFFIXES):
        yield from jsonl_chunks(path, origin, size)
    elif origin.endswith(_PARQUET_SUFFIXES):
        yield from _parquet_chunks(path, origin, size)
    else:
        raise RecordError(f"{origin}: unknown file type; expected one of {_JSONL_SUFFIXES + _PARQUET_SUFFIXES}")


def iter_chunks(source: Source, size: int = 4096) -> Iterator[Chunk]:
    """Stream a source in order as unparsed chunks of up to `size` entries, downloading from S3 as needed."""
    uri = storage.Uri.parse(source.uri)
    if storage.is_dir(uri):
        if storage.exists(uri.join(storage.MANIFEST_NAME)):
            with storage.fetch_published(uri) as (local, manifest):
                for rel in primary_data_files(manifest.files):
                    yield from _file_chunks(local / rel, f"{uri.join(rel)}", size)
            return
        # Decided from the layout's marker files, before localize would download the whole folder.
        if any(storage.exists(uri.join(name)) for name in ("dataset_info.json", "dataset_dict.json")):
            with storage.localize(uri) as local:
                yield from _hf_dataset_chunks(local, str(uri), source.fields.get("split"), size)
            return
        raise storage.UnpublishedOutputError(
            f"{uri} is a directory with neither a {storage.MANIFEST_NAME} nor a Hugging Face datasets layout; "
            "name its files one by one, or publish it"
        )
    if not storage.exists(uri):
        raise FileNotFoundError(f"input not found: {uri}")
    with storage.localize(uri) as local:
        yield from _file_chunks(local, str(uri), size)


def iter_records(source: Source) -> Iterator[Located]:
    """Stream the records of a source in order."""
    for chunk in iter_chunks(source):
        yield from parse_chunk(chunk)


def primary_data_files(files: Iterable[str]) -> list[str]:
    """The files of a published output that are read as its records: curate's kept prompts (prompts/) when
    present -- never its removal lists (removed/) -- else every data file; reports (.json) never. One rule for
    every reader, so that any stage's published output is a valid source of any other."""
    data = sorted(f for f in files if f.endswith(_PUBLISHED_DATA_SUFFIXES))
    prompts = [f for f in data if f.startswith("prompts/")]
    return prompts or data


def _published_data_files(uri: str) -> list[str] | None:
    """For a published stage output, the files a training stage reads (see primary_data_files); None if unpublished."""
    try:
        manifest = storage.read_manifest(uri)
    except storage.UnpublishedOutputError:
        return None
    return primary_data_files(manifest.files)


def iter_training_records(uris: Iterable[str]) -> Iterator[Located]:
    """Every record of the training-data sources, in order: files (with field mappings), or published
    outputs, of which only curate's kept prompts are read when present (not its removal lists)."""
    for uri in uris:
        files = _published_data_files(uri) if storage.is_dir(uri) else None
        if files is None:
            yield from iter_records(Source.parse(uri))
            continue
        with storage.fetch_published(uri) as (local, _):
            for rel in files:
                for located in iter_records(Source(uri=str(local / rel), name=rel)):
                    yield located._replace(where=f"{uri.rstrip('/')}/{located.where.removeprefix(str(local) + '/')}")


def read_records(uri: str) -> list[dict[str, Any]]:
    """All records of a (small) source, as dicts."""
    return [located.record for located in iter_records(Source.parse(uri))]


def write_records(records: Iterable[dict[str, Any]], path: Path) -> Path:
    """Write records to a local file or folder in the format its name says: `.jsonl`, `.parquet`,
    or (any other name) a `datasets.save_to_disk` folder. Publish the parent folder afterwards."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(_JSONL_SUFFIXES):
        with open(path, "wb") as fh:
            for record in records:
                fh.write(orjson.dumps(record) + b"\n")
    elif path.name.endswith(_PARQUET_SUFFIXES):
        pq.write_table(pa.Table.from_pylist(list(records)), path, compression="zstd")
    else:
        import datasets

        datasets.Dataset.from_list(list(records)).save_to_disk(str(path))
    return path


class ParquetShardWriter:
    """Writes rows to `<dir>/<prefix>-00000.parquet`, `-00001`, ... with a fixed schema.

    Rows are buffered into row groups of `row_group_rows` (few large row groups read and compress
    better than many small ones). LZ4: on the hot path of curate it costs a third less CPU than
    zstd, for a larger file. Dictionary encoding only for the columns named in `dictionary_columns`
    (for unique texts it costs time and saves nothing).
    """

    def __init__(
        self,
        directory: Path,
        prefix: str,
        schema: pa.Schema,
        rows_per_shard: int = 500_000,
        row_group_rows: int = 32_768,
        dictionary_columns: tuple[str, ...] = (),
    ) -> None:
        self.directory = directory
        self.prefix = prefix
        self.schema = schema
        self.rows_per_shard = rows_per_shard
        self.row_group_rows = min(row_group_rows, rows_per_shard)
        self.dictionary_columns = list(dictionary_columns)
        self.rows = 0
        self.shards: list[Path] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_shard = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, rows: pa.Table | pa.RecordBatch | dict[str, list[Any]]) -> None:
        if isinstance(rows, dict):
            table = pa.table(rows, schema=self.schema)
        elif isinstance(rows, pa.RecordBatch):
            table = pa.Table.from_batches([rows]).select(self.schema.names).cast(self.schema)
        else:
            table = rows.select(self.schema.names).cast(self.schema)
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        if self._pending_rows >= self.row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        offset = 0
        while offset < table.num_rows:
            if self._writer is None or self._rows_in_shard >= self.rows_per_shard:
                self._open_next()
            assert self._writer is not None
            take = min(table.num_rows - offset, self.rows_per_shard - self._rows_in_shard)
            self._writer.write_table(table.slice(offset, take), row_group_size=self.row_group_rows)
            self._rows_in_shard += take
            offset += take

    def _open_next(self) -> None:
        if self._writer is not None:
            self._writer.close()
        path = self.directory / f"{self.prefix}-{len(self.shards):05d}.parquet"
        self.shards.append(path)
        self._writer = pq.ParquetWriter(
            path, self.schema, compression="lz4", use_dictionary=self.dictionary_columns
        )
        self._rows_in_shard = 0

    def close(self) -> None:
        self._flush()
        if self._writer is None:
            # An empty output is still a valid one: one shard with the schema and no rows.
            self._open_next()
        assert self._writer is not None
        self._writer.close()
        self._writer = None


RECORD = "record"  # curate's column holding the source row; a sample row's `record` holds curate's row in turn
MAX_DEPTH = 4  # sample -> curate row -> original row is 2; more is malformed input, not a reason to loop


def unwrap_record(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The one rule by which every stage reads a wrapped row: `row` with every nested `record` (a JSON object or its
    text) merged in, outer fields winning;
    None when a `record` is there but is not an object (a row that cannot be read, never guessed at)."""
    flat = {k: v for k, v in row.items() if k != RECORD}
    inner: Any = row.get(RECORD)
    for _ in range(MAX_DEPTH):
        if inner is None:
            return flat
        if isinstance(inner, (str, bytes)):
            try:
                inner = json.loads(inner)
            except ValueError:
                return None
        if not isinstance(inner, dict):
            return None
        nested = inner.get(RECORD)
        flat = {**{k: v for k, v in inner.items() if k != RECORD}, **flat}
        inner = nested
    return None if inner is not None else flat
