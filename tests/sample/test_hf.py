"""The CPU backend (transformers generate) on the tiny model: n samples per prompt, seeded reproduction,
stopping at the EOS, bad model folders, and the whole stage on S3 from curate's output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from klear.common import storage
from klear.curate.config import CurateConfig
from klear.sample.backends.base import BackendError
from klear.sample.stage import iter_rows, run
from tests.sample.conftest import fast_config, write_prompts

PROMPTS = [{"id": f"q{i}", "prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(3)]


def _rows(output: str) -> dict[tuple[str, int], dict]:
    return {(r["id"], r["sample"]): r for r in iter_rows(output)}


def _content(rows: dict[tuple[str, int], dict]) -> dict[tuple[str, int], tuple]:
    return {k: (r["response"], r["finish_reason"], r["completion_tokens"], r["seed"]) for k, r in rows.items()}


def test_n_samples_per_prompt_and_seeded_runs_reproduce(tiny_model: str, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    config = fast_config("n=3", "max_tokens=8", "shard_size=2")
    report = run([prompts], str(tmp_path / "a"), config, model=tiny_model)
    rows = _rows(str(tmp_path / "a"))
    assert sorted(rows) == [(f"q{i}", j) for i in range(3) for j in range(3)]
    assert report["backend"]["backend"] == "hf" and report["backend"]["eos_tokens"] == ["<|im_end|>"]
    for row in rows.values():
        # A random model rarely emits its EOS: a response that ran out of tokens says so, with max_tokens tokens.
        assert row["finish_reason"] in ("stop", "length") and row["prompt_tokens"] > 5
        assert (row["completion_tokens"] == 8) == (row["finish_reason"] == "length")
        assert "<|im_end|>" not in row["response"] and row["model"] == "model"
    assert len({r["response"] for r in rows.values()}) > 3  # samples differ

    # As if the run had been killed before its last shard and before publishing: the rerun samples those
    # units again, and exactly as before.
    shutil.rmtree(tmp_path / "a")
    work = tmp_path / "a.work"
    first = sorted((work / "shards").iterdir())[0]
    (work / "index" / first.name.replace(".parquet", ".json")).unlink()
    first.unlink()
    again = run([prompts], str(tmp_path / "a"), config, model=tiny_model)
    assert again["units"]["sampled"] == 2 and again["units"]["done_before"] == 7
    assert _content(_rows(str(tmp_path / "a"))) == _content(rows)

    # A fresh output with the same seed reproduces every unit; another seed does not.
    run([prompts], str(tmp_path / "b"), fast_config("n=3", "max_tokens=8"), model=tiny_model)
    assert _content(_rows(str(tmp_path / "b"))) == _content(rows)
    run([prompts], str(tmp_path / "c"), fast_config("n=3", "max_tokens=8", "seed=1"), model=tiny_model)
    assert {k: v[0] for k, v in _content(_rows(str(tmp_path / "c"))).items()} != {k: v[0] for k, v in _content(rows).items()}


def test_unseeded_units_draw_from_fresh_generators(tiny_model: str, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    config = fast_config("n=3", "max_tokens=8", "seed_per_unit=false")
    outputs = []
    for name in ("a", "b"):
        report = run([prompts], str(tmp_path / name), config, model=tiny_model)
        rows = _rows(str(tmp_path / name))
        assert report["complete"] and sorted(rows) == [(f"q{i}", j) for i in range(3) for j in range(3)]
        assert all(row["seed"] is None for row in rows.values())
        outputs.append({k: r["response"] for k, r in rows.items()})
    # Nothing fixes what an unseeded unit draws: two runs differ (8 tokens from the random model's vocabulary).
    assert outputs[0] != outputs[1]


def test_generation_stops_at_the_eos_token(tiny_model: str, tmp_path: Path) -> None:
    """A copy of the tiny model whose generation config favours <|im_end|> strongly: every sample stops."""
    model = tmp_path / "eos-model"
    shutil.copytree(tiny_model, model)
    (model / storage.MANIFEST_NAME).unlink()
    config = json.loads((model / "generation_config.json").read_text())
    eos = config["eos_token_id"]
    config["sequence_bias"] = [[[eos], 20.0]]
    (model / "generation_config.json").write_text(json.dumps(config))
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS[:1])
    report = run([prompts], str(tmp_path / "out"), fast_config("n=2", "max_tokens=8"), model=str(model))
    rows = list(iter_rows(str(tmp_path / "out")))
    assert [(r["finish_reason"], r["completion_tokens"], r["response"]) for r in rows] == [("stop", 1, "")] * 2
    assert report["tokens"]["finish_reasons"] == {"stop": 2}


def test_a_folder_that_is_not_a_model_is_named_and_nothing_is_written(tiny_model: str, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS[:1])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a model")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    (broken / storage.MANIFEST_NAME).unlink()
    (broken / "model.safetensors").unlink()
    cases = {str(empty): r"no config.json; expected a Hugging Face model folder \(files present: \['notes.txt'\]\)",
             str(broken): r"no weights", str(tmp_path / "nowhere"): r"no such folder",
             prompts: r"a file, not a model folder"}
    for folder, message in cases.items():
        with pytest.raises(BackendError, match=message):
            run([prompts], str(tmp_path / "out"), fast_config(), model=folder)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists()


def test_curated_prompts_and_a_published_model_on_s3(tiny_model: str, s3_bucket: str, tmp_path: Path) -> None:
    from klear.common.config import load_config
    from klear.curate.stage import run as curate

    storage.upload_file(write_prompts(tmp_path / "raw.jsonl", [
        {"uid": f"u{i}", "problem": f"Ava has {i} apples and buys {i + 2} more. How many now?", "answer": str(2 * i + 2)}
        for i in range(2)]), f"{s3_bucket}/raw/math.jsonl")
    curate([f"{s3_bucket}/raw/math.jsonl#prompt=problem&id=uid"], f"{s3_bucket}/curated",
           load_config(CurateConfig, "tiny"), benchmark_specs=[])
    model = f"{s3_bucket}/models/tiny"
    storage.publish_dir(tiny_model, model, meta={"stage": "tiny-model"})
    report = run([f"{s3_bucket}/curated"], f"{s3_bucket}/runs/r1/sample-teacher", fast_config("n=2", "max_tokens=4"),
                 model=model)
    rows = _rows(f"{s3_bucket}/runs/r1/sample-teacher")
    assert sorted(rows) == [("u0", 0), ("u0", 1), ("u1", 0), ("u1", 1)] and report["complete"]
    assert json.loads(rows[("u1", 0)]["record"]) == {"uid": "u1", "answer": "4"} and rows[("u1", 0)]["source"] == "math"
    assert storage.list_files(f"{s3_bucket}/runs/r1/sample-teacher.work/shards")  # the shards are kept on S3
    assert report["settings"]["identity"]["engine"] == "model"


def test_next_token_filters_and_draws_from_its_own_generator() -> None:
    import torch

    from klear.sample.backends.hf import next_token

    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    assert next_token(torch, logits, 0.0, 1.0, 0, torch.Generator()) == 1  # greedy
    # top_k=1 and a nucleus smaller than the best token's mass both leave only the best token.
    assert {next_token(torch, logits, 1.0, 1.0, 1, torch.Generator().manual_seed(s)) for s in range(20)} == {1}
    assert {next_token(torch, logits, 1.0, 0.1, 0, torch.Generator().manual_seed(s)) for s in range(20)} == {1}
    # Unfiltered, both likely tokens appear over seeds, and one seed always gives the same draw.
    draws = [next_token(torch, logits, 1.0, 1.0, 0, torch.Generator().manual_seed(s)) for s in range(40)]
    assert {1, 2} <= set(draws)
    assert draws == [next_token(torch, logits, 1.0, 1.0, 0, torch.Generator().manual_seed(s)) for s in range(40)]
