"""RL prompts from records: the prompt as a chat turn, plus what the verifier needs (answer or tests).

Accepted records: curate's output (`prompt` plus the source row as JSON in `record`, unwrapped by
`klear.common.records.unwrap_record`), or plain rows with the prompt in `prompt`, `problem` or
`question`. Math rows need `answer`; code rows need `tests` (LiveCodeBench's {input, output,
testtype}, a list or its JSON) and may name `fn_name` for functional problems. Rows that lack
them, whose `record` cannot be read, or whose prompt is too long, are skipped and counted with
their file and line, never guessed at (a too long prompt is cut from the left instead with
`prompt_truncation: left`, as the released runs do).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from klear.common.records import iter_training_records, unwrap_record
from klear.common.sample_rows import prompt_text

SKIP_REASONS = ("unreadable", "no_prompt", "no_answer", "no_tests", "prompt_too_long")


def _tests(value: Any) -> list[dict[str, Any]] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(t, dict) and "input" in t and "output" in t for t in value):
        return value
    return None


def rl_row(record: dict[str, Any], task: str, where: str) -> tuple[dict[str, Any] | None, str]:
    """(training row, "") or (None, skip reason) for one record."""
    flat = unwrap_record(record)
    if flat is None:
        return None, "unreadable"
    prompt = prompt_text(flat)
    if prompt is None:
        return None, "no_prompt"
    row: dict[str, Any] = {"prompt": [{"role": "user", "content": prompt}], "problem_id": str(flat.get("id") or where),
                           "answer": "", "tests": "", "fn_name": ""}
    if task == "math":
        answer = flat.get("answer")
        if answer is None or not str(answer).strip():
            return None, "no_answer"
        row["answer"] = str(answer)
    else:
        tests = _tests(flat.get("tests"))
        if tests is None:
            return None, "no_tests"
        row["tests"] = json.dumps(tests)  # one string column: test lists differ in shape from row to row
        row["fn_name"] = str(flat.get("fn_name") or "")
    return row, ""


def truncate_left(messages: list[dict[str, str]], prompt_tokens: Callable[[list[dict[str, str]]], int],
                  limit: int) -> list[dict[str, str]] | None:
    """The prompt cut from the left to at most `limit` tokens, as the released runs' data.truncation='left': the
    start of the last turn's text goes (the chat template's own tokens stay, so the prompt stays well formed). The
    fewest characters are cut (binary search); None when even an empty last turn is too long."""
    if prompt_tokens(messages) <= limit:
        return messages
    text = messages[-1]["content"]

    def cut(n: int) -> list[dict[str, str]]:
        return [*messages[:-1], {**messages[-1], "content": text[n:]}]

    if prompt_tokens(cut(len(text))) > limit:
        return None
    low, high = 1, len(text)  # cut(high) fits; find the smallest cut that fits
    while low < high:
        mid = (low + high) // 2
        if prompt_tokens(cut(mid)) <= limit:
            high = mid
        else:
            low = mid + 1
    return cut(low)


def load_rows(uris: Iterable[str], task: str, prompt_tokens: Callable[[list[dict[str, str]]], int],
              max_prompt_length: int, truncation: str = "skip") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Training rows of all sources and the counts for the report (read, kept, skipped by reason, truncated,
    examples). A prompt over `max_prompt_length` tokens is skipped, or with `truncation` "left" cut from the left."""
    rows: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    examples: list[str] = []
    read = truncated = 0
    for located in iter_training_records(uris):
        read += 1
        row, reason = rl_row(located.record, task, located.where)
        if row is not None and truncation == "left":
            cut = truncate_left(row["prompt"], prompt_tokens, max_prompt_length)
            truncated += cut is not None and cut is not row["prompt"]
            row, reason = ({**row, "prompt": cut}, reason) if cut is not None else (None, "prompt_too_long")
        elif row is not None and prompt_tokens(row["prompt"]) > max_prompt_length:
            row, reason = None, "prompt_too_long"
        if row is None:
            skipped[reason] += 1
            if len(examples) < 20:
                examples.append(f"{located.where}: {reason}")
            continue
        rows.append(row)
    return rows, {"read": read, "kept": len(rows), "truncated": truncated, "skipped": dict(sorted(skipped.items())),
                  "skipped_examples": examples}
