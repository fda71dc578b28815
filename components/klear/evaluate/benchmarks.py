"""Benchmark problems: the math sets (`id`, `benchmark`, `problem`, `answer`) and LiveCodeBench files, read into
what the judge checks (klear.judge Problem) and what the model is asked (the prompt), by benchmark of the protocol.

Gold answers and tests come only from here, joined to samples on `id`: never from the sample rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from klear import testsets
from klear.common.records import RecordError, Source, iter_chunks, parse_chunk
from klear.common.sample_rows import prompt_text
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.livecodebench import LcbError, is_livecodebench, lcb_prompt, parse_problem
from klear.judge.problems import Problem

__all__ = ["BenchmarkError", "BenchmarkSet", "EvalProblem", "load_benchmarks"]

log = logging.getLogger("klear.evaluate")

_ROWS_PER_CHUNK = 16  # LiveCodeBench lines hold megabytes of tests: parse a few at a time


class BenchmarkError(RecordError):
    """A benchmark file or row that cannot be used; the message names it."""


@dataclass(frozen=True)
class EvalProblem:
    id: str
    kind: str  # math or code
    benchmarks: tuple[str, ...]
    prompt: str  # the user turn sent to the model
    problem: Problem  # the judge's reference (answer or tests)
    info: dict[str, Any] = field(default_factory=dict)  # code: title, platform, difficulty, contest_date
    where: str = ""
    system: str = ""  # a system turn sent before the prompt ("" = none)


@dataclass
class BenchmarkSet:
    problems: dict[str, EvalProblem] = field(default_factory=dict)
    members: dict[str, list[str]] = field(default_factory=dict)  # benchmark -> problem ids, in input order
    sources: list[dict[str, Any]] = field(default_factory=list)  # uri, kind, rows, used
    outside_windows: list[str] = field(default_factory=list)  # LiveCodeBench ids in no configured window
    shipped_math: bool = False  # no math set was given: the shipped AIME24/AIME25/HMMT25 were used

    def k_of(self, pid: str, config: EvaluateConfig) -> int:
        """Samples a problem needs: the largest k of its benchmarks."""
        return max(config.benchmarks[b].k for b in self.problems[pid].benchmarks)


def _add(found: BenchmarkSet, item: EvalProblem) -> None:
    earlier = found.problems.get(item.id)
    if earlier is not None:
        if earlier.problem.reference_hash != item.problem.reference_hash or earlier.prompt != item.prompt:
            raise BenchmarkError(f"problem id {item.id!r} appears twice with different content: {earlier.where} and "
                                 f"{item.where}")
        item = EvalProblem(item.id, item.kind, tuple(dict.fromkeys(earlier.benchmarks + item.benchmarks)),
                           item.prompt, item.problem, earlier.info, earlier.where, item.system)
    found.problems[item.id] = item
    for name in item.benchmarks:
        ids = found.members.setdefault(name, [])
        if item.id not in ids:
            ids.append(item.id)


def _math_problem(row: dict[str, Any], where: str, source: Source, config: EvaluateConfig) -> EvalProblem | None:
    name = str(row.get("benchmark") or source.name)
    protocol = config.benchmarks.get(name)
    if protocol is None:
        raise BenchmarkError(f"{where}: benchmark {name!r} has no protocol in the config (configured: "
                             f"{', '.join(config.benchmarks)}); add one, e.g. --set benchmarks.{name}.kind=math "
                             f"--set benchmarks.{name}.k=64")
    if protocol.kind != "math":
        raise BenchmarkError(f"{where}: benchmark {name!r} is configured as {protocol.kind}, but this is a math row")
    if name not in config.selected():
        return None
    pid = str(row.get("id") or "").strip()
    text = prompt_text(row)
    answer = row.get("answer")
    if not pid or text is None or answer is None or not str(answer).strip():
        raise BenchmarkError(f"{where}: a math row needs id, problem and answer (fields present: {sorted(row)})")
    problem = Problem.make(pid, "math", str(answer), None, None, source=name, prompt=text)
    return EvalProblem(pid, "math", (name,), config.math_template.format(problem=text), problem, {}, where)


def _code_problem(row: dict[str, Any], where: str, config: EvaluateConfig, found: BenchmarkSet) -> EvalProblem | None:
    try:
        head = parse_problem(row, where, decode_tests=False)
        windows = tuple(name for name, b in config.selected().items() if b.kind == "code" and b.contains(head.day))
        if not windows:
            found.outside_windows.append(head.id)
            return None
        lcb = parse_problem(row, where)
    except LcbError as exc:
        raise BenchmarkError(str(exc)) from None
    problem = Problem.make(lcb.id, "code", None, lcb.tests, lcb.fn_name, source=windows[0], prompt=lcb.content)
    info = {"title": lcb.title, "platform": lcb.platform, "difficulty": lcb.difficulty,
            "contest_date": lcb.day.isoformat(), "tests": len(lcb.tests), "functional": lcb.fn_name is not None}
    return EvalProblem(lcb.id, "code", windows, lcb_prompt(lcb.content, lcb.starter_code, config.code_prompt), problem,
                       info, where, config.code_system_prompt)


def _load_file(spec: str, config: EvaluateConfig, found: BenchmarkSet) -> dict[str, int]:
    source = Source.parse(spec)
    counts = {"rows": 0, "math": 0, "code": 0, "used": 0}
    for chunk in iter_chunks(source, _ROWS_PER_CHUNK):
        for located in parse_chunk(chunk):
            row, where = located.record, located.where
            counts["rows"] += 1
            if is_livecodebench(row):
                counts["code"] += 1
                item = _code_problem(row, where, config, found)
            elif "answer" in row:
                counts["math"] += 1
                item = _math_problem(row, where, source, config)
            else:
                raise BenchmarkError(f"{where}: neither a math row (id, benchmark, problem, answer) nor a "
                                     f"LiveCodeBench row (question_id, question_content, test cases); fields: "
                                     f"{sorted(row)[:12]}")
            if item is not None:
                counts["used"] += 1
                _add(found, item)
    if counts["rows"] == 0:
        raise BenchmarkError(f"{spec}: no rows")
    return counts


def shipped_math_sets(config: EvaluateConfig) -> list[str]:
    """The shipped sets (AIME24/AIME25/HMMT25) that are selected math benchmarks of the protocol: a code-only or
    custom-math protocol reads none of them (their rows would name benchmarks it does not configure)."""
    return [name for name, b in config.selected().items() if b.kind == "math" and name in testsets.NAMES]


def load_benchmarks(uris: Sequence[str], config: EvaluateConfig) -> BenchmarkSet:
    """Every problem of the selected benchmarks in the given files (JSONL/Parquet, local or S3). Without a math set
    among them, the shipped AIME24/AIME25/HMMT25 sets that the protocol selects are read too."""
    found = BenchmarkSet()
    for uri in uris:
        counts = _load_file(uri, config, found)
        found.sources.append({"uri": uri, **counts})
    shipped = shipped_math_sets(config)
    if shipped and not any(s["math"] for s in found.sources):
        found.shipped_math = True
        for path in map(testsets.path, shipped):
            counts = _load_file(str(path), config, found)
            found.sources.append({"uri": f"shipped:{path.name}", **counts})
    empty = [name for name in config.selected() if name not in found.members]
    if empty:
        log.warning("benchmarks without problems in the given files: %s", ", ".join(empty))
    return found
