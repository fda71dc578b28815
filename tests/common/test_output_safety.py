"""An output or a work area never replaces an input or another stage's result: every location a command writes is
checked against every input and against the others before any work, and publishing replaces only an output of
the same stage (its manifest names the stage). Each case runs the real `klear` command, locally and on SeaweedFS."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from klear.common import storage
from tests.commands import jsonl, klear


def _refused(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode != 0, f"accepted:\n{done.stdout}\n{done.stderr[-2000:]}"
    for fragment in fragments:
        assert fragment in done.stderr, f"{fragment!r} not in:\n{done.stderr[-2000:]}"


def _snapshot(uri: str) -> dict[str, bytes]:
    loc = storage.Uri.parse(uri)
    return {name: storage.read_bytes(loc.join(name)) for name in storage.list_files(loc)}


@pytest.fixture()
def benchmark(tmp_path: Path) -> str:
    return jsonl(tmp_path / "bench" / "b.jsonl", [{"id": f"b{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)}
                                                   for i in range(3)])


def _published_model(uri: str, tmp_path: Path, stage: str = "sft") -> str:
    """A folder laid out as a published training output: weights, config and tokenizer under a manifest."""
    staging = tmp_path / f"staging-{stage}"
    staging.mkdir()
    for name, body in {"model.safetensors": b"\0" * 64, "config.json": b"{}", "tokenizer.json": b"{}"}.items():
        (staging / name).write_bytes(body)
    storage.publish_dir(staging, uri, meta={"stage": stage})
    return uri


@pytest.mark.parametrize("where", ["local", "s3"])
def test_evaluate_never_replaces_the_model_it_evaluates(where: str, tmp_path: Path, s3_bucket: str,
                                                        benchmark: str) -> None:
    model = _published_model(f"{s3_bucket}/model" if where == "s3" else str(tmp_path / "model"), tmp_path)
    before = _snapshot(model)
    done = klear("evaluate", "--model", model, "--output", model, "--benchmark", str(benchmark), "--config", "tiny")
    _refused(done, "--output", "is input")
    assert _snapshot(model) == before


def test_evaluate_checks_the_sample_output_before_sampling(tmp_path: Path, benchmark: str) -> None:
    model = _published_model(str(tmp_path / "model"), tmp_path)
    out = tmp_path / "evx"
    done = klear("evaluate", "--model", model, "--output", str(out), "--sample-output", str(out),
                  "--benchmark", str(benchmark), "--config", "tiny")
    _refused(done, "--output", "is --sample-output", "one would replace the other")
    assert not out.exists(), "something was written before the refusal"


@pytest.mark.parametrize("where", ["local", "s3"])
def test_judge_never_replaces_another_stages_output(where: str, tmp_path: Path, s3_bucket: str) -> None:
    sft = _published_model(f"{s3_bucket}/sft" if where == "s3" else str(tmp_path / "sft"), tmp_path)
    samples = jsonl(tmp_path / "samples.jsonl", [{"id": "p0", "sample": 0, "response": "\\boxed{1}"}])
    problems = jsonl(tmp_path / "problems.jsonl", [{"id": "p0", "problem": "1?", "answer": "1"}])
    before = _snapshot(sft)
    done = klear("judge", "--samples", str(samples), "--problems", str(problems), "--output", sft,
                  "--config", "tiny")
    _refused(done, "holds a published 'sft' output and this is 'judge'")
    assert _snapshot(sft) == before


def test_publishing_replaces_only_an_output_of_the_same_stage(tmp_path: Path) -> None:
    out = _published_model(str(tmp_path / "out"), tmp_path, stage="sft")
    staging = tmp_path / "judged"
    staging.mkdir()
    (staging / "report.json").write_text("{}")
    with pytest.raises(storage.InvalidOutputError, match="holds a published 'sft' output and this is 'judge'"):
        storage.publish_dir(staging, out, meta={"stage": "judge"})
    assert storage.read_manifest(out).meta["stage"] == "sft" and (tmp_path / "out" / "model.safetensors").exists()
    storage.publish_dir(staging, out, meta={"stage": "sft"})  # the same stage replaces its own output
    assert storage.list_files(out) == [storage.MANIFEST_NAME, "report.json"]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_sample_work_area_never_holds_the_inputs(where: str, tmp_path: Path, s3_bucket: str) -> None:
    root = f"{s3_bucket}/run" if where == "s3" else str(tmp_path / "run")
    data = storage.Uri.parse(root).join("data")
    storage.write_bytes(data.join("p.jsonl"), b'{"id": "p0", "prompt": "q", "response": "r"}\n')
    before = _snapshot(str(data))
    done = klear("sample", "--prompts", str(data.join("p.jsonl")), "--output", f"{root}/out", "--work", str(data),
                  "--config", "tiny", "--set", "backend=records", "--set", "keep_work=false")
    _refused(done, "--work", "contains input")
    assert _snapshot(str(data)) == before


def test_sample_work_area_of_foreign_files_is_refused(tmp_path: Path) -> None:
    prompts = jsonl(tmp_path / "in" / "p.jsonl", [{"id": "p0", "prompt": "q", "response": "r"}])
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("years of work")
    done = klear("sample", "--prompts", str(prompts), "--output", str(tmp_path / "out"), "--work", str(notes),
                  "--config", "tiny", "--set", "backend=records", "--set", "keep_work=false")
    _refused(done, "holds 1 files that are not a `klear sample` work area's (thesis.tex)")
    assert (notes / "thesis.tex").read_text() == "years of work"


def test_a_finished_work_area_deletes_only_its_own_files(tmp_path: Path) -> None:
    """keep_work=false removes the shards it wrote, and a file someone drops in meanwhile stays."""
    from klear.sample.store import WorkArea

    area = WorkArea(str(tmp_path / "work"))
    area.write_settings({"hash": "x"})
    storage.write_bytes(area.uri.join("shards", "w-000000.parquet"), b"PAR1")
    (tmp_path / "work" / "README.txt").write_text("mine")
    area.delete_all()
    assert sorted(p.name for p in (tmp_path / "work").rglob("*")) == ["README.txt"]


def test_a_config_file_is_an_input(tmp_path: Path) -> None:
    config = tmp_path / "cfg" / "judge.yaml"
    config.parent.mkdir()
    config.write_text("{}\n")
    samples = jsonl(tmp_path / "samples.jsonl", [{"id": "p0", "sample": 0, "response": "\\boxed{1}"}])
    problems = jsonl(tmp_path / "problems.jsonl", [{"id": "p0", "problem": "1?", "answer": "1"}])
    done = klear("judge", "--samples", str(samples), "--problems", str(problems), "--output", str(config.parent),
                  "--config", str(config))
    _refused(done, "contains input", "judge.yaml")
    assert config.read_text() == "{}\n"
