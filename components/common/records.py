"""Record sources and sinks: JSONL files, Parquet files and shards, `datasets.save_to_disk` folders.

A source is named by a URI with an optional field mapping in its fragment, for data whose
fields are named differently from what a stage expects:

    s3://bucket/raw/numina.jsonl#prompt=problem&id=uid&source=numina

A directory is read only if it is a published stage output (its manifest lists the files) or a
Hugging Face `datasets` folder; anything else is refused rather than guessed at.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import storage

__all__ = ["RecordError", "Source", "ParquetShardWriter", "iter_records", "read_records"]

_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_PARQUET_SUFFIXES = (".parquet",)


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

    def field(self, canonical: str) -> str:
        return self.fields.get(canonical, canonical)


def _stem(uri: str) -> str:
    base = uri.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (*_JSONL_SUFFIXES, *_PARQUET_SUFFIXES):
        base = base.removesuffix(suffix)
    return base or "source"


@dataclass(frozen=True)
class Located:
    """One record and where it came from (file:line for JSONL, file:row for tabular data)."""

    where: str
    record: dict[str, Any]
    raw: str | None = None  # the JSONL line as read, when the source is JSONL


def _iter_jsonl(path: Path, origin: str) -> Iterator[Located]:
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise RecordError(f"{origin}:{lineno}: malformed JSON ({exc})") from None
            if not isinstance(record, dict):
                raise RecordError(f"{origin}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield Located(f"{origin}:{lineno}", record, line.decode("utf-8", "replace").rstrip("\r\n"))


def _iter_parquet(path: Path, origin: str, batch_rows: int = 8192) -> Iterator[Located]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RecordError(f"{origin}: not a readable Parquet file ({exc})") from None
    row = 0
    for batch in parquet.iter_batches(batch_size=batch_rows):
        for record in batch.to_pylist():
            row += 1
            yield Located(f"{origin}:row {row}", record)


def _iter_hf_dataset(path: Path, origin: str, split: str | None) -> Iterator[Located]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split is None:
            raise RecordError(f"{origin}: a DatasetDict with splits {list(loaded)}; name one with #split=NAME")
        if split not in loaded:
            raise RecordError(f"{origin}: no split {split!r}; splits: {list(loaded)}")
        loaded = loaded[split]
    for row, record in enumerate(loaded, start=1):
        yield Located(f"{origin}:row {row}", dict(record))


def _iter_file(path: Path, origin: str) -> Iterator[Located]:
    if origin.endswith(_JSONL_SUFFIXES):
        yield from _iter_jsonl(path, origin)
    elif origin.endswith(_PARQUET_SUFFIXES):
        yield from _iter_parquet(path, origin)
    else:
        raise RecordError(f"{origin}: unknown file type; expected one of {_JSONL_SUFFIXES + _PARQUET_SUFFIXES}")


def iter_records(source: Source) -> Iterator[Located]:
    """Stream the records of a source in order, downloading from S3 as needed."""
    uri = storage.Uri.parse(source.uri)
    if storage.is_dir(uri):
        if storage.exists(uri.join(storage.MANIFEST_NAME)):
            with storage.fetch_published(uri) as (local, manifest):
                for rel in sorted(manifest.files):
                    if rel.endswith(_JSONL_SUFFIXES + _PARQUET_SUFFIXES):
                        yield from _iter_file(local / rel, f"{uri.join(rel)}")
            return
        with storage.localize(uri) as local:
            if (local / "dataset_info.json").exists() or (local / "dataset_dict.json").exists():
                yield from _iter_hf_dataset(local, str(uri), source.fields.get("split"))
                return
        raise storage.UnpublishedOutputError(
            f"{uri} is a directory with neither a {storage.MANIFEST_NAME} nor a Hugging Face datasets layout; "
            "name its files one by one, or publish it"
        )
    if not storage.exists(uri):
        raise FileNotFoundError(f"input not found: {uri}")
    with storage.localize(uri) as local:
        yield from _iter_file(local, str(uri))


def read_records(uri: str) -> list[dict[str, Any]]:
    """All records of a (small) source, as dicts."""
    return [located.record for located in iter_records(Source.parse(uri))]


class ParquetShardWriter:
    """Writes rows to `<dir>/<prefix>-00000.parquet`, `-00001`, ... with a fixed schema."""

    def __init__(self, directory: Path, prefix: str, schema: pa.Schema, rows_per_shard: int = 500_000) -> None:
        self.directory = directory
        self.prefix = prefix
        self.schema = schema
        self.rows_per_shard = rows_per_shard
        self.rows = 0
        self.shards: list[Path] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_shard = 0
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, columns: dict[str, list[Any]]) -> None:
        table = pa.table(columns, schema=self.schema)
        offset = 0
        while offset < table.num_rows:
            if self._writer is None or self._rows_in_shard >= self.rows_per_shard:
                self._open_next()
            assert self._writer is not None
            take = min(table.num_rows - offset, self.rows_per_shard - self._rows_in_shard)
            self._writer.write_table(table.slice(offset, take))
            self._rows_in_shard += take
            self.rows += take
            offset += take

    def _open_next(self) -> None:
        if self._writer is not None:
            self._writer.close()
        path = self.directory / f"{self.prefix}-{len(self.shards):05d}.parquet"
        self.shards.append(path)
        self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")
        self._rows_in_shard = 0

    def close(self) -> None:
        if self._writer is None:
            # An empty output is still a valid one: one shard with the schema and no rows.
            self._open_next()
        assert self._writer is not None
        self._writer.close()
        self._writer = None

    def __enter__(self) -> ParquetShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.close()
