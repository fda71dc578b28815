"""Prompts and work units: what is sampled, under which settings, and what is still missing.

A work unit is (prompt id, sample index). It is done when a published shard holds it with the same prompt
hash, under the same settings hash. The prompt hash covers the whole input row and the chat sent: a change of
anything a later stage reads (the reference `answer`, `tests`, a shipped trace) under a kept id samples the
prompt's units anew instead of mixing rows of the old record with rows of the new. Everything here is pure:
the stage reads and writes, these functions decide.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from klear.common.records import Located, RecordError, Source
from klear.common.slices import parse_slice as parse_slice  # shared with judging: one slice rule everywhere
from klear.common.slices import slice_of as slice_of


class DuplicatePromptError(RecordError):
    """Two input rows share a prompt id: which one's samples would a unit be?"""


@dataclass(frozen=True, slots=True)  # slots: a paper-scale run holds millions of prompts
class Prompt:
    index: int  # position in the input, for ordering
    id: str
    messages: tuple[Mapping[str, str], ...]  # the chat sent to the model
    text: str  # the last user turn, as the output's `prompt`
    source: str
    record: str  # the input row's other fields as JSON (curate's own `record` passed through)
    where: str  # file:line, for error messages
    hash: str  # of the input row, its source name and `messages` (prompt_hash)
    # A teacher response shipped with the record (backend=records): raw texts or chat messages.
    shipped: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)


def canonical_hash(value: Any, length: int = 16) -> str:
    """Hex digest of a JSON value with sorted keys: equal values, equal hashes, across processes and runs."""
    data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.sha256(data).hexdigest()[:length]


