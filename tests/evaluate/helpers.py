"""Builders of sample rows, published sample outputs and LiveCodeBench-format problems for the evaluate tests."""

from __future__ import annotations

import base64
import json
import pickle
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import lineage, storage
from klear.common.chat import split_response

SAMPLE_SCHEMA = pa.schema([
    ("id", pa.string()), ("sample", pa.int32()), ("prompt", pa.string()), ("response", pa.string()),
    ("reasoning", pa.string()), ("final", pa.string()), ("finish_reason", pa.string()),
    ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()), ("model", pa.string()), ("record", pa.string()),
])
TINY_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 0, "repetition_penalty": 1.0, "max_tokens": 32,
                 "seed": 0, "system_prompt": "", "max_model_len": 0, "engine_kwargs": {}}


def respond(answer_section: str, reasoning: str = "Working through it step by step.") -> str:
    """The sample stage's normal form: <think>\\n..\\n</think>\\n\\n{final}."""
    return f"<think>\n{reasoning}\n</think>\n\n{answer_section}"


def boxed(value: str) -> str:
    return respond(f"So the final answer is $\\boxed{{{value}}}$.")


def program(body: str) -> str:
    return respond(f"Here is the program.\n```python\n{body}\n```")


def row(pid: str, sample: int, response: str, finish_reason: str = "stop", tokens: int | None = None,
        record: dict[str, Any] | None = None, prompt: str | None = None) -> dict[str, Any]:
    """A sample row; without `prompt` it records none (evaluate then reports its prompts as not recorded)."""
    parts = split_response(response)  # the columns `klear sample` writes
    return {"id": pid, "sample": sample, "prompt": prompt, "response": response,
            "reasoning": parts.reasoning, "final": parts.final,
            "finish_reason": finish_reason, "prompt_tokens": 10,
            "completion_tokens": tokens if tokens is not None else max(1, len(response) // 4), "model": "m",
            # A wrong gold answer in the record: evaluation must take the gold from the benchmark, never from here.
            "record": json.dumps(record or {"id": pid, "answer": "-99999", "tests": "[]"})}


def publish_samples(rows: list[dict[str, Any]], uri: str, sampling: dict[str, Any] | None = None,
                    inputs: Sequence[str] = ()) -> str:
    """Publish rows as a `klear sample` output (samples/part-00000.parquet), with recorded settings and a lineage
    naming `inputs` (what the samples were made from)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "samples"
        folder.mkdir()
        pq.write_table(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA), folder / "part-00000.parquet")
        (Path(tmp) / "report.json").write_text(json.dumps({"stage": "sample", "rows": len(rows)}))
        settings = {"format": 1, "identity": {"engine": "model", "model": "test-fingerprint"},
                    "sampling": sampling if sampling is not None else TINY_SAMPLING}
        storage.publish_dir(tmp, uri, meta={"stage": "sample", "settings": settings,
                                            "lineage": lineage.RunLineage(inputs, None).record()})
    return uri


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def packed(tests: list[dict[str, str]]) -> str:
    """LiveCodeBench's private-test encoding: base64 of zlib of a pickled JSON string."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def lcb_row(qid: str, date: str, tests: list[dict[str, str]], private_encoding: str = "packed",
            func_name: str | None = None, starter_code: str = "", public: int = 1) -> dict[str, Any]:
    """A code_generation_lite row; the first `public` tests are public, the rest private (encoded as asked)."""
    private = tests[public:]
    return {
        "question_title": f"title {qid}", "question_content": f"Solve problem {qid}.", "platform": "atcoder",
        "question_id": qid, "contest_id": "c1", "contest_date": f"{date}T00:00:00", "starter_code": starter_code,
        "difficulty": "easy", "public_test_cases": json.dumps(tests[:public]),
        "private_test_cases": packed(private) if private_encoding == "packed" else json.dumps(private),
        "metadata": json.dumps({"func_name": func_name} if func_name else {}),
    }
