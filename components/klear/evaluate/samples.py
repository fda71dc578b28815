"""Saved generations: which model (label) each source belongs to, what settings made them, which rows are scored.

A source is a published `klear sample` (or `klear judge`) output, or a Parquet/JSONL file of sample rows (`id`,
`sample`, `response`, `finish_reason`, optionally `completion_tokens`). Several sources may share a label (a
model's math samples and its code samples). Rows are read twice from one local copy: first only their keys,
to choose the first k samples of each problem by sample index (and fail before any judging if a problem has
fewer), then the chosen rows, a batch at a time.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klear.common.records import RecordError
from klear.common.sample_rows import SampleKeys, file_tables, local_sample_files

__all__ = ["SampleError", "SampleSource", "LocalSource", "open_source", "parse_sample_specs", "read_keys",
           "read_rows"]

LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
DEFAULT_LABEL = "model"
READ_COLUMNS = ("id", "sample", "response", "finish_reason", "completion_tokens")


class SampleError(RecordError):
    """Sample rows that cannot be scored: missing columns, duplicates, too few samples; names what is wrong."""


@dataclass(frozen=True)
class SampleSource:
    label: str
    uri: str


def parse_sample_specs(specs: Sequence[str], default_label: str = DEFAULT_LABEL) -> list[SampleSource]:
    """`LABEL=URI` or `URI` (label `default_label`). A `=` counts as a label only when what precedes it is a
    plain name, so `s3://b/x.jsonl#id=qid` stays a URI."""
    out = []
    for spec in specs:
        head, sep, rest = spec.partition("=")
        if sep and LABEL.match(head) and rest:
            out.append(SampleSource(head, rest))
        elif sep and ("/" not in head and ":" not in head) and not rest:
            raise ValueError(f"--samples {spec!r}: no URI after the label")
        else:
            out.append(SampleSource(default_label, spec))
    return out


@dataclass
class LocalSource:
    """A source's data files on local disk, and what its manifest says about how they were made."""

    source: SampleSource
    files: list[tuple[str, Path]]  # (origin for messages, local path)
    stage: str | None = None  # the publishing stage (sample, judge), None for a plain file
    settings: dict[str, Any] | None = None  # the sample stage's recorded settings (identity, sampling)
    meta: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def open_source(source: SampleSource) -> Iterator[LocalSource]:
    """The source's data files, downloaded once (a published output: only the files its manifest lists)."""
    with local_sample_files(source.uri) as (files, manifest):
        if not files:
            raise SampleError(f"{source.uri}: a published output without sample rows (no samples/ or judged/ files)")
        meta = dict(manifest.meta) if manifest else {}
        settings = meta.get("settings") if isinstance(meta.get("settings"), dict) else None
        yield LocalSource(source, files, meta.get("stage"), settings, meta)


def read_keys(local: LocalSource, batch_rows: int = 65536) -> Iterator[tuple[str, int, str]]:
    """(id, sample index, origin) of every row, reading only those two columns of Parquet files; the reader
    refuses a key twice in the source (naming both rows), `select_samples` a key in two sources of a label."""
    keys = SampleKeys()
    for origin, path in local.files:
        for table in file_tables(path, origin, batch_rows, ("id", "sample"), keys):
            for pid, index in zip(table.column("id").to_pylist(), table.column("sample").to_pylist()):
                yield pid, index, origin


def read_rows(local: LocalSource, wanted: Mapping[tuple[str, int], Any], batch_rows: int,
              extra: Sequence[str] = ()) -> Iterator[list[dict[str, Any]]]:
    """Batches of the rows whose (id, sample) is in `wanted`, with the columns scoring needs (and `extra` ones)."""
    for origin, path in local.files:
        for table in file_tables(path, origin, batch_rows, (*READ_COLUMNS, *extra)):
            rows = [row for row in table.to_pylist() if (str(row["id"]), int(row["sample"])) in wanted]
            if rows:
                yield rows