def prompt_hash(row: Mapping[str, Any], source: str, chat: Sequence[Mapping[str, str]]) -> str:
    """What a prompt's units are samples of: the whole input row (values JSON cannot hold, from Parquet, by
    their text), the source name the output records and the chat sent (system prompt included)."""
    data = orjson.dumps({"row": row, "source": source, "messages": chat}, default=str,
                        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.sha256(data).hexdigest()[:16]


def unit_seed(base_seed: int, prompt_id: str, sample: int) -> int:
    """The seed of one unit: independent of n, of the order of work and of what else is pending, so a unit
    sampled after a restart is the one the first run would have sampled. Below 2**31 for every server."""
    digest = hashlib.sha256(f"{base_seed}\x00{prompt_id}\x00{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**31 - 1)


def _assistant_turn(messages: list[Any]) -> int | None:
    """The index of the final turn when it is the assistant's (a shipped response); earlier assistant turns belong
    to the conversation being answered."""
    last = len(messages) - 1
    if last >= 0 and isinstance(messages[last], dict) and messages[last].get("role") == "assistant":
        return last
    return None


def _chat_prefix(messages: Any, where: str) -> list[dict[str, str]]:
    """The conversation a `messages` field asks to answer: every turn but a final assistant one, checked."""
    if not isinstance(messages, list) or not messages:
        raise RecordError(f"{where}: field 'messages' is not a non-empty list of chat turns")
    end = _assistant_turn(messages)
    chat = []
    for turn in messages[: len(messages) if end is None else end]:
        if not isinstance(turn, dict) or not isinstance(turn.get("content"), str) or "role" not in turn:
            raise RecordError(f"{where}: a turn of 'messages' lacks a role or a text content: {str(turn)[:120]}")
        chat.append({"role": str(turn["role"]), "content": turn["content"]})
    if not chat or chat[-1]["role"] != "user":
        raise RecordError(f"{where}: 'messages' does not end with a user turn (before a final assistant turn)")
    return chat


def shipped_responses(record: Mapping[str, Any], response_field: str = "response") -> list[dict[str, Any]]:
    """Teacher responses a record already holds: `response` (text), `responses`/`generations` (texts), or the
    assistant turn of `messages` (with its `reasoning_content`, if any)."""
    found: list[dict[str, Any]] = []
    value = record.get(response_field)
    if isinstance(value, str):
        found.append({"content": value})
    for key in ("responses", "generations"):
        values = record.get(key)
        if isinstance(values, list):
            found.extend({"content": v} for v in values if isinstance(v, str))
    messages = record.get("messages")
    if not found and isinstance(messages, list):
        turn = _assistant_turn(messages)
        if turn is not None and isinstance(messages[turn].get("content"), str):
            found.append({k: v for k, v in messages[turn].items() if k in ("content", "reasoning_content", "reasoning")})
    return found


def prompt_from_row(located: Located, source: Source, index: int, prompt_field: str, id_field: str,
                    system_prompt: str) -> Prompt:
    """One input row as a Prompt; a missing id or prompt is an error naming the row and the fields present."""
    record, where = located.record, located.where
    id_name, prompt_name = source.field("id", id_field), source.field("prompt", prompt_field)
    raw_id = record.get(id_name)
    if raw_id is None or raw_id == "" or isinstance(raw_id, (dict, list)):
        raise RecordError(
            f"{where}: no prompt id in field {id_name!r} (fields present: {sorted(record)}); sampling keys its "
            f"work by id, so every prompt needs one: map it with {source.uri}#id=FIELD or --set id_field=FIELD")
    prompt = record.get(prompt_name)
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RecordError(f"{where}: prompt field {prompt_name!r} is empty")
        chat = [{"role": "user", "content": prompt}]
    elif prompt_name not in record and "messages" in record:
        chat = _chat_prefix(record["messages"], where)
    else:
        got = "missing" if prompt_name not in record else f"a {type(prompt).__name__}"
        raise RecordError(
            f"{where}: prompt field {prompt_name!r} is {got} (fields present: {sorted(record)}); map it with "
            f"{source.uri}#prompt=FIELD or --set prompt_field=FIELD")
    if system_prompt and chat[0]["role"] != "system":
        chat.insert(0, {"role": "system", "content": system_prompt})
    passed = record.get("record")
    # Curate's rows carry the source row as JSON already: pass it through rather than nest it.
    others = passed if isinstance(passed, str) and set(record) <= {"id", "source", "prompt", "record"} else \
        orjson.dumps({k: v for k, v in record.items() if k != prompt_name}, default=str).decode()
    source_name = str(record.get("source") or source.name)
    return Prompt(
        index=index, id=str(raw_id), messages=tuple(chat), text=chat[-1]["content"],
        source=source_name, record=others, where=where, hash=prompt_hash(record, source_name, chat),
    )


def check_unique(prompts: Sequence[Prompt]) -> None:
    if isinstance(prompts, Prompts) and pc.count_distinct(prompts.ids).as_py() == len(prompts):
        return  # the common case without a Python object per prompt; the loop below names a duplicate
    first: dict[str, Prompt] = {}
    for prompt in prompts:
        earlier = first.setdefault(prompt.id, prompt)
        if earlier is not prompt:
            raise DuplicatePromptError(
                f"prompt id {prompt.id!r} appears twice: {earlier.where} and {prompt.where}; ids key the samples, "
                "so deduplicate the input (e.g. with klear curate) or map a unique id field")


_PROMPT_COLUMNS = pa.schema([("index", pa.int64()), ("id", pa.string()), ("messages", pa.string()),
                             ("text", pa.string()), ("source", pa.dictionary(pa.int32(), pa.string())),
                             ("record", pa.string()), ("where", pa.string()), ("hash", pa.string())])


class Prompts(Sequence[Prompt]):
    """Prompts held as Arrow columns, a Prompt made each time one is taken: a few hundred bytes per prompt rather
    than a tree of Python objects (~900 bytes), for runs of millions of prompts. The messages are kept as JSON
    (chat turns of strings: the same values back); shipped responses (backend=records) by prompt index."""

    def __init__(self, table: pa.Table, shipped: Mapping[int, tuple[Mapping[str, Any], ...]] | None = None) -> None:
        self.table = table
        self._shipped = shipped if shipped is not None else {}
        self._columns = [table.column(name) for name in _PROMPT_COLUMNS.names]

    @classmethod
    def of(cls, prompts: Iterable[Prompt], batch: int = 4096) -> Prompts:
        """The prompts given (an iterator: at most `batch` of them held as objects at once)."""
        batches: list[pa.RecordBatch] = []
        shipped: dict[int, tuple[Mapping[str, Any], ...]] = {}
        held: list[Prompt] = []

        def flush() -> None:
            columns = [[p.index for p in held], [p.id for p in held],
                       [orjson.dumps(list(p.messages)).decode() for p in held], [p.text for p in held],
                       [p.source for p in held], [p.record for p in held], [p.where for p in held],
                       [p.hash for p in held]]
            batches.append(pa.RecordBatch.from_arrays([pa.array(c, f.type) if f.name != "source" else
                                                      pc.dictionary_encode(pa.array(c, pa.string()))
                                                      for c, f in zip(columns, _PROMPT_COLUMNS, strict=True)],
                                                     schema=_PROMPT_COLUMNS))
            held.clear()

        for prompt in prompts:
            held.append(prompt)
            if prompt.shipped:
                shipped[prompt.index] = prompt.shipped
            if len(held) >= batch:
                flush()
        if held:
            flush()
        return cls(pa.Table.from_batches(batches, _PROMPT_COLUMNS), shipped)  # not combined: that would copy it

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def ids(self) -> pa.Array:
        return self.table.column("id").combine_chunks()

    @property
    def hashes(self) -> pa.Array:
        return self.table.column("hash").combine_chunks()

    def take(self, rows: Sequence[int] | np.ndarray) -> Prompts:
        return Prompts(self.table.take(pa.array(np.asarray(rows, np.int64))), self._shipped)

    @overload
    def __getitem__(self, i: int) -> Prompt: ...

    @overload
    def __getitem__(self, i: slice) -> Prompts: ...

    def __getitem__(self, i: int | slice) -> Prompt | Prompts:
        if isinstance(i, slice):
            return self.take(range(*i.indices(len(self))))
        if not -len(self) <= i < len(self):
            raise IndexError(f"prompt {i} of {len(self)}")
        index, id_, messages, text, source, record, where, digest = (column[i].as_py() for column in self._columns)
        return Prompt(index=index, id=id_, messages=tuple(orjson.loads(messages)), text=text, source=source,
                      record=record, where=where, hash=digest, shipped=self._shipped.get(index, ()))

    def __iter__(self) -> Iterator[Prompt]:
        for start in range(0, len(self), 4096):
            rows = self.table.slice(start, 4096).to_pylist()
            for row in rows:
                yield Prompt(index=row["index"], id=row["id"], messages=tuple(orjson.loads(row["messages"])),
                             text=row["text"], source=row["source"], record=row["record"], where=row["where"],
                             hash=row["hash"], shipped=self._shipped.get(row["index"], ()))

    def ids_and_hashes(self) -> Iterator[tuple[str, str]]:
        """(id, prompt hash) of each prompt, in order, a batch at a time."""
        for start in range(0, len(self), 65536):
            part = self.table.slice(start, 65536)
            yield from zip(part.column("id").to_pylist(), part.column("hash").to_pylist(), strict=True)


@dataclass(frozen=True, slots=True)
class Unit:
    prompt: int  # index into the prompt list
    sample: int


def pending_units(prompts: Sequence[Prompt], counts: Sequence[int], done: Mapping[tuple[str, int], str]) -> list[Unit]:
    """Units not yet done, in prompt order (`counts[i]` samples of prompt i): done means present with the
    prompt's current hash, so a prompt whose row changed under the same id is sampled anew."""
    missing = []
    for i, (prompt, count) in enumerate(zip(prompts, counts, strict=True)):
        for j in range(count):
            if done.get((prompt.id, j)) != prompt.hash:
                missing.append(Unit(i, j))
    return missing


def wanted_keys(prompts: Iterable[Prompt], counts: Iterable[int]) -> dict[tuple[str, int], str]:
    """Every unit of this run -> the prompt hash it must carry: what the published output may hold."""
    return {(p.id, j): p.hash for p, count in zip(prompts, counts, strict=True) for j in range(count)}



def units_digest(prompts: Iterable[Prompt], counts: Iterable[int]) -> str:
    """canonical_hash of [[id, sample, prompt_hash], ...] over every unit of a run, fed piece by piece: the same
    value without a Python list per unit."""
    digest = hashlib.sha256(b"[")
    first = True
    keys = prompts.ids_and_hashes() if isinstance(prompts, Prompts) else ((p.id, p.hash) for p in prompts)
    for (prompt_id, prompt_hash_), count in zip(keys, counts, strict=True):
        head, tail = b"[" + orjson.dumps(prompt_id) + b",", b"," + orjson.dumps(prompt_hash_) + b"]"
        for j in range(count):
            digest.update((b"" if first else b",") + head + str(j).encode() + tail)
            first = False
    digest.update(b"]")
    return digest.hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class Plan:
    """Every unit of a run, in output order, as arrays (a run may hold tens of millions of units): the samples
    0 .. counts[i]-1 of prompt i are at positions offsets[i] .. offsets[i+1]-1, prompts in input order."""

    ids: pa.Array  # prompt ids, in prompt order
    hashes: pa.Array  # their prompt hashes
    offsets: np.ndarray  # int64, one more than there are prompts

    @classmethod
    def of(cls, prompts: Sequence[Prompt], counts: Sequence[int]) -> Plan:
        offsets = np.zeros(len(prompts) + 1, np.int64)
        np.cumsum(np.asarray(counts, np.int64), out=offsets[1:])
        if isinstance(prompts, Prompts):
            return cls(prompts.ids, prompts.hashes, offsets)
        return cls(pa.array([p.id for p in prompts], pa.string()), pa.array([p.hash for p in prompts], pa.string()),
                   offsets)

    @classmethod
    def of_wanted(cls, wanted: Mapping[tuple[str, int], str]) -> Plan:
        """The plan of a wanted_keys mapping (samples 0 .. count-1 of each prompt, prompts in order)."""
        ids: list[str] = []
        hashes: list[str] = []
        counts: list[int] = []
        for (prompt_id, _), digest in wanted.items():
            if not ids or ids[-1] != prompt_id:
                ids.append(prompt_id)
                hashes.append(digest)
                counts.append(0)
            counts[-1] += 1
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(np.asarray(counts, np.int64), out=offsets[1:])
        return cls(pa.array(ids, pa.string()), pa.array(hashes, pa.string()), offsets)

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    def units(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(prompt index, sample index) of each position."""
        prompt = np.searchsorted(self.offsets, positions, side="right") - 1
        return prompt, positions - self.offsets[prompt]

    def keys(self, positions: np.ndarray) -> list[tuple[str, int]]:
        """(id, sample) of each position (for messages and small callers: a Python object per unit)."""
        prompt, sample = self.units(np.asarray(positions, np.int64))
        ids = self.ids.take(pa.array(prompt, pa.int64())).to_pylist()
        return list(zip(ids, sample.tolist()))

    def locate(self, ids: pa.Array | pa.ChunkedArray, samples: pa.Array | pa.ChunkedArray,
               hashes: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The position of each unit key (id, sample, prompt hash); -1 for a unit this run does not want (its
        prompt gone or changed since, its sample index beyond the prompt's count)."""
        if len(ids) == 0:
            return np.zeros(0, np.int64)
        if len(self.ids) == 0:  # a plan of no prompts (an empty slice) wants none of them
            return np.full(len(ids), -1, np.int64)
        found = np.asarray(pc.fill_null(pc.index_in(ids, value_set=self.ids), -1), np.int64)
        safe = np.where(found >= 0, found, 0)
        sample = np.asarray(samples, np.int64)
        same = np.asarray(pc.fill_null(pc.equal(hashes, self.hashes.take(pa.array(safe))), False), bool)
        counts = np.diff(self.offsets)
        ok = (found >= 0) & same & (sample >= 0) & (sample < counts[safe])
        return np.where(ok, self.offsets[safe] + sample, -1)


def first_copies(positions: np.ndarray, shards: np.ndarray) -> np.ndarray:
    """Indexes of the copy kept of each wanted unit, in position order: of several copies (writers racing), the
    one in the shard that sorts first; positions of -1 (not wanted) are skipped."""
    valid = np.flatnonzero(positions >= 0)
    ranked = positions if len(valid) == len(positions) else positions[valid]  # every key wanted: no copy
    if not np.any(ranked[1:] <= ranked[:-1]):  # one copy each, in order (one writer): no sort, no temporaries
        return valid
    del ranked
    order = valid[np.lexsort((shards[valid], positions[valid]))]
    ranked = positions[order]
    keep = np.ones(len(order), bool)
    keep[1:] = ranked[1:] != ranked[:-1]
    return order[keep]


def pending_positions(plan: Plan, done: np.ndarray) -> np.ndarray:
    """Positions of the units not among `done` (positions, -1 ignored), in output order."""
    mask = np.ones(plan.total, bool)
    mask[done[done >= 0]] = False
    return np.flatnonzero(mask)
