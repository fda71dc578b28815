"""The sample-row contract: what a row of `klear sample` holds, and the one reader every later stage uses.

A sample row answers one unit, (id, sample): the prompt `id` and the sample index. `klear sample` writes them
with SAMPLE_SCHEMA; `klear judge` passes them through and adds its judgement columns; a user may also give a
Parquet or JSONL file of such rows. Every reader of sample rows (judge, sft-data, rl-filter, evaluate) goes
through `file_tables` / `iter_sample_tables`, which

  - checks the fields of the contract (FIELDS): `id`, `sample` and `response` are required; each field has a
    type and a range (a bool or a float is not a sample index; a negative count is not a count);
  - refuses a second row for an (id, sample) already read from the same source: which response would count?
  - names the file and line (JSONL) or Parquet row, and the field, in every error;
  - casts the contract's columns to SAMPLE_SCHEMA's types, so batches of one source agree.

Other columns (the judge's, a user's) pass through unchecked.

A row's `final` is the text after the thinking (the model's answer), never the gold answer a problem row calls
`answer`. `messages` is the conversation the model answered as a list of {role, content} turns (MESSAGES_TYPE,
the one encoding: sft-data's records hold the same type). Rows written before these names read as before: a
`messages` held as JSON text is read into the list (a text that is not a JSON list of turns is refused, naming
the row), and a row with `answer` but no `final` has its `answer` taken for the final text only where
`response_parts` finds it is the response's (a user's gold `answer` is not).

The contract also holds the rules the stages share about what a row says:

  - the prompt of a source row (`prompt_text`): the first non-blank string of PROMPT_FIELDS, in the order
    `klear sample` looks (its default prompt field is `prompt`);
  - the response's normal form, `<think>\n{reasoning}\n</think>\n\n{final}` (klear.common.chat: the think
    tags, `render_response`, `split_response`: thinking ends at the last `</think>`), and its parts as the row
    gives them (`response_parts`: its response split, or its columns for a reasoning cut short).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from klear.common import storage
from klear.common.chat import ResponseParts, render_response, split_response
from klear.common.records import RecordError, jsonl_chunks, parse_chunk

__all__ = ["DATA_SUFFIXES", "FIELDS", "KEY", "MESSAGES_TYPE", "MESSAGE_TYPE", "PROMPT_FIELDS", "REQUIRED",
           "SAMPLE_SCHEMA", "SampleInputError", "SampleKeys", "file_tables", "is_turns", "iter_sample_tables",
           "local_sample_files", "messages_from_json", "prompt_text", "published_sample_files", "response_parts"]

# One turn of a conversation, and a conversation: how every stage's `messages` column is typed.
MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
MESSAGES_TYPE = pa.list_(MESSAGE_TYPE)

# The rows `klear sample` writes (its shards and its published samples/ files).
SAMPLE_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("sample", pa.int32()),
    ("prompt", pa.string()),
    ("response", pa.string()),
    ("reasoning", pa.string()),
    ("final", pa.string()),  # the text after the thinking (the model's answer; `answer` before the rename)
    ("finish_reason", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("completion_tokens", pa.int32()),
    ("model", pa.string()),
    ("source", pa.string()),
    ("record", pa.string()),
    ("seed", pa.int64()),
    ("attempts", pa.int16()),
    ("prompt_hash", pa.string()),
    # The conversation the model answered (system prompt and earlier turns included), so an SFT record is that
    # conversation plus the response, never the last turn alone.
    ("messages", MESSAGES_TYPE),
])
KEY = ("id", "sample")
REQUIRED = ("id", "sample", "response")
# Folders of a published output that hold sample rows, in order of preference: judged rows, then raw samples.
SAMPLE_FOLDERS = ("judged", "samples")
DATA_SUFFIXES = (".parquet", ".jsonl", ".ndjson")
# Where a source row (curate's, a dataset's, a benchmark's) holds its prompt, in the order they are tried.
PROMPT_FIELDS = ("prompt", "problem", "question")


class SampleInputError(RecordError):
    """Sample rows that cannot be read: missing or ill-typed fields, duplicates, none at all, unreadable files;
    names the input (file and line or row) and the field."""


@dataclass(frozen=True)
class Field:
    """One field of the contract: its column type, whether a row must have it (non-null), and its kind:
    text (a string), id (a non-empty string), count (an integer from 0 to the type's maximum), json (the
    prompt's source row: a JSON object or its text) or messages (a list of {role, content} strings; its JSON
    text in rows written before)."""

    name: str
    kind: str
    required: bool = False
    type: pa.DataType = field(init=False)
    maximum: int = field(init=False)  # of a count: the largest its (signed) column type holds

    def __post_init__(self) -> None:
        kind = SAMPLE_SCHEMA.field(self.name).type
        object.__setattr__(self, "type", kind)
        object.__setattr__(self, "maximum", 2 ** (kind.bit_width - 1) - 1 if pa.types.is_integer(kind) else 0)

    @property
    def expected(self) -> str:
        what = (f"an integer from 0 to {self.maximum}" if self.kind == "count" else
                {"id": "a non-empty string", "text": "a string", "json": "a JSON object or its text",
                 "messages": "a list of {role, content} strings or its JSON text"}[self.kind])
        return what if self.required else f"{what} or null"

    def fits(self, value: Any) -> bool:
        """Whether a JSON value meets the contract (JSONL rows; Parquet columns are checked as a whole)."""
        if value is None:
            return not self.required
        if self.kind == "count":
            return type(value) is int and 0 <= value <= self.maximum  # a bool is an int to isinstance
        if self.kind == "json":
            return isinstance(value, (str, dict))
        if self.kind == "messages":
            return is_turns(value) or isinstance(value, str) and messages_from_json(value) is not None
        return isinstance(value, str) and (self.kind != "id" or value != "")


FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("id", "id", True), Field("sample", "count", True), Field("response", "text", True),
    Field("prompt", "text"), Field("reasoning", "text"), Field("final", "text"), Field("finish_reason", "text"),
    Field("prompt_tokens", "count"), Field("completion_tokens", "count"), Field("model", "text"),
    Field("source", "text"), Field("record", "json"), Field("seed", "count"), Field("attempts", "count"),
    Field("prompt_hash", "text"), Field("messages", "messages"),
)}


def is_turns(value: Any) -> bool:
    """Whether a value is a conversation: a list of {role, content} strings (other keys of a turn are dropped)."""
    return isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("content"), str) for t in value)


def messages_from_json(text: str) -> list[dict[str, Any]] | None:
    """The turns of a `messages` held as JSON text (rows written before it was a list); None when the text is not
    a JSON list of {role, content} strings."""
    try:
        turns = json.loads(text)
    except ValueError:
        return None
    return turns if is_turns(turns) else None


def _show(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


class SampleKeys:
    """The (id, sample) keys read so far from one source, and where each was read first."""

    def __init__(self) -> None:
        self._first: dict[tuple[str, int], int] = {}  # key -> place number << 40 | line or row number
        self._places: dict[str, int] = {}

    def add(self, place: str, ids: Sequence[str], samples: Sequence[int], numbers: Sequence[int]) -> None:
        """Record one batch; `place` + number is where a row is (`file.jsonl:` + line, `file.parquet:row ` + row).
        A key read before is a SampleInputError naming both places."""
        tag = self._places.setdefault(place, len(self._places))
        for pid, index, number in zip(ids, samples, numbers):
            earlier = self._first.setdefault((pid, index), tag << 40 | number)
            if earlier != tag << 40 | number:
                first_place = next(p for p, t in self._places.items() if t == earlier >> 40)
                raise SampleInputError(
                    f"{place}{number}: sample {index} of problem {pid!r} appears twice (first at "
                    f"{first_place}{earlier & ((1 << 40) - 1)}); a source holds one response per (id, sample)")

    def __len__(self) -> int:
        return len(self._first)


# --------------------------------------------------------------------------- what a row says


def prompt_text(row: Mapping[str, Any]) -> str | None:
    """The prompt of a source row: its first PROMPT_FIELDS value that is a non-blank string; None without one."""
    return next((row[f] for f in PROMPT_FIELDS if isinstance(row.get(f), str) and row[f].strip()), None)


def response_parts(row: Mapping[str, Any]) -> ResponseParts:
    """The parts of a sample row's response: its response split by the contract's rule (split_response), except
    where its `reasoning` and `final` columns say what the text cannot: a reasoning cut short that names
    `</think>` (`klear sample` writes all three from one parse, and a server may say that its reasoning never
    ended). A row without `final` (written before the rename) gives its `answer` instead. A column that disagrees
    with the response (a user's `answer` holding the gold answer) is not taken for it: the response is what later
    stages train on and judge."""
    response = row.get("response")
    text = response if isinstance(response, str) else ""
    reasoning, final = row.get("reasoning"), row.get("final")
    if final is None:
        final = row.get("answer")
    if isinstance(reasoning, str) and final == "":
        cut = ResponseParts(reasoning, "", False)
        if render_response(cut) == text:
            return cut
    return split_response(text)


# --------------------------------------------------------------------------- JSONL


def _jsonl_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    """The row checked against FIELDS; a source row given as an object becomes its JSON text, and `messages` given
    as JSON text (rows written before it was a list) its list of turns."""
    if missing := [c for c in REQUIRED if c not in row]:
        raise SampleInputError(f"{where}: sample row lacks {missing} (fields: {sorted(row)[:12]})")
    for name, value in row.items():
        spec = FIELDS.get(name)
        if spec is not None and not spec.fits(value):
            raise SampleInputError(f"{where}: field {name!r}: expected {spec.expected}, got {_show(value)}")
    if isinstance(row.get("record"), dict):
        row = {**row, "record": json.dumps(row["record"], ensure_ascii=False)}
    if isinstance(row.get("messages"), str):
        row = {**row, "messages": messages_from_json(row["messages"])}
    return row


def _column(name: str, values: list[Any], wheres: list[str]) -> pa.Array:
    spec = FIELDS.get(name)
    if spec is not None:  # checked already: the conversion cannot fail
        return pa.array(values, spec.type)
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, OverflowError) as exc:
        first = next((v for v in values if v is not None), None)
        for value, where in zip(values, wheres):  # the first row whose value does not go with the first one's
            try:
                pa.array([first, value])
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, OverflowError):
                raise SampleInputError(f"{where}: field {name!r}: {_show(value)} does not fit the column's other "
                                       f"values (such as {_show(first)})") from None
        raise SampleInputError(f"{wheres[0]} to {wheres[-1]}: field {name!r}: values of mixed types ({exc})") from None


def _jsonl_tables(path: Path, origin: str, batch_rows: int, columns: Sequence[str] | None,
                  keys: SampleKeys | None) -> Iterator[pa.Table]:
    for chunk in jsonl_chunks(path, origin, batch_rows):
        located = parse_chunk(chunk)  # malformed JSON and non-objects: RecordError naming file:line
        if not located:
            continue
        rows = [_jsonl_row(item.record, item.where) for item in located]
        if keys is not None:
            keys.add(f"{origin}:", [r["id"] for r in rows], [r["sample"] for r in rows], [i.number for i in located])
        names = list(columns) if columns is not None else list(dict.fromkeys(n for r in rows for n in r))
        wheres = [item.where for item in located]
        yield pa.table({name: _column(name, [r.get(name) for r in rows], wheres) for name in names})


# --------------------------------------------------------------------------- Parquet


def _type_fits(spec: Field, kind: pa.DataType) -> bool:
    if pa.types.is_null(kind):
        return True
    if spec.kind == "count":
        return pa.types.is_integer(kind)
    if spec.kind == "json" and pa.types.is_struct(kind):
        return True
    if spec.kind == "messages" and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        turn = kind.value_type
        return pa.types.is_struct(turn) and all(
            turn.get_field_index(name) >= 0 and _is_text(turn.field(name).type) for name in ("role", "content"))
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return _is_text(kind)


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)


def _out_of_range(column: pa.ChunkedArray, maximum: int) -> pa.ChunkedArray | None:
    """Where an integer column lies outside 0..maximum (None: its type cannot); compared in the column's type,
    as compute would cast a Python int to int64 and fail on uint64 columns."""
    kind = column.type
    signed = pa.types.is_signed_integer(kind)
    masks = [pc.less(column, pa.scalar(0, kind))] if signed else []
    if 2 ** (kind.bit_width - signed) - 1 > maximum:
        masks.append(pc.greater(column, pa.scalar(maximum, kind)))
    if not masks:
        return None
    return masks[0] if len(masks) == 1 else pc.or_(masks[0], masks[1])


def _bad_type(path: Path, origin: str, spec: Field, kind: pa.DataType) -> SampleInputError:
    """A column of the wrong type, with its first value that shows it (a NaN or a fraction, if any)."""
    column = pq.read_table(path, columns=[spec.name]).column(0)
    row = 0
    if pa.types.is_floating(kind) and len(column):
        flags = pc.or_kleene(pc.is_nan(column), pc.not_equal(column, pc.floor(column)))
        row = _first(flags) or 0
    value = f" (row {row + 1} holds {_show(column[row].as_py())})" if len(column) else ""
    return SampleInputError(f"{origin}: field {spec.name!r} is a column of {kind}{value}; expected {spec.expected}")


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    found = pc.index(mask, True).as_py()
    return None if found < 0 else found


def _parquet_column(spec: Field, column: pa.ChunkedArray, origin: str, first_row: int) -> pa.ChunkedArray:
    """The column checked (nulls, ranges, empty ids) and cast to SAMPLE_SCHEMA's type."""
    def refuse(i: int) -> SampleInputError:
        return SampleInputError(f"{origin}:row {first_row + i}: field {spec.name!r}: expected {spec.expected}, "
                                f"got {_show(column[i].as_py())}")

    if spec.required and (i := _first(pc.is_null(column))) is not None:
        raise refuse(i)
    if pa.types.is_struct(column.type):
        return column
    if spec.kind == "messages":
        return _messages_column(column, refuse)
    if spec.kind == "count" and not pa.types.is_null(column.type):
        outside = _out_of_range(column, spec.maximum)
        if outside is not None and (i := _first(outside)) is not None:
            raise refuse(i)
    column = column.cast(spec.type)
    if spec.kind == "id" and (i := _first(pc.equal(pc.utf8_length(column), 0))) is not None:
        raise refuse(i)
    return column


def _messages_column(column: pa.ChunkedArray, refuse: Callable[[int], SampleInputError]) -> pa.ChunkedArray:
    """A `messages` column as MESSAGES_TYPE: a list column whose every turn has a role and a content, or JSON text
    (written before it was a list), each value a JSON list of turns; `refuse(i)` names the first that is not."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        turns = []
        for i, text in enumerate(column.to_pylist()):  # old rows only: one batch of Python values at a time
            turns.append(None if text is None else messages_from_json(text))
            if text is not None and turns[-1] is None:
                raise refuse(i)
        return pa.chunked_array([pa.array(turns, MESSAGES_TYPE)])
    row = 0
    for chunk in column.chunks:
        flat = chunk.flatten()  # the turns of the chunk's rows, in order
        holes = pc.or_kleene(pc.is_null(flat), pc.or_kleene(pc.is_null(pc.struct_field(flat, "role")),
                                                            pc.is_null(pc.struct_field(flat, "content"))))
        if (hole := _first(holes)) is not None:
            raise refuse(row + pc.list_parent_indices(chunk)[hole].as_py())
        row += len(chunk)
    return column.cast(MESSAGES_TYPE)  # a turn's other fields (a user's reasoning_content, say) are dropped


def _parquet_tables(path: Path, origin: str, batch_rows: int, columns: Sequence[str] | None,
                    keys: SampleKeys | None) -> Iterator[pa.Table]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SampleInputError(f"{origin}: not a readable Parquet file ({exc})") from None
    schema = parquet.schema_arrow
    if missing := [c for c in REQUIRED if c not in schema.names]:
        raise SampleInputError(f"{origin}: sample rows lack {missing} (columns present: {schema.names})")
    wanted = schema.names if columns is None else [*(KEY if keys is not None else ()), *columns]
    chosen = [c for c in dict.fromkeys(wanted) if c in schema.names]
    for name in chosen:
        spec = FIELDS.get(name)
        if spec is not None and not _type_fits(spec, schema.field(name).type):
            raise _bad_type(path, origin, spec, schema.field(name).type)
    first_row = 1
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=chosen):
        table = pa.Table.from_batches([batch])
        for i, name in enumerate(table.column_names):
            if (spec := FIELDS.get(name)) is not None:
                checked = _parquet_column(spec, table.column(i), origin, first_row)
                table = table.set_column(i, pa.field(name, checked.type), checked)
        if keys is not None:
            keys.add(f"{origin}:row ", table.column("id").to_pylist(), table.column("sample").to_pylist(),
                     range(first_row, first_row + table.num_rows))
        first_row += table.num_rows
        yield table


# --------------------------------------------------------------------------- sources


def file_tables(path: Path, origin: str, batch_rows: int, columns: Sequence[str] | None = None,
                keys: SampleKeys | None = None) -> Iterator[pa.Table]:
    """Tables of up to `batch_rows` sample rows of one local Parquet or JSONL file, checked against the contract
    (a JSONL row whole, a Parquet file in the columns read). `columns` keeps only those, and a Parquet file then
    reads only them (and the key, when `keys` is given); `keys` refuses an (id, sample) read before from the
    same source. Errors name `origin`, the file's URI, with the line or row."""
    read = _parquet_tables if origin.endswith(".parquet") else _jsonl_tables
    yield from read(path, origin, batch_rows, columns, keys)


def published_sample_files(files: Sequence[str]) -> list[str]:
    """The data files of a published output that hold its sample rows (its manifest's file list)."""
    data = sorted(f for f in files if f.endswith(DATA_SUFFIXES))
    for folder in SAMPLE_FOLDERS:
        chosen = [f for f in data if f.startswith(folder + "/")]
        if chosen:
            return chosen
    return [f for f in data if "/" not in f]  # loose data files at the top, never another stage's side tables


@contextlib.contextmanager
def local_sample_files(uri: str) -> Iterator[tuple[list[tuple[str, Path]], storage.Manifest | None]]:
    """A sample source's data files on local disk as (origin URI, path), and its manifest (None for a plain file):
    a published output's judged/ or samples/ files, fetched once (an unpublished folder is refused by name), or
    one Parquet / JSONL file."""
    loc = storage.Uri.parse(uri)
    if storage.is_dir(loc):
        with storage.fetch_published(loc) as (local, manifest):
            yield [(str(loc.join(rel)), local / rel) for rel in published_sample_files(list(manifest.files))], manifest
        return
    if not storage.exists(loc):
        raise FileNotFoundError(f"samples not found: {loc}")
    if not str(loc).endswith(DATA_SUFFIXES):
        raise SampleInputError(f"{loc}: unknown file type; expected a published output, .parquet or .jsonl")
    with storage.localize(loc) as path:
        yield [(str(loc), path)], None


def iter_sample_tables(uri: str, batch_rows: int = 2048, columns: Sequence[str] | None = None
                       ) -> Iterator[tuple[str, pa.Table]]:
    """(origin, table of up to `batch_rows` rows) over a sample source (see `local_sample_files`), every row
    checked against the contract and no (id, sample) twice in the source. A published output's files are fetched
    one at a time (storage.iter_published): the reader's disk holds one part, not the output (a teacher's samples
    are tens of GB)."""
    keys = SampleKeys()
    loc = storage.Uri.parse(uri)
    if storage.is_dir(loc):
        manifest = storage.read_manifest(loc)
        for rel, path in storage.iter_published(loc, manifest, published_sample_files(list(manifest.files))):
            origin = str(loc.join(rel))
            yield from ((origin, table) for table in file_tables(path, origin, batch_rows, columns, keys))
        return
    with local_sample_files(uri) as (files, _):
        for origin, path in files:
            yield from ((origin, table) for table in file_tables(path, origin, batch_rows, columns, keys))
