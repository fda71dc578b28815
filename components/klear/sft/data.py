"""SFT examples from records: conversations in, token ids and assistant masks out.

Accepted record shapes (first match wins):

  {"messages": [{"role": ..., "content": ...}, ...]}           chat rows (demo data, teacher samples)
  {"record": "<JSON of a row with messages>", ...}             curate's prompts/part-*.parquet, unwrapped by
                                                               klear.common.records.unwrap_record (outer fields win)
  {"prompt": "...", "response" | "completion": "..."}          a prompt and one teacher response

A record without an assistant turn, or longer than `max_length` tokens, is skipped and counted:
never truncated, since a long-CoT answer cut mid-way would teach the model to stop thinking
without concluding (and to never emit `<|im_end|>`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from klear.common.records import iter_training_records, unwrap_record

SKIP_REASONS = ("no_assistant", "too_long", "unreadable")
_ROLES = ("system", "user", "assistant")


def to_messages(record: dict[str, Any]) -> list[dict[str, str]] | None:
    """The record's conversation (role/content, plus reasoning_content when present): [] when the record has
    none (a bare prompt), None when it has one that is malformed (unknown role, non-text content, unreadable
    `record`)."""
    flat = unwrap_record(record)
    if flat is None:
        return None
    if isinstance(flat.get("messages"), list):
        raw = flat["messages"]
    elif "messages" in flat:
        return None
    elif isinstance(flat.get("prompt"), str):
        response = flat.get("response", flat.get("completion"))
        raw = [{"role": "user", "content": flat["prompt"]}]
        if isinstance(response, str):
            raw.append({"role": "assistant", "content": response})
    else:
        return []
    messages = []
    for message in raw:
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            return None
        content = message.get("content")
        if not isinstance(content, str):
            return None
        kept = {"role": message["role"], "content": content}
        if isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
            kept["reasoning_content"] = message["reasoning_content"]
        messages.append(kept)
    return messages


def has_assistant_turn(messages: list[dict[str, str]]) -> bool:
    return any(m["role"] == "assistant" and (m["content"].strip() or m.get("reasoning_content")) for m in messages)


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and the mask of the tokens the loss is taken on."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def encode_example(tokenizer: Any, conversation: str, max_length: int) -> dict[str, Any]:
    """One dataset row: ids, assistant mask, length and a skip reason ("" = keep). `conversation` is JSON."""
    messages = json.loads(conversation)
    if messages is None:
        return _skipped("unreadable")
    if not has_assistant_turn(messages):
        return _skipped("no_assistant")
    ids, mask = tokenize_conversation(tokenizer, messages)
    if len(ids) > max_length:
        return _skipped("too_long")
    if not any(mask):
        return _skipped("no_assistant")
    return {"input_ids": ids, "assistant_masks": mask, "length": len(ids), "skip": ""}


def _skipped(reason: str) -> dict[str, Any]:
    return {"input_ids": [], "assistant_masks": [], "length": 0, "skip": reason}


def iter_conversations(uris: list[str]) -> Iterator[tuple[str, str]]:
    """(where, conversation JSON or "null") for every record of the data sources, in order."""
    for located in iter_training_records(uris):
        # JSON only as transport through the datasets cache: an Arrow struct would give every turn a reasoning_content
        # (null where absent, "defined" to a model's own chat template) and no value for an unreadable record ("null").
        yield located.where, json.dumps(to_messages(located.record))
