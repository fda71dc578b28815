"""The curate stage end to end on demo data: local paths, S3, every input format, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from klear.common import storage
from klear.common.config import load_config
from klear.common.records import RecordError
from klear.curate.config import CurateConfig
from klear.curate.stage import run
from klear.demo.generate import generate

DEMO_SOURCES = ["math.jsonl#prompt=problem", "code.jsonl#prompt=question"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "data"
    generate(str(out), math_count=120, code_count=16, seed=5)
    return out


def _tiny(**overrides: object) -> CurateConfig:
    return load_config(CurateConfig, "tiny", [f"{k}={v}" for k, v in overrides.items()])


def _read(output: str) -> tuple[pa.Table, pa.Table, dict]:
    with storage.fetch_published(output) as (local, _):
        return pq.read_table(local / "prompts"), pq.read_table(local / "removed"), json.loads((local / "report.json").read_text())


def test_planted_duplicates_and_leaks_are_removed_and_nothing_else(demo: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "curated")
    report = run([f"{demo}/{s}" for s in DEMO_SOURCES], out, _tiny())
    kept, removed, on_disk = _read(out)
    assert on_disk["totals"] == report["totals"]
    planted = json.loads((demo / "planted.json").read_text())["planted"]
    expected = {p["id"]: p for p in planted if p["expect"] != "kept"}
    got = {row["id"]: row for row in removed.to_pylist()}
    assert set(got) == set(expected)
    for row_id, row in got.items():
        assert row["reason"] == expected[row_id]["expect"], row_id
        assert expected[row_id]["of"] in row["matched"], row_id
        assert row["where"].startswith(f"{demo}/math.jsonl:")
    contaminated = [r for r in got.values() if r["reason"] == "contaminated"]
    assert all(len(r["ngram"].split()) == 9 for r in contaminated)
    assert kept.num_rows == report["totals"]["read"] - len(expected) == 120 + 16 + len(planted) - len(expected)
    assert report["short_prompts"]["count"] == 2 and {s["id"] for s in report["short_prompts"]["listed"]} == {
        "short-leak", "short-clean"}
    assert sum(b["prompts_removed"] for b in report["per_benchmark"].values()) >= 7
    # The kept rows carry the whole source record for the next stages.
    first_code = next(r for r in kept.to_pylist() if r["source"] == "code")
    assert len(json.loads(first_code["record"])["tests"]) >= 16
    assert "## Per test set" in (Path(out) / "report.md").read_text()


def test_parallel_workers_give_identical_output(demo: Path, tmp_path: Path) -> None:
    sources = [f"{demo}/{s}" for s in DEMO_SOURCES]
    run(sources, str(tmp_path / "one"), _tiny(workers=1, batch_size=7))
    run(sources, str(tmp_path / "two"), _tiny(workers=2, batch_size=7))
    one, two = _read(str(tmp_path / "one")), _read(str(tmp_path / "two"))
    assert one[0].equals(two[0]) and one[1].equals(two[1])


def test_s3_in_s3_out(demo: Path, s3_bucket: str) -> None:
    storage.publish_dir(demo, f"{s3_bucket}/demo")
    report = run([f"{s3_bucket}/demo/{s}" for s in DEMO_SOURCES], f"{s3_bucket}/curated", _tiny())
    kept, removed, _ = _read(f"{s3_bucket}/curated")
    assert kept.num_rows == report["totals"]["kept"] > 100
    assert removed.num_rows == report["totals"]["removed"] > 5


def test_parquet_hf_datasets_and_published_dir_sources(demo: Path, tmp_path: Path) -> None:
    import datasets

    rows = [json.loads(line) for line in (demo / "math.jsonl").read_text().splitlines()]
    flat = [{"uid": r["id"], "problem": r["problem"]} for r in rows]
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "math.parquet")
    datasets.Dataset.from_list(flat).save_to_disk(str(tmp_path / "hf"))
    ref = run([f"{demo}/math.jsonl#prompt=problem"], str(tmp_path / "ref"), _tiny())
    for spec in (f"{tmp_path}/math.parquet#prompt=problem&id=uid", f"{tmp_path}/hf#prompt=problem&id=uid"):
        report = run([spec], str(tmp_path / "out"), _tiny())
        assert report["totals"] == ref["totals"], spec
    # A published folder is read through its manifest: all of its JSONL files, in order, as one source.
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:50]) + "\n")
    (staging / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows[50:]) + "\n")
    storage.publish_dir(staging, tmp_path / "published")
    report = run([f"{tmp_path}/published"], str(tmp_path / "dir"), _tiny(prompt_field="problem"))
    assert report["totals"] == ref["totals"]
    (tmp_path / "published" / storage.MANIFEST_NAME).unlink()
    with pytest.raises(storage.UnpublishedOutputError, match="neither a _MANIFEST.json nor a Hugging Face"):
        run([f"{tmp_path}/published"], str(tmp_path / "dir2"), _tiny(prompt_field="problem"))


def test_malformed_jsonl_names_file_and_line_and_publishes_nothing(demo: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = (demo / "math.jsonl").read_text().splitlines()[:5]
    lines.insert(3, '{"id": "x", "problem": "unterminated')
    bad.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    with pytest.raises(RecordError, match=rf"{bad}:4: malformed JSON"):
        run([f"{bad}#prompt=problem"], str(out), _tiny())
    assert not out.exists() or not (out / storage.MANIFEST_NAME).exists()


def test_missing_prompt_field_names_field_and_fields_present(demo: Path, tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"math.jsonl:1: no prompt field 'question' \(fields present: \['answer', 'id'"):
        run([f"{demo}/math.jsonl#prompt=question"], str(tmp_path / "out"), _tiny())


def test_missing_inputs_are_named(demo: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        run([str(tmp_path / "nope.jsonl")], str(tmp_path / "out"), _tiny())
    with pytest.raises(FileNotFoundError, match="missing-bench.jsonl"):
        run([f"{demo}/math.jsonl#prompt=problem"], str(tmp_path / "out"), _tiny(),
            [str(tmp_path / "missing-bench.jsonl")])


def test_unreachable_s3_input_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("KLEAR_S3_MAX_ATTEMPTS", "1")
    with pytest.raises(storage.StorageError, match=r"s3://sources/x.jsonl: cannot reach S3 endpoint http://127.0.0.1:9"):
        run(["s3://sources/x.jsonl"], str(tmp_path / "out"), _tiny())


def test_empty_input_gives_empty_valid_output(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    report = run([str(empty)], str(tmp_path / "out"), _tiny())
    kept, removed, on_disk = _read(str(tmp_path / "out"))
    assert on_disk["empty_input"] is True and report["totals"]["read"] == 0
    assert kept.num_rows == removed.num_rows == 0 and kept.schema.names == ["id", "source", "prompt", "record"]
    assert "held no prompts" in (tmp_path / "out" / "report.md").read_text()


def test_cli_reports_errors_plainly(demo: Path, tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "klear.cli", "curate", "--input", f"{demo}/code.jsonl#prompt=question",
         "--output", str(tmp_path / "cli"), "--config", "tiny"],
        capture_output=True, text=True, timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.splitlines()[-1])["kept"] == 16
    bad = subprocess.run(
        [sys.executable, "-m", "klear.cli", "curate", "--input", f"{demo}/code.jsonl", "--output",
         str(tmp_path / "cli2"), "--config", "tiny", "--set", "ngram_size=zero"],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2
    assert "klear curate: error: CurateConfig from preset 'tiny'" in bad.stderr and "ngram_size" in bad.stderr


def test_workers_zero_leaves_a_core_to_the_main_process() -> None:
    from klear.curate.stage import curate_workers

    assert curate_workers(0, 2) == 1  # 2 cores: everything in one process, no pipe
    assert curate_workers(0, 1) == 1
    assert curate_workers(0, 16) == 15
    assert curate_workers(3, 2) == 3  # asked for: given


def test_a_run_never_imports_pandas(demo: Path, tmp_path: Path) -> None:
    """pyarrow imports pandas on the first pa.array of a list, a fixed cost of a second or so: the stage builds its
    arrays from buffers (klear.curate.arrays)."""
    code = (f"import sys; from klear.curate.stage import run; from tests.curate.test_stage import _tiny; "
            f"run([{str(demo / 'math.jsonl')!r} + '#prompt=problem'], {str(tmp_path / 'out')!r}, _tiny()); "
            "print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
