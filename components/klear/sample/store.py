"""The work area: completed units, in shards, on object storage; what survives a killed pod.

    <work>/settings.json            the settings (and their hash) the shards were sampled under
    <work>/shards/<name>.parquet    completed units, one object per shard, written whole (an S3 PUT is atomic;
                                    locally a temp file renamed into place), so a shard is complete or absent
    <work>/index/<name>.json        the shard's unit keys, written after the shard: a restart reads these
                                    small files, not the responses (a shard without its index is read itself)

Names are `<writer>-<seq>`, the writer being a start time and a random tag: two pods writing at once (a
retry while the old pod still runs) never overwrite each other, and when both completed a unit the shard
whose name sorts first is kept. Only complete units are ever written: failures stay out of shards, so
nothing that failed can be taken for done.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import secrets
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import storage
from klear.common.sample_rows import SAMPLE_SCHEMA
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


class ResumeMismatchError(ValueError):
    """Units already sampled under other settings: mixing them would make a meaningless dataset."""


def new_writer_name() -> str:
    return f"{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


def completion_row(completion: Completion) -> dict[str, Any]:
    request, parsed = completion.request, completion.parsed
    assert parsed is not None, "failed units are never written to shards"
    return {
        "id": request.prompt.id, "sample": request.sample, "prompt": request.prompt.text,
        "response": render(parsed), "reasoning": parsed.reasoning, "answer": parsed.answer,
        "finish_reason": completion.finish_reason, "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens, "model": completion.model,
        "source": request.prompt.source, "record": request.prompt.record, "seed": request.seed,
        "attempts": completion.attempts, "prompt_hash": request.prompt.hash,
        "messages": orjson.dumps(list(request.prompt.messages)).decode(),
    }


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
    """What the work area holds: unit (id, sample) -> (prompt hash, shard name), first shard by name wins."""

    done: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)
    duplicates: int = 0  # units held by more than one shard (concurrent writers)
    repaired: int = 0  # shards whose index was missing (a kill between the two writes)

    def hashes(self) -> dict[tuple[str, int], str]:
        return {key: value[0] for key, value in self.done.items()}


class WorkArea:
    def __init__(self, uri: str | storage.Uri) -> None:
        self.uri = storage.Uri.parse(uri)
        self.writer = new_writer_name()
        self._seq = 0

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
        return self.uri.join("slices", f"{index}-of-{count}")

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
        return name

    def write_table(self, name: str, table: pa.Table) -> None:
        storage.write_bytes(self.uri.join("shards", f"{name}.parquet"), table_bytes(table))
        storage.write_bytes(self.uri.join("index", f"{name}.json"), _index_bytes(table))

    def read_shard(self, name: str, columns: list[str] | None = None) -> pa.Table:
        data = storage.read_bytes(self.uri.join("shards", f"{name}.parquet"))
        return pq.read_table(pa.BufferReader(data), columns=columns)

    def shard_names(self) -> list[str]:
        return sorted(_stems(storage.list_files(self.uri.join("shards")), ".parquet"))

    def scan(self, threads: int = 16) -> Scan:
        """Every unit the shards hold, from the indexes (the shard itself when its index is missing). The small
        reads go in parallel: on object storage each is a round trip."""
        scan = Scan(shards=self.shard_names())
        indexed = set(_stems(storage.list_files(self.uri.join("index")), ".json"))
        with ThreadPoolExecutor(max_workers=threads) as pool:
            keys = list(pool.map(lambda name: self._keys(name, name in indexed), scan.shards))
        for name, (ids, samples, hashes, repaired) in zip(scan.shards, keys):
            scan.repaired += repaired
            for key, digest in zip(zip(ids, samples), hashes):
                if key in scan.done:
                    scan.duplicates += 1
                else:
                    scan.done[key] = (digest, name)
        return scan

    def _keys(self, name: str, indexed: bool) -> tuple[list[str], list[int], list[str], bool]:
        if indexed:
            keys = orjson.loads(storage.read_bytes(self.uri.join("index", f"{name}.json")))
            return keys["id"], keys["sample"], keys["prompt_hash"], False
        table = self.read_shard(name, _KEY_COLUMNS)
        storage.write_bytes(self.uri.join("index", f"{name}.json"), _index_bytes(table))
        ids, samples, hashes = (table.column(c).to_pylist() for c in _KEY_COLUMNS)
        return ids, samples, hashes, True

    def iter_tables(self, names: Sequence[str]) -> Iterator[tuple[str, pa.Table]]:
        for name in names:
            yield name, self.read_shard(name)

    def foreign_files(self) -> list[str]:
        """Files in the work area that a work area never holds: someone else's, never to be deleted or read."""
        return [rel for rel in storage.list_files(self.uri) if not is_work_file(rel)]

    def check_own(self) -> None:
        """Refuse a work area holding files that are not a work area's (a data folder given as --work, say)."""
        foreign = self.foreign_files()
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise storage.InvalidOutputError(
                f"--work {self.uri} holds {len(foreign)} files that are not a sample work area's ({shown}); the "
                "work area is deleted when done (keep_work=false): choose an empty location or another stage's own")

    def delete_all(self) -> None:
        """Delete the work area's own files, then the folder if nothing else is left in it."""
        for rel in storage.list_files(self.uri):
            if is_work_file(rel):
                storage.delete(self.uri.join(rel))
        if not self.uri.is_s3:  # local folders outlive their files; remove the emptied ones only
            root = Path(self.uri.path)
            for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()


# What a work area holds: its settings, shards and their indexes, the report and failed units of a run that
# failed, each slice's lease, failed units and report, and the hidden temp files of an interrupted local write.
_WORK_FILE = re.compile(r"(settings\.json|report\.json|report\.md|shards/[^/]+\.parquet|index/[^/]+\.json"
                        r"|failed/[^/]+\.parquet|slices/[0-9]+-of-[0-9]+/(_LEASE\.json|failed\.parquet|report\.json)"
                        r"|(.+/)?\.[^/]+)")


def is_work_file(rel: str) -> bool:
    return _WORK_FILE.fullmatch(rel) is not None


def _index_bytes(table: pa.Table) -> bytes:
    return orjson.dumps({column: table.column(column).to_pylist() for column in _KEY_COLUMNS})


def _stems(names: Sequence[str], suffix: str) -> list[str]:
    # Temp files of an interrupted local write start with a dot: never a shard.
    return [n[: -len(suffix)] for n in names if n.endswith(suffix) and "/" not in n and not n.startswith(".")]
