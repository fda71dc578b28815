"""The sample-row contract through the real commands: every stage that reads sample rows (judge, sft-data,
rl-filter, evaluate) refuses a second row for one (id, sample) and an ill-typed field, naming the file, the line
(JSONL) or row (Parquet) and the field, and publishes nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from klear.cli import main
from klear.common import storage
from klear.common.sample_rows import SAMPLE_SCHEMA, iter_sample_tables
from klear.sample.store import SCHEMA as WRITTEN_SCHEMA
from tests.commands import sample_row_readers
from tests.judge.samples import boxed, math_record, publish_samples, sample_row

# Every stage that reads sample rows (from the registry and the stages' imports: a new reader is in the list).
COMMANDS = sample_row_readers()
# Evaluate's toy benchmark: k=4 samples of each of its problems.
TOY = ["benchmarks.toy.kind=math", "benchmarks.toy.k=4", "benchmarks.toy.title=Toy", "only=[toy]",
       "settings_check=warn"]  # plain rows: no recorded settings, not the protocol's prompts


def _rows() -> list[dict[str, Any]]:
    """p1: 3 of 4 right; p2: 1 of 4 right."""
    rows = [sample_row("p1", k, boxed(a), math_record("p1", "6")) for k, a in enumerate(["6", "6", "6", "7"])]
    rows += [sample_row("p2", k, boxed(a), math_record("p2", "3")) for k, a in enumerate(["3", "4", "5", "5"])]
    return rows


def _write_jsonl(rows: list[dict[str, Any]], path: Path) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _command(name: str, samples: str, tmp_path: Path) -> list[str]:
    out = str(tmp_path / f"out-{name}")
    if name == "rl-filter":
        problems = _write_jsonl([math_record("p1", "6"), math_record("p2", "3")], tmp_path / "problems.jsonl")
        bench = _write_jsonl([{"problem": "An unrelated benchmark problem about counting colourful marbles."}],
                             tmp_path / "bench.jsonl")
        return ["rl-filter", "--problems", problems, "--samples", samples, "--output", out, "--config", "tiny",
                "--benchmark", bench]
    if name == "evaluate":
        bench = _write_jsonl([{"id": pid, "benchmark": "toy", "problem": f"Compute {pid}.", "answer": answer}
                              for pid, answer in (("p1", "6"), ("p2", "3"))], tmp_path / "toy.jsonl")
        return ["evaluate", "--samples", samples, "--output", out, "--benchmark", bench, "--config", "tiny",
                *(arg for item in TOY for arg in ("--set", item))]
    return [name, "--samples", samples, "--output", out, "--config", "tiny"]


def _refused(name: str, samples: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command; it must fail with a message (returned) and publish nothing."""
    capsys.readouterr()
    assert main(_command(name, samples, tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"klear {name}: error:" in err and "Traceback" not in err, err
    assert not (tmp_path / f"out-{name}" / storage.MANIFEST_NAME).exists()
    return err


def test_the_writer_and_the_readers_share_one_schema() -> None:
    assert WRITTEN_SCHEMA is SAMPLE_SCHEMA


@pytest.mark.parametrize("name", COMMANDS)
def test_clean_rows_are_read_by_every_command(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The control: the same rows without the duplicate are accepted, so the refusals below are the reader's."""
    samples = _write_jsonl(_rows(), tmp_path / "samples.jsonl")
    assert main(_command(name, samples, tmp_path)) == 0, capsys.readouterr().err
    assert (tmp_path / f"out-{name}" / storage.MANIFEST_NAME).exists()


@pytest.mark.parametrize("name", COMMANDS)
def test_a_duplicate_row_is_refused_naming_both_lines(name: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # p1's sample 3 again, right this time: counted, it would make p1 4/4 of 5 rows (judge), two SFT records,
    # or a pass rate over the wrong rows (rl-filter, sft-data's reference).
    rows = _rows()
    rows.insert(2, sample_row("p1", 3, boxed("6"), math_record("p1", "6")))
    samples = _write_jsonl(rows, tmp_path / "samples.jsonl")
    err = _refused(name, samples, tmp_path, capsys)
    assert f"{samples}:5: sample 3 of problem 'p1' appears twice (first at {samples}:3)" in err


BAD_JSONL = [  # (field, value, what the message shows)
    ("sample", True, "true"),
    ("sample", "x", '"x"'),
    ("sample", 1.9, "1.9"),
    ("sample", -1, "-1"),
    ("response", 123, "123"),
    ("id", "", '""'),
    ("completion_tokens", -95, "-95"),
    ("finish_reason", ["stop"], '["stop"]'),
    ("messages", [{"role": "user", "content": 3}], '[{"role": "user", "content": 3}]'),
]


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize(("field", "value", "shown"), BAD_JSONL)
def test_an_ill_typed_field_is_refused_naming_line_and_field(name: str, field: str, value: Any, shown: str,
                                                             tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows()
    rows[5] = {**rows[5], field: value}
    samples = _write_jsonl(rows, tmp_path / "samples.jsonl")
    err = _refused(name, samples, tmp_path, capsys)
    assert f"{samples}:6: field {field!r}: expected " in err and f"got {shown}" in err, err


@pytest.mark.parametrize(("field", "values", "message"), [
    ("sample", [0, 1, math.nan, 3], "field 'sample' is a column of double (row 3 holds NaN)"),
    ("sample", [0, 1, 1.9, 3], "field 'sample' is a column of double (row 3 holds 1.9)"),
    ("completion_tokens", [5, math.nan, 7, 8], "field 'completion_tokens' is a column of double (row 2 holds NaN)"),
    ("sample", [True, False, True, False], "field 'sample' is a column of bool"),
    ("sample", [0, 1, -1, 3], ":row 3: field 'sample': expected an integer from 0 to 2147483647, got -1"),
    ("id", ["p1", "p1", None, "p1"], ":row 3: field 'id': expected a non-empty string, got null"),
    # JSON text, as rows written before `messages` was a list of turns, must be such a list.
    ("messages", ['[{"role": "user", "content": "q"}]', "[]", "not json", None],
     ":row 3: field 'messages': expected a list of {role, content} strings or its JSON text or null, got \"not json\""),
    ("messages", [[{"role": "user", "content": "q"}], [], [{"role": "user", "content": None}], None],
     ":row 3: field 'messages': expected a list of {role, content} strings or its JSON text or null, got "),
])
def test_ill_typed_parquet_columns_are_refused_naming_row_and_field(field: str, values: list[Any], message: str,
                                                                    tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows()[:4]
    table = pa.Table.from_pylist(rows)
    table = table.drop_columns([c for c in [field] if c in table.column_names]).append_column(field, pa.array(values))
    path = tmp_path / "samples.parquet"
    pq.write_table(table, path)
    err = _refused("judge", str(path), tmp_path, capsys)
    assert f"{path}{message}" in err or f"{path}: {message}" in err, err


def test_a_published_sample_output_on_s3_with_a_duplicate_is_refused(s3_bucket: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows()
    rows.append(sample_row("p2", 0, boxed("4"), math_record("p2", "3")))
    samples = publish_samples(rows, f"{s3_bucket}/samples")
    capsys.readouterr()
    assert main(["judge", "--samples", samples, "--output", f"{s3_bucket}/judged", "--config", "tiny"]) == 2
    err = capsys.readouterr().err
    part = f"{samples}/samples/part-00000.parquet"
    assert f"{part}:row 9: sample 0 of problem 'p2' appears twice (first at {part}:row 5)" in err, err
    assert storage.list_files(f"{s3_bucket}/judged") == []


def test_rows_are_cast_to_the_contract_types(tmp_path: Path) -> None:
    """A JSONL source row given as an object is kept as its JSON text, and counts take the writer's types, so
    every batch of a source has one schema."""
    rows = [{**row, "record": json.loads(row["record"])} for row in _rows()]
    samples = _write_jsonl(rows, tmp_path / "samples.jsonl")
    (_, table), = iter_sample_tables(samples)
    assert table.schema.field("sample").type == SAMPLE_SCHEMA.field("sample").type
    assert json.loads(table.column("record")[0].as_py())["answer"] == "6"
