"""Builders of `klear sample`-shaped rows and published sample folders, shared by the judge, sft-data and
rl-filter tests (the sample stage's schema: id, sample, prompt, response, reasoning, final, finish_reason,
prompt_tokens, completion_tokens, model, record)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import storage
from klear.common.chat import split_response

SAMPLE_SCHEMA = pa.schema([
    ("id", pa.string()), ("sample", pa.int64()), ("prompt", pa.string()), ("response", pa.string()),
    ("reasoning", pa.string()), ("final", pa.string()), ("finish_reason", pa.string()),
    ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("model", pa.string()), ("record", pa.string()),
])


def response(reasoning: str, answer: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


def sample_row(pid: str, k: int, text: str, record: dict[str, Any], finish_reason: str = "stop",
               prompt: str | None = None, model: str = "teacher") -> dict[str, Any]:
    parts = split_response(text)  # the columns `klear sample` writes
    return {"id": pid, "sample": k, "prompt": prompt if prompt is not None else str(record.get("problem") or record.get("question") or ""),
            "response": text, "reasoning": parts.reasoning, "final": parts.final,
            "finish_reason": finish_reason, "prompt_tokens": 12, "completion_tokens": max(1, len(text) // 4),
            "model": model, "record": json.dumps(record)}


def math_record(pid: str, answer: str, problem: str | None = None, source: str = "mathsrc") -> dict[str, Any]:
    return {"id": pid, "problem": problem or f"Problem {pid}: compute the value asked for in this exercise now.",
            "answer": answer, "source": source}


def boxed(value: str, reasoning: str = "Working it out step by step.") -> str:
    return response(reasoning, f"The answer is $\\boxed{{{value}}}$.")


def code_record(pid: str, n_tests: int, question: str | None = None, source: str = "codesrc") -> dict[str, Any]:
    """A stdin problem: print twice the integer read; inputs 1..n."""
    tests = [{"input": f"{i}\n", "output": f"{2 * i}\n", "testtype": "stdin"} for i in range(1, n_tests + 1)]
    return {"id": pid, "question": question or f"Problem {pid}: read an integer n from standard input and print 2*n.",
            "tests": json.dumps(tests), "source": source}


def program(body: str) -> str:
    return response("Plan the program.", f"```python\n{body}\n```")


CORRECT = program("print(2 * int(input()))")
WRONG = program("print(0)")
HALF = program("n = int(input())\nprint(2 * n if n % 2 == 0 else -1)")  # passes the even inputs only
HANG = program("while True:\n    pass")


def publish_samples(rows: list[dict[str, Any]], uri: str, schema: pa.Schema = SAMPLE_SCHEMA) -> str:
    """Publish rows as a `klear sample` output: samples/part-00000.parquet, report.json, manifest last."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "samples"
        folder.mkdir()
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "part-00000.parquet")
        (Path(tmp) / "report.json").write_text(json.dumps({"stage": "sample", "rows": len(rows)}))
        storage.publish_dir(tmp, uri, meta={"stage": "sample"})
    return uri


def read_parquet_folder(uri: str, folder: str) -> list[dict[str, Any]]:
    with storage.fetch_published(uri) as (local, manifest):
        files = sorted(f for f in manifest.files if f.startswith(folder + "/") and f.endswith(".parquet"))
        return [row for f in files for row in pq.read_table(local / f).to_pylist()]
