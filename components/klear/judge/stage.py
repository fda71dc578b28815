"""Entry point of the judge stage: per-sample correctness and per-problem pass rates.

    klear judge --samples URI --output URI [--problems URI[#id=..&answer=..&tests=..]] [--config paper|tiny|FILE]

Scores every sample row of `klear sample` against its problem: math on the last \\boxed{} after </think>
against the reference `answer` (math-verify), code by running the last ```python block on the problem's
`tests` in the sandbox (score = fraction passed, correct = all passed). A truncated response (finish_reason
length) is wrong. Problems come from `--problems` by id, else from each sample's `record` (the prompt's source
row). Judging runs on worker processes with per-sample wall-clock budgets: a hung judgement is killed and
counted, a crashing scorer is counted, the rest goes on. Publishes

    judged/part-*.parquet      the sample rows + kind, correct, score, verdict, passed, total, extracted
    pass_rates/part-*.parquet  per problem: id, kind, samples, correct, pass_rate, mean_score, truncated, unscored
    report.json, report.md, pass_rate_hist.png

atomically (manifest last). Resumable: scores are saved under the output chunk by chunk, keyed by (id, sample)
and a fingerprint of response, reference and settings; a restart judges only what is missing.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from klear.common import storage
from klear.common.data_stage import DataStage
from klear.common.records import ParquetShardWriter
from klear.common.sample_rows import SampleInputError, iter_sample_tables
from klear.judge.config import JudgeConfig
from klear.judge.io import JUDGE_COLUMNS, ScoreStore, fingerprint, judgement_columns, settings_key
from klear.judge.modes import ModeComparison
from klear.judge.plots import histogram_png
from klear.judge.pool import Judge, resolve_problems
from klear.judge.problems import Problem, ProblemError, load_problems
from klear.judge.rates import PassRateTable, histogram
from klear.judge.report import render_markdown
from klear.judge.scoring import Judgement

log = logging.getLogger("klear.judge")
STAGE = DataStage("judge", JudgeConfig, render_markdown)

PASS_RATE_SCHEMA = pa.schema([
    ("id", pa.string()), ("kind", pa.string()), ("samples", pa.int64()), ("correct", pa.int64()),
    ("pass_rate", pa.float64()), ("mean_score", pa.float64()), ("truncated", pa.int64()), ("unscored", pa.int64()),
])
_ROW_FIELDS = ("id", "sample", "response", "finish_reason", "record")


def load_problem_map(spec: str, task: str = "auto") -> dict[str, Problem]:
    """Problems by id; the same id twice with different references is an error naming both rows."""
    problems: dict[str, Problem] = {}
    where_of: dict[str, str] = {}
    for where, problem in load_problems(spec, task):
        previous = problems.get(problem.id)
        if previous is not None and previous.reference_hash != problem.reference_hash:
            raise ProblemError(f"problem id {problem.id!r} appears twice with different references: "
                               f"{where_of[problem.id]} and {where}")
        problems.setdefault(problem.id, problem)
        where_of.setdefault(problem.id, where)
    return problems


def sample_settings_of(samples: str) -> dict[str, Any] | None:
    """The settings the input's samples were taken under, as `klear sample` recorded them (identity, sampling),
    read from its manifest or carried by a judge output; None for a plain file or an output without them. The
    judge output carries them on, so evaluate checks judged samples against the protocol as it checks raw ones."""
    loc = storage.Uri.parse(samples)
    if not storage.is_dir(loc):
        return None
    try:
        meta = storage.read_manifest(loc).meta
    except storage.UnpublishedOutputError:
        return None  # the reader refuses it by name
    settings = {"sample": meta.get("settings"), "judge": meta.get("sample_settings")}.get(str(meta.get("stage")))
    return settings if isinstance(settings, dict) else None


class _Tally:
    """Counts for the report, per task kind and verdict."""

    def __init__(self) -> None:
        self.verdicts: dict[str, Counter[str]] = defaultdict(Counter)
        self.rates = PassRateTable()
        self.samples = self.reused = 0
        self.unknown_examples: list[str] = []

    def add(self, row_id: Any, j: Judgement) -> None:
        self.samples += 1
        self.verdicts[j.kind][j.verdict] += 1
        self.rates.add({"id": row_id, "kind": j.kind, "correct": j.correct, "score": j.score, "verdict": j.verdict})
        if j.verdict == "unknown_problem" and len(self.unknown_examples) < 20 and str(row_id) not in self.unknown_examples:
            self.unknown_examples.append(str(row_id))

    def unmatched(self) -> int:
        """Samples whose id is not among the problems."""
        return sum(verdicts["unknown_problem"] for verdicts in self.verdicts.values())

    def unreferenced(self) -> int:
        """Samples whose problem has neither an answer nor tests."""
        return sum(verdicts["no_reference"] for verdicts in self.verdicts.values())


def _judge_batch(table: pa.Table, judge: Judge, problems: Mapping[str, Problem] | None,
                 saved: Mapping[tuple[str, int], tuple[str, dict[str, Any]]],
                 store: ScoreStore | None, lease: storage.OutputLease) -> tuple[list[Judgement], int]:
    """Judgements of one batch, reusing saved ones whose fingerprint still matches; saves the new ones."""
    rows = table.select([c for c in _ROW_FIELDS if c in table.column_names]).to_pylist()
    problem_of = resolve_problems(rows, problems, judge.config.task)
    prints = [fingerprint(str(r.get("response") or ""), r.get("finish_reason"), p) for r, p in zip(rows, problem_of)]
    out: list[Judgement | None] = [None] * len(rows)
    todo = []
    for i, (row, fp) in enumerate(zip(rows, prints)):
        hit = saved.get((str(row["id"]), int(row["sample"])))
        if hit is not None and hit[0] == fp:
            out[i] = Judgement(**hit[1])
        else:
            todo.append(i)
    fresh = judge.judge([rows[i] for i in todo], [problem_of[i] for i in todo])
    for i, j in zip(todo, fresh):
        out[i] = j
    if store is not None and fresh:
        lease.dirty = True  # files no manifest lists: a crash leaves a marker that they are klear's own
        store.save([{"id": str(rows[i]["id"]), "sample": int(rows[i]["sample"]), "fingerprint": prints[i], **j.to_dict()}
                    for i, j in zip(todo, fresh)])
    return [j for j in out if j is not None], len(rows) - len(todo)


def run(samples: str, output: str, config: JudgeConfig, problems: str | None = None) -> dict[str, Any]:
    """Judge the samples at `samples` and publish to `output`; returns the report."""
    started = time.monotonic()
    checked = STAGE.check(output, {"samples": samples, "problems": problems})
    problem_map = load_problem_map(problems, config.task) if problems else None
    sampled_under = sample_settings_of(samples)
    tally = _Tally()
    with checked.open() as out, Judge(config) as judge:
        modes = ModeComparison(config)  # closes its own judges in summary() (and at exit)
        staging = out.staging
        store = ScoreStore(output, settings_key(config)) if config.resume else None
        saved = store.load() if store is not None else {}
        writer: ParquetShardWriter | None = None
        last_log = time.monotonic()
        for origin, table in iter_sample_tables(samples, config.chunk_size):
            table = table.drop_columns([c for c in JUDGE_COLUMNS if c in table.column_names])
            judgements, reused = _judge_batch(table, judge, problem_map, saved, store, out.lease)
            tally.reused += reused
            mode_rows = table.select([c for c in _ROW_FIELDS if c in table.column_names]).to_pylist() if modes.judges else []
            modes.add(mode_rows, resolve_problems(mode_rows, problem_map, config.task) if mode_rows else [], judgements)
            for row_id, j in zip(table.column("id").to_pylist(), judgements):
                tally.add(row_id, j)
            for name, column in judgement_columns(judgements).items():
                table = table.append_column(name, column)
            if writer is None:
                writer = ParquetShardWriter(staging / "judged", "part", table.schema, config.rows_per_shard,
                                            dictionary_columns=("kind", "verdict", "finish_reason"))
            try:
                writer.write(table)
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
                raise SampleInputError(f"{origin}: columns differ from the first batch's ({exc})") from None
            if time.monotonic() - last_log >= config.progress_seconds:
                last_log = time.monotonic()
                log.info("%d samples judged (%d reused), %.1f samples/s", tally.samples, tally.reused,
                         tally.samples / (last_log - started))
        if writer is None or tally.samples == 0:
            raise SampleInputError(f"{samples} holds no sample rows: nothing to judge, nothing published")
        unmatched = tally.unmatched()
        if unmatched == tally.samples:
            where = f"the problems of {problems}" if problems else "their records"
            raise SampleInputError(
                f"none of the {tally.samples} samples in {samples} matches a problem of {where} (sample ids such as "
                f"{', '.join(tally.unknown_examples[:5])}): judging nothing is no result, nothing published; check "
                "the problems' id field (URI#id=FIELD)")
        if unmatched + tally.unreferenced() == tally.samples:
            where = f"the problems of {problems}" if problems else "the samples' records"
            fields = f"{problems}#answer=FIELD&tests=FIELD" if problems else "an answer or tests field in each record"
            raise SampleInputError(
                f"none of the {tally.samples} samples in {samples} has a problem with an answer or tests in {where}: "
                f"judging nothing is no result, nothing published; check the reference fields ({fields})")
        if unmatched:
            log.warning("%d of %d samples match no problem (ids such as %s): they count as wrong; see report.md",
                        unmatched, tally.samples, ", ".join(tally.unknown_examples[:5]))
        writer.close()
        rates = tally.rates.rows()
        rate_writer = ParquetShardWriter(staging / "pass_rates", "part", PASS_RATE_SCHEMA, config.rows_per_shard)
        rate_writer.write({name: [getattr(r, name) for r in rates] for name in PASS_RATE_SCHEMA.names})
        rate_writer.close()
        elapsed = time.monotonic() - started
        report = _report(samples, problems, config, tally, rates, judge, elapsed)
        report["sample_settings"] = sampled_under
        report["math_mode"], report["math_modes"] = config.verifier.math_mode, modes.summary()
        histogram_png(staging / "pass_rate_hist.png",
                      {kind: [r.pass_rate for r in rates if r.kind == kind and r.pass_rate is not None]
                       for kind in ("math", "code")},
                      bins=[i / 10 for i in range(11)], title="Pass rate per problem", xlabel="pass rate")
        out.publish(report, {"samples": tally.samples, "problems": len(rates), "settings_key": settings_key(config),
                             "sample_settings": sampled_under})
    log.info("published %s: %d samples of %d problems judged (%.1f s)", output, tally.samples, len(rates), elapsed)
    return report


def _report(samples: str, problems: str | None, config: JudgeConfig, tally: _Tally, rates: list[Any], judge: Judge,
            elapsed: float) -> dict[str, Any]:
    per_kind = {}
    for kind, verdicts in sorted(tally.verdicts.items()):
        n, correct = sum(verdicts.values()), verdicts["correct"]
        kind_rates = [r.pass_rate for r in rates if r.kind == kind and r.pass_rate is not None]
        per_kind[kind] = {"samples": n, "correct": correct, "accuracy": correct / n if kind != "none" and n else None,
                          "problems": sum(r.kind == kind for r in rates),
                          "mean_pass_rate": sum(kind_rates) / len(kind_rates) if kind_rates else None,
                          "pass_rate_histogram": histogram(kind_rates)}
    all_verdicts: Counter[str] = Counter()
    for verdicts in tally.verdicts.values():
        all_verdicts.update(verdicts)
    return {
        "stage": "judge",
        "samples": samples,
        "problems": problems or "each sample's record",
        "totals": {"samples": tally.samples, "problems": len(rates), "reused": tally.reused,
                   "correct": all_verdicts["correct"],
                   **{v: all_verdicts[v] for v in ("budget_timeout", "scorer_error", "truncated", "no_reference",
                                                   "unknown_problem")}},
        "per_kind": per_kind,
        "verdicts": {kind: dict(v) for kind, v in sorted(tally.verdicts.items())},
        "unknown_problem_ids": tally.unknown_examples,
        "config": config.model_dump(mode="json"),
        "workers": judge.workers,
        "elapsed_s": round(elapsed, 3),
        "samples_per_s": round(tally.samples / elapsed, 2) if elapsed > 0 else None,
    }


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("judge", help="per-sample correctness and per-problem pass rates of sampled responses",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", required=True, metavar="URI", help="output of `klear sample` (or a Parquet/JSONL file)")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    parser.add_argument("--problems", default=None, metavar="URI",
                        help="problems by id, URI[#id=F&answer=F&tests=F&fn_name=F] (default: each sample's record)")
    STAGE.add_main(parser, lambda args, config: run(args.samples, args.output, config, args.problems),
                   lambda report: report["totals"])
