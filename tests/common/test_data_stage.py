"""The data-stage skeleton (klear.common.data_stage): check before any work, lease and staging, report files,
manifest last with the stage's name and inputs. A toy stage on a local folder and on SeaweedFS, and the real
`klear` commands built on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from klear.cli import main as klear
from klear.common import storage
from klear.common.data_stage import DataStage
from klear.curate.config import CurateConfig

TOY = DataStage("toy", CurateConfig, lambda report: f"# toy\n\n{report['rows']} rows\n")


def _snapshot(uri: str) -> dict[str, bytes]:
    loc = storage.Uri.parse(uri)
    return {name: storage.read_bytes(loc.join(name)) for name in storage.list_files(loc)}


def _toy_run(output: str, data: str, rows: int, fail: bool = False) -> None:
    checked = TOY.check(output, {"data": data, "reference": None}, config=None)
    with checked.open() as out:
        (out.staging / "rows.txt").write_text("row\n" * rows)
        if fail:
            raise RuntimeError("the stage's body failed")
        out.publish({"rows": rows}, {"rows": rows})


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_failing_body_publishes_nothing_and_the_old_output_stays(where: str, tmp_path: Path, s3_bucket: str) -> None:
    output = f"{s3_bucket}/toy" if where == "s3" else str(tmp_path / "toy")
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    _toy_run(output, str(data), 2)
    before = _snapshot(output)
    with pytest.raises(RuntimeError, match="the stage's body failed"):
        _toy_run(output, str(data), 5, fail=True)
    assert _snapshot(output) == before  # same manifest, same files, no lease left behind
    assert storage.read_manifest(output).meta["rows"] == 2
    _toy_run(output, str(data), 5)  # and the next run is not blocked
    assert storage.read_manifest(output).meta["rows"] == 5


def test_the_manifest_records_stage_inputs_and_the_stages_own_keys(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    output = str(tmp_path / "toy")
    _toy_run(output, f"{data}#prompt=problem", 3)
    manifest = storage.read_manifest(output)
    assert manifest.meta.pop("lineage")["inputs"][0]["uri"] == f"{data}#prompt=problem"
    assert manifest.meta == {"stage": "toy", "rows": 3, "inputs": {"data": [f"{data}#prompt=problem"]}}
    assert sorted(manifest.files) == ["report.json", "report.md", "rows.txt"]
    assert json.loads((tmp_path / "toy" / "report.json").read_text()) == {"rows": 3}
    assert (tmp_path / "toy" / "report.md").read_text() == "# toy\n\n3 rows\n"


def test_the_check_runs_before_the_body_and_reserved_keys_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    with pytest.raises(storage.InvalidOutputError, match=f"output {data} is input {data}"):
        TOY.check(str(data), {"data": str(data)}, config=None)
    with pytest.raises(storage.InvalidOutputError, match="--output .* contains --work"):
        TOY.check(str(tmp_path / "o"), {"data": str(data)}, work=str(tmp_path / "o" / "w"), role="--output", config=None)
    with TOY.check(str(tmp_path / "o"), {}, config=None).open() as out, pytest.raises(ValueError, match=r"\['stage'\]"):
        out.publish({"rows": 0}, {"stage": "other"})
    assert not (tmp_path / "o" / storage.MANIFEST_NAME).exists()


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_curate_command_records_its_inputs_and_prints_its_headline(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    prompts = _jsonl(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"how many apples are {i} and {i}"}
                                            for i in range(3)])
    bench = _jsonl(tmp_path / "b.jsonl", [{"id": "b0", "problem": "find the sum of all primes below ten"}])
    out = str(tmp_path / "curated")
    assert klear(["curate", "--input", prompts, "--benchmark", bench, "--output", out, "--config", "tiny"]) == 0
    headline = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert headline["read"] == 3 and headline["kept"] == 3
    meta = storage.read_manifest(out).meta
    assert {k: v for k, v in meta.items() if k != "lineage"} == {"stage": "curate", "kept": 3, "read": 3,
                                                               "inputs": {"input": [prompts], "benchmark": [bench]}}


def test_judge_command_records_its_inputs_beside_its_counts(tmp_path: Path) -> None:
    samples = _jsonl(tmp_path / "s.jsonl", [{"id": "p0", "sample": 0, "response": "</think>\\boxed{2}"}])
    problems = _jsonl(tmp_path / "q.jsonl", [{"id": "p0", "problem": "1+1?", "answer": "2"}])
    out = str(tmp_path / "judged")
    assert klear(["judge", "--samples", samples, "--problems", problems, "--output", out, "--config", "tiny"]) == 0
    meta = storage.read_manifest(out).meta
    assert meta["stage"] == "judge" and meta["inputs"] == {"samples": [samples], "problems": [problems]}
    assert meta["samples"] == 1 and meta["problems"] == 1 and "settings_key" in meta  # the stage's own keys stay
    assert (tmp_path / "judged" / "report.md").is_file()
