"""An SFT record is the conversation the teacher answered (system prompt and earlier turns included) plus its
response, never the last user turn alone: `klear sample` records the conversation it sent in each row, and
`klear sft-data` builds the record from it. Runs the real commands."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from tests.commands import klear

SYSTEM = "You are a careful mathematician."
TRACE = "<think>\nAdd the numbers.\n</think>\n\nThe answer is $\\boxed{4}$."


def _rows(folder: Path, sub: str) -> list[dict[str, object]]:
    return [row for part in sorted((folder / sub).glob("*.parquet")) for row in pq.read_table(part).to_pylist()]


def test_records_hold_the_whole_conversation_the_teacher_answered(tmp_path: Path) -> None:
    earlier = [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "It is 2."},
               {"role": "user", "content": "And 2+2?"}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "multi", "messages": [*earlier, {"role": "assistant", "content": TRACE}], "answer": "4"})
        + "\n" + json.dumps({"id": "single", "prompt": "What is 2+2?", "response": TRACE, "answer": "4"}) + "\n")
    sampled = klear("sample", "--prompts", str(prompts), "--output", str(tmp_path / "teacher"), "--config", "tiny",
                     "--set", "backend=records", "--set", f"system_prompt={SYSTEM}")
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    sent = {row["id"]: row["messages"] for row in _rows(tmp_path / "teacher", "samples")}
    system = {"role": "system", "content": SYSTEM}
    assert sent == {"multi": [system, *earlier], "single": [system, {"role": "user", "content": "What is 2+2?"}]}

    built = klear("sft-data", "--samples", str(tmp_path / "teacher"), "--output", str(tmp_path / "sft"),
                   "--config", "tiny")
    assert built.returncode == 0, built.stderr[-3000:]
    records = {row["id"]: row["messages"] for row in _rows(tmp_path / "sft", "records")}
    assert records["multi"] == [system, *earlier, {"role": "assistant", "content": TRACE}]
    assert records["single"] == [system, {"role": "user", "content": "What is 2+2?"},
                                 {"role": "assistant", "content": TRACE}]


def test_rows_without_a_conversation_keep_the_prompt_as_one_user_turn(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"id": "p", "sample": 0, "prompt": "What is 2+2?", "response": TRACE,
                                   "finish_reason": "stop", "record": {"id": "p", "answer": "4"}}) + "\n")
    built = klear("sft-data", "--samples", str(samples), "--output", str(tmp_path / "sft"), "--config", "tiny")
    assert built.returncode == 0, built.stderr[-3000:]
    assert [row["messages"] for row in _rows(tmp_path / "sft", "records")] == [
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": TRACE}]]


def test_a_conversation_that_is_not_a_list_of_turns_is_refused(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"id": "p", "sample": 0, "prompt": "q", "response": TRACE, "finish_reason": "stop",
                                   "messages": "[{\"role\": \"user\"}]", "record": {"id": "p", "answer": "4"}}) + "\n")
    built = klear("sft-data", "--samples", str(samples), "--output", str(tmp_path / "sft"), "--config", "tiny")
    refusal = f"{samples}:1: field 'messages': expected a list of {{role, content}} strings or its JSON text"
    assert built.returncode == 2 and refusal in built.stderr, built.stderr[-3000:]
    assert not (tmp_path / "sft").exists()


def test_the_recorded_conversation_is_the_one_the_model_was_given(tiny_model: str, tmp_path: Path) -> None:
    """On the hf backend (the tiny model): each row's prompt tokens are those of its recorded `messages` through the
    model's chat template, so the conversation sft-data builds records from (above) is the one the model answered.
    (sft-data itself is not run here: the random model's responses are cut at max_tokens, and it drops those.)"""
    from transformers import AutoTokenizer

    earlier = [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "It is 2."},
               {"role": "user", "content": "And 2+2?"}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "multi", "messages": earlier, "answer": "4"}) + "\n"
                       + json.dumps({"id": "single", "prompt": "What is 2+2?", "answer": "4"}) + "\n")
    sampled = klear("sample", "--prompts", str(prompts), "--model", tiny_model, "--output", str(tmp_path / "teacher"),
                     "--config", "tiny", "--set", "backend=hf", "--set", "max_tokens=4", "--set", "n=1",
                     "--set", f"system_prompt={SYSTEM}")
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    system = {"role": "system", "content": SYSTEM}
    rows = {row["id"]: row for row in _rows(tmp_path / "teacher", "samples")}
    sent = {pid: row["messages"] for pid, row in rows.items()}
    assert sent == {"multi": [system, *earlier], "single": [system, {"role": "user", "content": "What is 2+2?"}]}
    for pid, row in rows.items():  # the model's count: the whole conversation, not its last turn alone
        fed = tokenizer(tokenizer.apply_chat_template(sent[pid], add_generation_prompt=True, tokenize=False),
                        add_special_tokens=False)["input_ids"]
        assert row["prompt_tokens"] == len(fed), pid
    assert rows["multi"]["prompt_tokens"] > rows["single"]["prompt_tokens"]
