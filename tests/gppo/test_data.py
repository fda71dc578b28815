"""RL rows from records, and the one unwrapping rule of curate's rows that sft and gppo share."""

from __future__ import annotations

import json

from klear.common.records import unwrap_record
from klear.gppo.data import rl_row
from klear.sft.data import to_messages

INNER = {"id": "src-1", "problem": "What is 2 + 3?", "answer": "5",
         "messages": [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]}


def curated(inner: object, **outer: str) -> dict:
    return {"id": "curated-1", "source": "math", "prompt": "What is 2 + 3?", "record": json.dumps(inner), **outer}


def test_outer_fields_win_and_inner_fields_fill_in() -> None:
    flat = unwrap_record(curated(INNER, prompt="Mapped prompt"))
    assert flat is not None
    assert flat["id"] == "curated-1" and flat["prompt"] == "Mapped prompt"  # curate's own fields win
    assert flat["answer"] == "5" and flat["problem"] == INNER["problem"]  # the source row fills in
    assert "record" not in flat
    assert unwrap_record({"prompt": "plain"}) == {"prompt": "plain"}
    assert unwrap_record({"prompt": "p", "record": INNER}) == {**INNER, "prompt": "p"}  # a nested object, not JSON


def test_a_record_that_cannot_be_read_is_unreadable_in_both_stages() -> None:
    for bad in ("{not json", json.dumps([1, 2])):
        row = {"prompt": "What is 2 + 3?", "record": bad}
        assert unwrap_record(row) is None
        assert to_messages(row) is None  # sft counts it as "unreadable"
        assert rl_row(row, "math", "f.jsonl:1") == (None, "unreadable")


def test_both_stages_read_curated_rows_by_the_same_rule() -> None:
    row = curated(INNER, prompt="Mapped prompt")
    assert to_messages(row) == INNER["messages"]  # the conversation comes from the source row
    rl, reason = rl_row(row, "math", "f.jsonl:1")
    assert reason == "" and rl is not None
    assert rl["prompt"] == [{"role": "user", "content": "Mapped prompt"}]  # curate's prompt, not the source's
    assert rl["answer"] == "5" and rl["problem_id"] == "curated-1"
    code = curated({"question": "Sum", "tests": [{"input": "1\n", "output": "1\n"}], "fn_name": "f"})
    rl, reason = rl_row(code, "code", "f.jsonl:2")
    assert reason == "" and rl is not None and json.loads(rl["tests"]) == [{"input": "1\n", "output": "1\n"}]
    assert rl_row(code, "math", "f.jsonl:2") == (None, "no_answer")
