"""Record readers and writers: JSONL, Parquet, datasets folders, published folders, field mapping."""

from pathlib import Path

import pytest

from klear.common import storage
from klear.common.records import RecordError, Source, iter_records, read_records, write_records

ROWS = [{"id": f"r{i}", "problem": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(25)]


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.parquet", "rows_hf"])
def test_every_format_roundtrips_locally_and_on_s3(name: str, tmp_path: Path, s3_bucket: str) -> None:
    path = write_records(ROWS, tmp_path / "out" / name)
    assert read_records(str(path)) == ROWS
    storage.publish_dir(tmp_path / "out", f"{s3_bucket}/out")
    assert read_records(f"{s3_bucket}/out/{name}") == ROWS


def test_locations_and_numbers(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1}\n\n{"id": 2}\n')
    located = list(iter_records(Source.parse(str(path))))
    assert [(r.where.rsplit(":", 1)[1], r.number) for r in located] == [("1", 1), ("3", 3)]


def test_source_fragment_maps_fields_and_names() -> None:
    source = Source.parse("s3://b/raw/numina.jsonl#prompt=problem&id=uid")
    assert source.uri == "s3://b/raw/numina.jsonl" and source.name == "numina"
    assert source.field("prompt") == "problem" and source.field("answer") == "answer"
    assert Source.parse("x.parquet#source=mine").name == "mine"


def test_bad_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "list.jsonl").write_text('{"ok": 1}\n[1, 2]\n')
    with pytest.raises(RecordError, match=r"list.jsonl:2: expected a JSON object, got list"):
        read_records(str(tmp_path / "list.jsonl"))
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(RecordError, match="broken.parquet: not a readable Parquet file"):
        read_records(str(tmp_path / "broken.parquet"))
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(RecordError, match="data.csv: unknown file type"):
        read_records(str(tmp_path / "data.csv"))
