"""LiveCodeBench `code_generation_lite` rows: recognising them, their dates, tests and prompt.

Row fields: question_id, question_title, question_content, platform, contest_id, contest_date (ISO), starter_code,
difficulty, public_test_cases (JSON list of {input, output, testtype}), private_test_cases (the same JSON, or
base64 -> zlib -> pickle -> that JSON text), metadata (JSON; `func_name` for functional problems).

The files come from the user, so they are untrusted: the pickle layer is read by an unpickler that refuses every
global (no class, no function, hence no code run on load), and decompression is capped.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import io
import json
import pickle
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LCB_SYSTEM_MESSAGE", "LcbError", "LcbProblem", "contest_day", "decode_private_tests", "is_livecodebench",
           "lcb_prompt", "parse_problem", "PlainDataUnpickler"]

MAX_DECODED_BYTES = 1 << 30  # one problem's private tests, decompressed; LiveCodeBench's largest are far below
_LCB_FIELDS = ("question_id", "question_content")
_TEST_FIELDS = ("public_test_cases", "private_test_cases")

# LiveCodeBench's generic prompt (lcb_runner/prompts/code_generation.py, the chat models' user turn).
_WITH_STARTER = "You will use the following starter code to write the solution to the problem and enclose your code within delimiters."
_WITHOUT_STARTER = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
                    "on the sample inputs). Enclose your code within delimiters as follows.")
# Appended to the stdin instruction on 2024-12-26 (lcb_runner commit 264e841); code_prompt lcb-2024 leaves it out.
_STDOUT_SENTENCE = " Ensure that when the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT."
# PromptConstants.SYSTEM_MESSAGE_GENERIC: the system turn lcb_runner sends chat models (OpenAIChat and the like).
LCB_SYSTEM_MESSAGE = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
                      "generate a correct Python program that matches the specification and passes all tests.")


class LcbError(ValueError):
    """A LiveCodeBench row that cannot be read; the message names the problem and what is wrong."""


class PlainDataUnpickler(pickle.Unpickler):
    """Loads only plain data (str, bytes, numbers, lists, dicts, ...): any global a pickle names is refused,
    so a payload built to call os.system (or anything else) on load fails before it runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}: private tests must be plain data")


def is_livecodebench(row: Mapping[str, Any]) -> bool:
    """A code_generation_lite row: a question id and text, and test cases."""
    return all(f in row for f in _LCB_FIELDS) and any(f in row for f in _TEST_FIELDS)


def contest_day(value: Any) -> dt.date:
    """The contest's day from an ISO date or datetime (text or object); day level, time and zone dropped."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str) and len(value) >= 10:
        return dt.date.fromisoformat(value[:10])
    raise ValueError(f"contest_date {value!r} is not an ISO date")


def _inflate(data: bytes) -> bytes:
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, MAX_DECODED_BYTES)
    if inflater.unconsumed_tail:
        raise ValueError(f"decompresses to more than {MAX_DECODED_BYTES} bytes")
    return out


def decode_private_tests(value: Any) -> list[Any]:
    """The private tests as a list: given as a list, as JSON text, or as base64 of zlib of a pickled JSON text."""
    if isinstance(value, list):
        return value
    if not isinstance(value, (str, bytes)):
        raise ValueError(f"private_test_cases is a {type(value).__name__}, expected JSON text or base64")
    text = value.decode() if isinstance(value, bytes) else value
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "[{":
        decoded = json.loads(stripped)
    else:
        try:
            packed = base64.b64decode(stripped, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"neither JSON nor base64 ({exc})") from None
        try:
            payload = PlainDataUnpickler(io.BytesIO(_inflate(packed))).load()
        except zlib.error as exc:
            raise ValueError(f"base64 but not zlib data ({exc})") from None
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
                AttributeError, MemoryError) as exc:
            raise ValueError(f"not a plain-data pickle: {exc}") from None
        if isinstance(payload, bytes):
            payload = payload.decode()
        if isinstance(payload, list):
            return payload
        if not isinstance(payload, str):
            raise ValueError(f"the pickle holds a {type(payload).__name__}, expected the tests' JSON text")
        decoded = json.loads(payload)
    if not isinstance(decoded, list):
        raise ValueError(f"tests decode to a {type(decoded).__name__}, expected a list")
    return decoded


def _tests(value: Any, where: str) -> list[dict[str, str]]:
    out = []
    for i, t in enumerate(value):
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise LcbError(f"{where}: test {i} lacks input/output")
        testtype = str(t.get("testtype") or "stdin")
        if testtype not in ("stdin", "functional"):
            raise LcbError(f"{where}: test {i} has unknown testtype {testtype!r}")
        out.append({"input": str(t["input"]), "output": str(t["output"]), "testtype": testtype})
    return out


def _metadata(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip():
        parsed = json.loads(value)
        return parsed if isinstance(parsed, dict) else {}
    return {}


@dataclass(frozen=True)
class LcbProblem:
    id: str
    title: str
    content: str
    starter_code: str
    platform: str
    difficulty: str
    day: dt.date
    fn_name: str | None
    tests: list[dict[str, str]]  # public then private, as LiveCodeBench grades them

    @property
    def prompt(self) -> str:
        return lcb_prompt(self.content, self.starter_code)


def parse_problem(row: Mapping[str, Any], where: str, decode_tests: bool = True) -> LcbProblem:
    """One row as a problem; `decode_tests=False` skips the (costly) private tests, for rows outside every window."""
    qid = str(row.get("question_id") or "").strip()
    if not qid:
        raise LcbError(f"{where}: empty question_id")
    where = f"{where} (question_id {qid})"
    try:
        day = contest_day(row.get("contest_date"))
    except ValueError as exc:
        raise LcbError(f"{where}: {exc}") from None
    tests: list[dict[str, str]] = []
    fn_name = None
    if decode_tests:
        try:
            public = row.get("public_test_cases") or "[]"
            tests = _tests(json.loads(public) if isinstance(public, str) else public, where + " public")
            tests += _tests(decode_private_tests(row.get("private_test_cases") or "[]"), where + " private")
            meta = _metadata(row.get("metadata"))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise LcbError(f"{where}: unreadable test cases: {exc}") from None
        if not tests:
            raise LcbError(f"{where}: no test cases")
        fn_name = str(meta["func_name"]) if meta.get("func_name") else None
        if fn_name is None and any(t["testtype"] == "functional" for t in tests):
            raise LcbError(f"{where}: functional tests but no metadata.func_name")
    return LcbProblem(id=qid, title=str(row.get("question_title") or ""), content=str(row.get("question_content") or ""),
                      starter_code=str(row.get("starter_code") or ""), platform=str(row.get("platform") or ""),
                      difficulty=str(row.get("difficulty") or ""), day=day, fn_name=fn_name, tests=tests)


def lcb_prompt(content: str, starter_code: str, form: str = "lcb") -> str:
    """The user turn LiveCodeBench sends chat models: question, format (starter code or stdin), answer cue; `form`
    lcb is today's runner, lcb-2024 its stdin instruction before 2024-12-26."""
    prompt = f"### Question:\n{content}\n\n"
    if starter_code:
        prompt += f"### Format: {_WITH_STARTER}\n```python\n{starter_code}\n```\n\n"
    else:
        instruction = _WITHOUT_STARTER + (_STDOUT_SENTENCE if form == "lcb" else "")
        prompt += f"### Format: {instruction}\n```python\n# YOUR CODE HERE\n```\n\n"
    return prompt + "### Answer: (use the provided format with backticks)\n\n"
