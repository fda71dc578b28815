"""Entry point of the judge stage: per-sample correctness and per-problem pass rates.

    klear judge --samples URI --output URI [--problems URI[#id=..&answer=..&tests=..]] [--config paper|tiny|FILE]
                [--work URI] [--slice I/N | --merge]

Scores every sample row of `klear sample` against its problem: math on the last \\boxed{} after </think>
against the reference `answer` (math-verify), code by running the last ```python block on the problem's
`tests` in the sandbox (score = fraction passed, correct = all passed). A truncated response (finish_reason
length) is wrong. Problems come from `--problems` by id, else from each sample's `record` (the prompt's source
row). Judging runs on worker processes with per-sample wall-clock budgets: a hung judgement is killed and
counted, a crashing scorer is counted, the rest goes on. Publishes

    judged/part-*.parquet      the sample rows + kind, correct, score, verdict, passed, total, extracted
    pass_rates/part-*.parquet  per problem: id, kind, samples, correct, pass_rate, mean_score, truncated, unscored
    report.json, report.md, pass_rate_hist.png

atomically (manifest last). Each Parquet part goes up as soon as it is closed and leaves the pod's disk, and the
samples are read one published part at a time, so a pod holds a part or two on disk, never its input or output
whole; a refusal found after a part went up (columns that differ, no sample matching a problem) withdraws the
parts: nothing is published, no part is left. Resumable: scores are saved under the output chunk by chunk, keyed
by (id, sample) and a fingerprint of response, reference and settings; a restart judges only what is missing.

Over many pods: `--slice I/N` judges only the samples whose id hashes into slice I of N (the rule sampling
slices by, klear.common.slices), saving their scores in the work area every slice shares (default
<output>.work: _scores/<settings key>/) and its part (counts, settings, input digest) in
<work>/slices/I-of-N/part.json; it publishes nothing (one pod per slice: that folder is its lease). `--merge`,
with the same flags, judges nothing: once every slice of N has left its part for these settings and inputs, it
writes the output from the saved scores in the samples' order (the rows and figures an unsliced run gives) and
publishes; a missing part or a sample no slice judged is named and refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from klear.common import storage
from klear.common.data_stage import DataStage, StageOutput
from klear.common.records import ParquetShardWriter
from klear.common.sample_rows import SampleInputError, iter_sample_tables
from klear.common.slices import (
    MergeIncompleteError,
    add_slice_arguments,
    claim_slice,
    parse_slice,
    refuse_foreign_work,
    slice_folder,
    slice_of,
    work_beside,
    work_file_pattern,
)
from klear.judge.config import JudgeConfig
from klear.judge.io import JUDGE_COLUMNS, ScoreStore, fingerprint, judgement_columns, references_key, settings_key
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


def _judge_batch(table: pa.Table, judge: Judge | SliceScores, problems: Mapping[str, Problem] | None,
                 saved: Mapping[tuple[str, int], tuple[str, dict[str, Any]]],
                 store: ScoreStore | None) -> tuple[list[Judgement], int]:
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
        store.save([{"id": str(rows[i]["id"]), "sample": int(rows[i]["sample"]), "fingerprint": prints[i], **j.to_dict()}
                    for i, j in zip(todo, fresh)])
    return [j for j in out if j is not None], len(rows) - len(todo)


def run(samples: str, output: str, config: JudgeConfig, problems: str | None = None, work: str | None = None,
        slice_spec: str | None = None, merge: bool = False) -> dict[str, Any]:
    """Judge the samples at `samples` and publish to `output`; returns the report.

    `slice_spec` "I/N": judge only the samples of slice I of N into the work area, publish nothing (run_slice);
    `merge`: judge nothing, publish from the slices' scores once every slice's part is there. With `problems`,
    the output records their `references_key`: a stage that takes the verdicts as they are (evaluate, handing
    its benchmarks as a problems file) checks they were judged against its own problems."""
    started = time.monotonic()
    if slice_spec is not None and merge:
        raise ValueError("--slice and --merge exclude each other: slices judge, the merge publishes")
    part = parse_slice(slice_spec) if slice_spec is not None else None
    sliced = part is not None or merge
    work_uri = str(work or work_beside(storage.Uri.parse(output))) if sliced else None
    checked = STAGE.check(output, {"samples": samples, "problems": problems}, work=work_uri,
                          role="--output" if sliced else "output", config=config)
    if checked.work is not None:
        refuse_foreign_work(checked.work, is_work_file, "judge")
    problem_map = load_problem_map(problems, config.task) if problems else None
    if part is not None:
        return run_slice(part, samples, problems, checked, config, problem_map, started)
    sampled_under = sample_settings_of(samples)
    tally = _Tally()
    merged = SliceScores.open(checked, config, inputs_digest(samples, problems)) if merge else None
    if merged is not None and merged.published is not None:
        return merged.published  # a retried merge whose first try had published
    # Each part goes up once closed (out.ship), so the pod's disk holds a part or two, never the output; a refusal
    # found after the first (columns that differ, no problem matched, a sample no slice judged) withdraws them.
    with checked.open() as out, out.streamed.withdrawn_on_error(), merged or Judge(config) as judge:
        modes = ModeComparison(config)  # closes its own judges in summary() (and at exit)
        staging = out.staging
        shipped = 0  # parts of `writer` uploaded
        store = (ScoreStore(output, settings_key(config), out.lease, STAGE.name)
                 if config.resume and merged is None else None)
        saved = merged.saved if merged is not None else store.load() if store is not None else {}
        writer: ParquetShardWriter | None = None
        last_log = time.monotonic()
        for origin, table in iter_sample_tables(samples, config.chunk_size):
            table = table.drop_columns([c for c in JUDGE_COLUMNS if c in table.column_names])
            judgements, reused = _judge_batch(table, judge, problem_map, saved, store)
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
            for start in range(0, table.num_rows, config.rows_per_shard):  # each part goes up as soon as it closes
                try:
                    writer.write(table.slice(start, config.rows_per_shard))
                except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, KeyError) as exc:  # KeyError: one missing
                    raise SampleInputError(f"{origin}: columns differ from the first batch's ({exc})") from None
                shipped = ship_closed(writer, shipped, out.ship)
            if time.monotonic() - last_log >= config.progress_seconds:
                last_log = time.monotonic()
                log.info("%d samples judged (%d reused), %.1f samples/s", tally.samples, tally.reused,
                         tally.samples / (last_log - started))
        judge.check_scorer_works()
        if merged is not None:
            merged.check_complete(tally.samples)
            tally.reused = merged.reused
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
        ship_closed(writer, shipped, out.ship, every=True)
        rates = tally.rates.rows()
        rate_writer = ParquetShardWriter(staging / "pass_rates", "part", PASS_RATE_SCHEMA, config.rows_per_shard)
        rate_writer.write({name: [getattr(r, name) for r in rates] for name in PASS_RATE_SCHEMA.names})
        rate_writer.close()
        ship_closed(rate_writer, 0, out.ship, every=True)
        elapsed = time.monotonic() - started
        report = _report(samples, problems, config, tally, rates, judge, elapsed)
        report["sample_settings"] = sampled_under
        report["math_mode"], report["math_modes"] = config.verifier.math_mode, modes.summary()
        histogram_png(staging / "pass_rate_hist.png",
                      {kind: [r.pass_rate for r in rates if r.kind == kind and r.pass_rate is not None]
                       for kind in ("math", "code")},
                      bins=[i / 10 for i in range(11)], title="Pass rate per problem", xlabel="pass rate")
        meta = {"samples": tally.samples, "problems": len(rates), "settings_key": settings_key(config),
                "sample_settings": sampled_under}
        if problem_map is not None:
            meta["references_key"] = references_key(problem_map)
        if merged is not None:
            report["slices"] = merged.slices
            meta |= {"inputs_digest": merged.digest, "slices": len(merged.slices)}
        out.publish(report, meta)
    if merged is not None:
        merged.delete_work()
    log.info("published %s: %d samples of %d problems judged (%.1f s)", output, tally.samples, len(rates), elapsed)
    return report


def ship_closed(writer: ParquetShardWriter, shipped: int, ship: Callable[[Path], None], every: bool = False) -> int:
    """Hand `ship` (Publication.ship: upload, then delete here) each part of `writer` closed since its first `shipped`
    went; returns how many have gone. After a write every part but the last is closed; `every`: after close, all."""
    closed = len(writer.shards) - (0 if every else 1)
    for path in writer.shards[shipped:closed]:
        ship(path)
    return max(shipped, closed)


def _report(samples: str, problems: str | None, config: JudgeConfig, tally: _Tally, rates: list[Any],
            judge: Judge | SliceScores, elapsed: float) -> dict[str, Any]:
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


# --------------------------------------------------------------------------- slices and their merge


_PART = re.compile(r"([0-9]+)-of-([0-9]+)/part\.json")
# What a judge work area holds: the slices' saved scores (per settings key), their parts and leases.
_WORK_FILE = work_file_pattern(rf"{ScoreStore.FOLDER}/[^/]+/chunk-[^/]+\.parquet",
                               r"slices/[0-9]+-of-[0-9]+/(part\.json|_LEASE\.json)")


def is_work_file(rel: str) -> bool:
    return _WORK_FILE.fullmatch(rel) is not None


def inputs_digest(samples: str, problems: str | None) -> str:
    """The content of what the slices judge (samples and problems): a merge takes only parts of the same."""
    from klear.common.kfp_io import inputs_digest as digest

    return digest([samples, problems or ""])


def run_slice(part: tuple[int, int], samples: str, problems: str | None, checked: StageOutput,
              config: JudgeConfig, problem_map: Mapping[str, Problem] | None, started: float) -> dict[str, Any]:
    """Judge the samples of slice I of N, saving their scores in the shared work area, then leave the slice's
    part for the merge; publish nothing. One pod per slice: the slice's folder is its lease."""
    index, count = part
    assert checked.work is not None
    where = slice_folder(checked.work, index, count)
    key = settings_key(config)
    with contextlib.ExitStack() as stack:
        stack.enter_context(claim_slice(checked.work, index, count, checked.uri, "judged"))
        digest = inputs_digest(samples, problems)
        judge = stack.enter_context(Judge(config))
        store = ScoreStore(str(checked.work), key)  # always saved: the merge reads them
        saved = store.load() if config.resume else {}
        judged = reused = read = 0
        last_log = time.monotonic()
        for _, table in iter_sample_tables(samples, config.chunk_size):
            read += table.num_rows
            mine = pa.array([slice_of(str(i), count) == index for i in table.column("id").to_pylist()], pa.bool_())
            table = table.filter(mine)
            if table.num_rows == 0:
                continue
            table = table.drop_columns([c for c in JUDGE_COLUMNS if c in table.column_names])
            judgements, hits = _judge_batch(table, judge, problem_map, saved, store)
            judged, reused = judged + len(judgements), reused + hits
            if time.monotonic() - last_log >= config.progress_seconds:
                last_log = time.monotonic()
                log.info("slice %d/%d: %d samples judged (%d reused) of %d read", index, count, judged, reused, read)
        report = {"stage": "judge", "slice": f"{index}/{count}", "published": False, "output": str(checked.uri),
                  "work": str(checked.work), "settings_key": key, "inputs_digest": digest,
                  "samples": judged, "reused": reused, "read": read, "workers": judge.workers,
                  "budget_timeouts": judge.timeouts, "scorer_errors": judge.errors,
                  "elapsed_s": round(time.monotonic() - started, 3)}
        judge.check_scorer_works()
        # Last: a slice whose part is there has saved every score of its samples.
        storage.write_bytes(where.join("part.json"), json.dumps(report, indent=2).encode())
    log.info("slice %d/%d of %s: %d samples judged (%d reused); the merge publishes", index, count, checked.uri,
             judged, reused)
    return report


