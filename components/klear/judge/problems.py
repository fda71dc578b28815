"""Problems: what a sample is judged against (a math reference answer, or code test cases), read from any row.

A sample row of `klear sample` carries its prompt's source row as JSON in `record`; when that source row is
curate's output, it holds the original row as JSON in its own `record`, one level deeper.
`klear.common.records.unwrap_record` merges every level into one flat row, the outer level winning (curate's
`prompt` and `id` are the ones it deduplicated), so `answer`, `tests` and `fn_name` are found wherever the
original dataset put them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from klear.common.records import RecordError, Source, iter_training_records, unwrap_record
from klear.common.sample_rows import prompt_text

__all__ = ["Problem", "ProblemError", "load_problems", "parse_tests", "problem_from_row", "problem_row"]

Kind = Literal["math", "code"]


class ProblemError(RecordError):
    """Problems that cannot be read or are inconsistent (duplicate ids with different references)."""


def parse_tests(value: Any) -> list[dict[str, Any]] | None:
    """LiveCodeBench-style test cases ({input, output, testtype?}), given as a list or its JSON; None otherwise."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, list) or not value:
        return None
    tests = []
    for t in value:
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            return None
        tests.append({"input": str(t["input"]), "output": str(t["output"]), "testtype": str(t.get("testtype") or "stdin")})
    return tests


def _fn_name(flat: Mapping[str, Any]) -> str | None:
    name = flat.get("fn_name") or flat.get("func_name")
    if not name and flat.get("metadata"):  # LiveCodeBench keeps it in metadata (JSON): {"func_name": ...}
        meta = flat["metadata"]
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except ValueError:
                meta = None
        if isinstance(meta, dict):
            name = meta.get("func_name")
    return str(name) if name else None


@dataclass(frozen=True)
class Problem:
    """One problem: its id, kind and reference. `kind` None: neither an answer nor tests, so not judged."""

    id: str
    kind: Kind | None
    answer: str | None = None
    tests: list[dict[str, Any]] | None = None
    fn_name: str | None = None
    source: str = ""
    prompt: str = ""
    # sha256 of the reference: part of a score's resume key, so a changed answer or test set is judged again.
    reference_hash: str = field(default="", compare=False)

    @property
    def n_tests(self) -> int:
        return len(self.tests or ())

    @staticmethod
    def make(id: str, kind: Kind | None, answer: str | None, tests: list[dict[str, Any]] | None, fn_name: str | None,
             source: str = "", prompt: str = "") -> Problem:
        ref = json.dumps([kind, answer, tests, fn_name], sort_keys=True).encode()
        return Problem(id, kind, answer, tests, fn_name, source, prompt, hashlib.sha256(ref).hexdigest()[:32])


def problem_from_row(row: Mapping[str, Any], task: str = "auto",
                     fields: Mapping[str, str] | None = None) -> Problem | None:
    """The problem of a row (a sample's `record`, a curate row, a plain dataset row); None if unreadable.

    `fields` maps canonical names (id, prompt, answer, tests, fn_name, source) to the row's own. `task`
    "auto": tests make it code, else an answer makes it math; "math"/"code" read only that reference.
    """
    fields = fields or {}
    flat = unwrap_record(row)
    if flat is None:
        return None
    raw_id = flat.get(fields.get("id", "id"))
    pid = str(raw_id) if raw_id not in (None, "") else ""  # no id: load_problems refuses the row, naming it
    prompt_field = fields.get("prompt")
    prompt = flat.get(prompt_field) if prompt_field else prompt_text(flat)
    raw_answer = flat.get(fields.get("answer", "answer"))
    answer = str(raw_answer) if raw_answer is not None and str(raw_answer).strip() else None
    tests = parse_tests(flat.get(fields.get("tests", "tests")))
    fn_name = flat.get(fields["fn_name"]) if "fn_name" in fields else _fn_name(flat)
    source = str(flat.get(fields.get("source", "source")) or "")
    kind: Kind | None
    if task == "code" or (task == "auto" and tests is not None):
        kind = "code" if tests is not None else None
        answer = None
    else:
        kind = "math" if answer is not None else None
        tests, fn_name = None, None
    return Problem.make(pid, kind, answer, tests, str(fn_name) if fn_name else None, source,
                        prompt if isinstance(prompt, str) else "")


def problem_row(problem: Problem) -> dict[str, Any]:
    """A problems-file row that problem_from_row reads back as `problem` (same reference, so the same verdicts
    and resume keys): how a stage hands its own problems to a judge step (evaluate's benchmarks). Tests as JSON
    text: one column type whatever the test cases hold."""
    return {"id": problem.id, "answer": problem.answer, "fn_name": problem.fn_name, "source": problem.source,
            "prompt": problem.prompt, "tests": json.dumps(problem.tests) if problem.tests is not None else None}


def load_problems(spec: str, task: str = "auto") -> Iterator[tuple[str, Problem]]:
    """(where, problem) for every row of a problem source: a file or published output, with an optional field
    mapping (`URI#id=uid&answer=solution&tests=test_cases`). A row that cannot be read, or that has no id to
    join samples on, is an error naming it."""
    source = Source.parse(spec)
    id_field = source.fields.get("id", "id")
    # A published output is read as training stages read it: curate's kept prompts/, never its removal lists.
    for located in iter_training_records([source.uri]):
        problem = problem_from_row(located.record, task, source.fields)
        if problem is None:
            raise ProblemError(f"{located.where}: its `record` is not a JSON object")
        if not problem.id:
            # An id made up from the line number would match no sample: judging would silently find nothing.
            raise ProblemError(f"{located.where}: field {id_field!r} is missing or empty, so no sample can be "
                               f"matched to this problem; name the id field with {source.uri}#id=FIELD")
        yield located.where, problem
