"""From judged samples to benchmark scores (pure): which samples count, and the scores of each benchmark.

Each problem counts its first k samples by sample index (k of its benchmark); more are ignored (and counted),
fewer is an error naming the problems. A benchmark of which no problem has a single sample under a label is
"not sampled" for that label (reported), not scored as zero.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from klear.evaluate.benchmarks import BenchmarkSet
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.metrics import benchmark_scores
from klear.evaluate.samples import SampleError

__all__ = ["ProblemScore", "SampleScore", "Selection", "score_benchmarks", "select_samples"]


@dataclass(frozen=True)
class SampleScore:
    """One judged sample, without its text."""

    id: str
    sample: int
    correct: bool
    verdict: str
    finish_reason: str | None
    completion_tokens: int | None
    passed: int = 0
    total: int = 0
    extracted: str | None = None


@dataclass
class Selection:
    """What one label's samples contribute: the (id, sample) keys to judge, and what is left out and why."""

    keys: dict[tuple[str, int], str] = field(default_factory=dict)  # chosen key -> origin
    chosen: dict[str, list[int]] = field(default_factory=dict)  # problem id -> its chosen sample indices, ascending
    sampled: list[str] = field(default_factory=list)  # benchmarks with samples
    not_sampled: list[str] = field(default_factory=list)  # benchmarks without a single sample
    beyond_k: int = 0  # rows past their problem's first k samples
    unknown_rows: int = 0  # rows of ids in no selected benchmark (other sets, LiveCodeBench outside the windows)
    unknown_ids: list[str] = field(default_factory=list)  # a few of them, for the report
    shortfalls: list[str] = field(default_factory=list)  # one line per benchmark with too few samples


def select_samples(label: str, keys: Iterable[tuple[str, int, str]], bench: BenchmarkSet, config: EvaluateConfig
                   ) -> Selection:
    """Choose the first k samples of each problem from a label's (id, sample, origin) keys; a key seen twice
    (two sources, or one file repeating a unit) is an error: which response would count?"""
    indices: dict[str, dict[int, str]] = defaultdict(dict)
    out = Selection()
    unknown: dict[str, int] = {}
    for pid, index, origin in keys:
        if pid not in bench.problems:
            unknown[pid] = unknown.get(pid, 0) + 1
            continue
        earlier = indices[pid].get(index)
        if earlier is not None:
            raise SampleError(f"label {label!r}: sample {index} of problem {pid!r} appears twice ({earlier} and "
                              f"{origin}); one response per (id, sample) can be scored")
        indices[pid][index] = origin
    out.unknown_rows = sum(unknown.values())
    out.unknown_ids = sorted(unknown)[: config.max_listed]
    need: dict[str, int] = {}
    for name, protocol in config.selected().items():
        members = bench.members.get(name, [])
        if not any(pid in indices for pid in members):
            out.not_sampled.append(name)
            continue
        out.sampled.append(name)
        short = [(pid, len(indices.get(pid, ()))) for pid in members if len(indices.get(pid, ())) < protocol.k]
        if short:
            shown = ", ".join(f"{pid} ({have} of {protocol.k})" for pid, have in short[: config.max_listed])
            more = f" and {len(short) - config.max_listed} more" if len(short) > config.max_listed else ""
            out.shortfalls.append(f"label {label!r}, {name} (k={protocol.k}): {len(short)} of {len(members)} problems "
                                  f"have fewer samples than k: {shown}{more}")
        for pid in members:
            need[pid] = max(need.get(pid, 0), protocol.k)
    for pid, k in need.items():
        chosen = sorted(indices.get(pid, {}))[:k]
        out.chosen[pid] = chosen
        out.keys.update({(pid, i): indices[pid][i] for i in chosen})
        out.beyond_k += max(0, len(indices.get(pid, {})) - k)
    return out


@dataclass(frozen=True)
class ProblemScore:
    """One problem's row of problems.parquet, for one label and benchmark."""

    label: str
    benchmark: str
    id: str
    k: int
    correct: int
    pass_rate: float
    truncated: int
    mean_completion_tokens: float | None
    verdicts: dict[str, int]
    info: dict[str, Any]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def score_benchmarks(label: str, selection: Selection, scores: Mapping[tuple[str, int], SampleScore],
                     bench: BenchmarkSet, config: EvaluateConfig
                     ) -> tuple[dict[str, dict[str, Any]], list[ProblemScore], dict[str, dict[str, list[int]]]]:
    """Per sampled benchmark: the scores block of report.json; the per-problem rows; the response lengths
    (tokens) of correct and wrong samples for the histograms."""
    blocks: dict[str, dict[str, Any]] = {}
    rows: list[ProblemScore] = []
    lengths: dict[str, dict[str, list[int]]] = {}
    for name in selection.sampled:
        protocol = config.benchmarks[name]
        k = protocol.k
        counts: list[int] = []
        truncated = 0
        tokens: list[int] = []
        verdicts: Counter[str] = Counter()
        by_outcome: dict[str, list[int]] = {"correct": [], "wrong": []}
        for pid in bench.members[name]:
            chosen = [scores[(pid, i)] for i in selection.chosen[pid][:k]]
            correct = sum(s.correct for s in chosen)
            cut = sum(s.finish_reason == "length" for s in chosen)
            problem_tokens = [s.completion_tokens for s in chosen if s.completion_tokens is not None]
            problem_verdicts = Counter(s.verdict for s in chosen)
            counts.append(correct)
            truncated += cut
            tokens += problem_tokens
            verdicts.update(problem_verdicts)
            for s in chosen:
                if s.completion_tokens is not None:
                    by_outcome["correct" if s.correct else "wrong"].append(s.completion_tokens)
            rows.append(ProblemScore(label, name, pid, k, correct, correct / k, cut, _mean(problem_tokens),
                                     dict(problem_verdicts), bench.problems[pid].info))
        block = benchmark_scores(counts, k)
        samples = k * len(counts)
        blocks[name] = {"title": protocol.title or name, "kind": protocol.kind, "k": k, **block,
                        "samples": samples, "correct": sum(counts),
                        "truncated": truncated / samples,
                        "mean_response_tokens": _mean(tokens),
                        "token_counts": len(tokens),
                        "verdicts": dict(verdicts.most_common())}
        if protocol.kind == "code":
            blocks[name]["window"] = [str(protocol.start), str(protocol.end)]
        lengths[name] = by_outcome
    return blocks, rows, lengths

