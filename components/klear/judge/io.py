"""The judge's resume store, and judged rows for the stages that judge as they read (sft-data, rl-filter).

Sample rows are read through klear.common.sample_rows (the contract: fields, types, no (id, sample) twice).
Judged rows add the JUDGE_COLUMNS.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import storage
from klear.common.sample_rows import REQUIRED, SampleInputError, iter_sample_tables
from klear.judge.config import JudgeConfig
from klear.judge.problems import Problem

__all__ = ["JUDGE_COLUMNS", "JUDGE_SCHEMA", "SampleInputError", "ScoreStore", "fingerprint", "is_judged",
           "iter_judged", "judgement_columns", "references_key", "settings_key"]

log = logging.getLogger("klear.judge")

JUDGE_SCHEMA = pa.schema([
    ("kind", pa.string()), ("correct", pa.bool_()), ("score", pa.float64()), ("verdict", pa.string()),
    ("passed", pa.int32()), ("total", pa.int32()), ("extracted", pa.string()),
])
JUDGE_COLUMNS = tuple(JUDGE_SCHEMA.names)


def is_judged(names: Sequence[str]) -> bool:
    """Rows already judged (the judge's output): they carry `correct` and `verdict`."""
    return {"correct", "verdict"} <= set(names)


# --------------------------------------------------------------------------- resume


def settings_key(config: JudgeConfig) -> str:
    """What makes two judgements of one response comparable: the scorer, the verifier settings, the task rule."""
    body = json.dumps([config.scorer, config.task, config.verifier.model_dump(mode="json")], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def references_key(problems: Mapping[str, Problem]) -> str:
    """What the problems a run judged against hold: every id with its reference (answer or tests). A stage that
    takes judged rows as they are (evaluate) checks it against its own problems."""
    body = json.dumps(sorted((pid, problem.reference_hash) for pid, problem in problems.items()))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def fingerprint(response: str, finish_reason: Any, problem: Problem | None) -> str:
    """A score is reused only for the same response, finish reason and reference (answer or tests)."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(response.encode("utf-8", "surrogatepass"))
    digest.update(f"\0{finish_reason}\0{problem.reference_hash if problem else '-'}".encode())
    return digest.hexdigest()


STORE_SCHEMA = pa.schema([("id", pa.string()), ("sample", pa.int64()), ("fingerprint", pa.string()), *JUDGE_SCHEMA])


class ScoreStore:
    """Scores saved under `<output>/_scores/<settings key>/` while a run goes on, one Parquet file per chunk.

    Inside an output, `lease` (the output's) names the folder in a pending record before the first file, so a
    crashed run's files are known as the stage's own; the final publish removes them (its manifest does not list
    them). In a work area (no lease) the work area's own rules apply. A file that cannot be read is ignored: its
    samples are judged again.
    """

    FOLDER = "_scores"

    def __init__(self, output: str, key: str, lease: storage.OutputLease | None = None, stage: str | None = None):
        self.lease, self.stage = lease, stage
        self.prefix = storage.Uri.parse(output).join(self.FOLDER, key)
        self._run = uuid.uuid4().hex[:8]
        self._count = 0

    def load(self) -> dict[tuple[str, int], tuple[str, dict[str, Any]]]:
        """(id, sample) -> (fingerprint, judgement fields) of every score saved by earlier runs."""
        saved: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}
        names = [n for n in storage.list_files(self.prefix) if n.endswith(".parquet") and "/" not in n]
        for name in names:
            try:
                rows = pq.read_table(io.BytesIO(storage.read_bytes(self.prefix.join(name)))).to_pylist()
            except (pa.ArrowInvalid, OSError, storage.StorageError) as exc:
                log.warning("ignoring unreadable saved scores %s (%s): judging them again", self.prefix.join(name), exc)
                continue
            for row in rows:
                saved[(row.pop("id"), row.pop("sample"))] = (row.pop("fingerprint"), row)
        if saved:
            log.info("resuming: %d saved scores in %d files under %s", len(saved), len(names), self.prefix)
        return saved

    def save(self, rows: list[Mapping[str, Any]]) -> None:
        if not rows:
            return
        if self.lease is not None:
            self.lease.hold(self.stage, f"{self.FOLDER}/")
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist([dict(r) for r in rows], schema=STORE_SCHEMA), sink, compression="zstd")
        storage.write_bytes(self.prefix.join(f"chunk-{self._run}-{self._count:06d}.parquet"), sink.getvalue())
        self._count += 1


# --------------------------------------------------------------------------- judged rows for other stages


def judgement_columns(judgements: Sequence[Any]) -> dict[str, pa.Array]:
    """The JUDGE_COLUMNS of a batch, from its Judgements (klear.judge.scoring.Judgement)."""
    return {name: pa.array([getattr(j, name) for j in judgements], JUDGE_SCHEMA.field(name).type)
            for name in JUDGE_COLUMNS}


def iter_judged(uri: str, judge: Any, problems: Mapping[str, Problem] | None = None, batch_rows: int = 2048,
                columns: Sequence[str] | None = None,
                wanted: Callable[[Mapping[str, Any]], bool] | None = None) -> Iterator[list[dict[str, Any]]]:
    """Batches of judged sample rows (dicts) from a sample source. Rows the judge already judged (its output)
    pass through unchanged; raw samples are judged now by `judge` (an open klear.judge.pool.Judge) against
    `problems` by id, or against their own `record`. `columns`: the input columns to keep (default: all);
    `wanted`: rows it rejects are left out before judging (no verifier time on problems already dropped)."""
    from klear.judge.pool import resolve_problems

    for _, table in iter_sample_tables(uri, batch_rows):
        if columns is not None:
            table = table.select([c for c in dict.fromkeys([*REQUIRED, *columns, *JUDGE_COLUMNS]) if c in table.column_names])
        rows = table.to_pylist()
        if wanted is not None:
            rows = [row for row in rows if wanted(row)]
        if is_judged(table.column_names):
            yield rows
            continue
        judgements = judge.judge(rows, resolve_problems(rows, problems, judge.config.task))
        yield [{**row, **j.to_dict()} for row, j in zip(rows, judgements)]