def complete_count(parts: Mapping[int, Mapping[int, Any]]) -> int:
    """The slice count N whose every part 0..N-1 is there (the largest, when several are); a MergeIncompleteError
    naming the missing slices of the count nearest to complete otherwise. `parts`: N -> index -> part."""
    complete = [n for n, got in parts.items() if set(got) == set(range(n))]
    if complete:
        return max(complete)
    if not parts:
        raise MergeIncompleteError("no slice has judged these samples under these settings yet")
    n = max(parts, key=lambda c: (len(parts[c]) / c, c))
    missing = [f"{i}/{n}" for i in range(n) if i not in parts[n]]
    raise MergeIncompleteError(f"{len(missing)} of {n} slices have left no part ({', '.join(missing[:10])}"
                               f"{' ...' if len(missing) > 10 else ''}): they have not finished")


class SliceScores:
    """The merge's judge: judges nothing, answers from the scores the slices saved, and counts the samples no
    slice judged (under these settings, for this response and reference) so the merge can refuse, naming them."""

    def __init__(self, config: JudgeConfig, work: storage.Uri, parts: list[dict[str, Any]], digest: str,
                 published: dict[str, Any] | None = None):
        self.config, self.work, self.parts, self.digest, self.published = config, work, parts, digest, published
        self.count = int(parts[0]["slice"].split("/")[1]) if parts else 0
        self.workers = max((int(p["workers"]) for p in parts), default=0)
        self.reused = sum(int(p["reused"]) for p in parts)
        self.slices = {p["slice"]: {"samples": p["samples"], "reused": p["reused"]} for p in parts}
        self.saved: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}
        self.missing: list[tuple[str, int]] = []
        self.missing_count = 0

    @classmethod
    def open(cls, checked: StageOutput, config: JudgeConfig, digest: str) -> SliceScores:
        """The finished parts of one slice count for these settings and inputs, and their scores; a published
        output of the same settings and inputs is returned as `published` (nothing left to merge)."""
        assert checked.work is not None
        key = settings_key(config)
        try:
            meta = storage.read_manifest(checked.uri).meta
        except storage.UnpublishedOutputError:
            meta = {}
        if meta.get("stage") == "judge" and meta.get("settings_key") == key and meta.get("inputs_digest") == digest:
            log.info("%s already holds the merge of these samples under these settings", checked.uri)
            return cls(config, checked.work, [], digest, dict(json.loads(storage.read_bytes(
                checked.uri.join("report.json")))))
        parts: dict[int, dict[int, dict[str, Any]]] = {}
        others: list[str] = []  # parts of other inputs or settings: named when they are what is missing
        for rel in storage.list_files(checked.work.join("slices")):
            found = _PART.fullmatch(rel)
            if found is None:
                continue
            part = json.loads(storage.read_bytes(checked.work.join("slices", rel)))
            if part.get("settings_key") == key and part.get("inputs_digest") == digest:
                parts.setdefault(int(found[2]), {})[int(found[1])] = part
            else:
                differs = "samples or problems" if part.get("inputs_digest") != digest else "judge settings"
                others.append(f"{found[1]}/{found[2]} judged other {differs}")
        try:
            count = complete_count(parts)
        except MergeIncompleteError as exc:
            mismatch = (f"; the work area holds parts that do not match this merge ({', '.join(others[:5])}"
                        f"{' ...' if len(others) > 5 else ''}): the slices and the merge must be given the same "
                        "--samples, --problems and settings") if others else ""
            raise MergeIncompleteError(f"{checked.work}: {exc}{mismatch}. Run `klear judge ... --slice I/N` with "
                                       "the same flags for each of them, then merge; nothing published") from None
        merged = cls(config, checked.work, [parts[count][i] for i in range(count)], digest)
        merged.saved = ScoreStore(str(checked.work), key).load()
        return merged

    def __enter__(self) -> SliceScores:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def judge(self, rows: list[dict[str, Any]], problems: list[Problem | None]) -> list[Judgement]:
        self.missing_count += len(rows)
        self.missing += [(str(r["id"]), int(r["sample"])) for r in rows[: max(0, 5 - len(self.missing))]]
        return [Judgement("none", False, 0.0, "not_judged") for _ in rows]

    def check_scorer_works(self) -> None:
        """Each slice checked its own scorer before leaving its part."""

    def check_complete(self, samples: int) -> None:
        if not self.missing_count:
            return
        shown = ", ".join(f"{i}#{j} (slice {slice_of(i, self.count)}/{self.count})" for i, j in self.missing)
        raise MergeIncompleteError(
            f"{self.missing_count} of {samples} samples were judged by no slice under these settings for their "
            f"current response and reference ({shown}{' ...' if self.missing_count > len(self.missing) else ''}): "
            f"rerun those slices, then merge; nothing published")

    def delete_work(self) -> None:
        """Once published, remove what the merged slices wrote (their scores under these settings, their parts and
        leases); the work area's other files, other settings' scores and other slice counts' parts, stay."""
        key = settings_key(self.config)
        ours = re.compile(rf"{re.escape(ScoreStore.FOLDER)}/{re.escape(key)}/[^/]+\.parquet"
                          rf"|slices/[0-9]+-of-{self.count}/(part\.json|_LEASE\.json)")
        storage.delete_files(self.work, lambda rel: ours.fullmatch(rel) is not None)


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("judge", help="per-sample correctness and per-problem pass rates of sampled responses",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", required=True, metavar="URI", help="output of `klear sample` (or a Parquet/JSONL file)")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    parser.add_argument("--problems", default=None, metavar="URI",
                        help="problems by id, URI[#id=F&answer=F&tests=F&fn_name=F] (default: each sample's record)")
    parser.add_argument("--work", metavar="URI", help="work area the slices and their merge share (default: <output>.work)")
    add_slice_arguments(parser, "judge", "sample",
                        "judge nothing: publish the slices' judgements once every slice of N has left its part")
    STAGE.add_main(parser, lambda args, config: run(args.samples, args.output, config, args.problems, work=args.work,
                                                    slice_spec=args.slice_spec, merge=args.merge),
                   lambda report: report.get("totals") or {k: report[k] for k in ("slice", "samples", "reused")})
