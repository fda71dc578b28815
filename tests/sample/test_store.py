"""The work area: shards and their indexes, a kill between the two writes, two writers at once."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from klear.sample.backends.base import Completion, Request
from klear.sample.coordinator import assemble
from klear.sample.reasoning import Parsed
from klear.sample.store import WorkArea, completion_row
from klear.sample.units import Prompt, canonical_hash, wanted_keys


def _prompt(i: int, text: str | None = None) -> Prompt:
    chat = ({"role": "user", "content": text or f"q{i}"},)
    return Prompt(i, f"p{i}", chat, chat[0]["content"], "test", "{}", f"t:{i}", canonical_hash(chat))


def _done(prompt: Prompt, sample: int, answer: str) -> Completion:
    return Completion(Request(prompt, sample, sample), Parsed("r", answer, True), "stop", 3, 4, "m")


def test_a_missing_index_is_rebuilt_and_temp_files_are_not_shards(tmp_path: Path) -> None:
    area = WorkArea(str(tmp_path / "work"))
    name = area.write_shard([_done(_prompt(0), 0, "a"), _done(_prompt(0), 1, "b")])
    (tmp_path / "work" / "index" / f"{name}.json").unlink()  # killed between the shard and its index
    (tmp_path / "work" / "shards" / f".{name}.parquet.tmp123").write_bytes(b"torn")  # killed mid-write
    scan = WorkArea(str(tmp_path / "work")).scan()
    assert scan.repaired == 1 and scan.shards == [name]
    assert scan.hashes() == {("p0", 0): _prompt(0).hash, ("p0", 1): _prompt(0).hash}
    assert (tmp_path / "work" / "index" / f"{name}.json").exists()
    assert WorkArea(str(tmp_path / "work")).scan().repaired == 0


def test_two_writers_at_once_give_each_unit_once_first_shard_wins(tmp_path: Path) -> None:
    first, second = WorkArea(str(tmp_path / "work")), WorkArea(str(tmp_path / "work"))
    first.writer, second.writer = "20260101T000000-aaaa", "20260101T000001-bbbb"
    p0, p1 = _prompt(0), _prompt(1)
    first.write_shard([_done(p0, 0, "first"), _done(p1, 0, "first")])
    second.write_shard([_done(p0, 0, "second"), _done(p0, 1, "second")])
    scan = first.scan()
    assert scan.duplicates == 1 and scan.done[("p0", 0)][1].startswith(first.writer)
    # p1's prompt changed since: its old sample is not wanted any more.
    wanted = wanted_keys([p0, _prompt(1, "a new text")], [2, 1])
    result = assemble(first, first.shard_names(), wanted, tmp_path / "staging", 100)
    rows = pq.read_table(tmp_path / "staging" / "samples" / "part-00000.parquet").to_pylist()
    assert sorted((r["id"], r["sample"], r["final"]) for r in rows) == [("p0", 0, "first"), ("p0", 1, "second")]
    assert result.dropped == 2 and result.emitted == {("p0", 0), ("p0", 1)}
    assert result.completion_tokens == 8 and dict(result.finish_reasons) == {"stop": 2}


def test_a_shard_written_before_final_and_the_list_of_turns_publishes_as_rows_are_now(tmp_path: Path) -> None:
    """A work area of an earlier version: its shard's `answer` is the final text (the sample stage never wrote a
    gold one there) and its `messages` JSON text; published beside a new shard, both read as SCHEMA is now."""
    area = WorkArea(str(tmp_path / "work"))
    p0 = _prompt(0)
    now = completion_row(_done(p0, 0, "old"))
    before = {**{k: v for k, v in now.items() if k not in ("final", "messages")}, "answer": "old",
              "messages": json.dumps(list(p0.messages))}
    area.write_table("20250101T000000-0000aaaa-000000", pa.Table.from_pylist([before]))
    area.write_shard([_done(p0, 1, "new")])
    assemble(area, area.shard_names(), wanted_keys([p0], [2]), tmp_path / "staging", 100)
    rows = pq.read_table(tmp_path / "staging" / "samples" / "part-00000.parquet").to_pylist()
    chat = [{"role": "user", "content": "q0"}]
    assert [(r["sample"], r["final"], r["messages"]) for r in rows] == [(0, "old", chat), (1, "new", chat)]
    assert "answer" not in rows[0]
