"""What makes a unit done is content, not names or sizes: a new checkpoint of the same shape written into the
same folder, a corrected reference answer, an edited shipped trace are sampled anew (or refused), never mixed
with what was sampled before. Through the `klear sample` command, locally and on S3."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from klear.cli import main
from klear.common import storage
from klear.sample.model_folder import DIGEST_CACHE_SUFFIX, digest_cache_path, fingerprint, folder_digests
from klear.sample.stage import iter_rows
from tests.sample.conftest import write_prompts
from tests.sample.fake_server import FakeServer

FAST = ["--config", "tiny", "--set", "backoff_initial_s=0.01", "--set", "backoff_max_s=0.05"]


def _sample(prompts: str, output: str, *args: str) -> int:
    return main(["sample", "--prompts", prompts, "--output", output, *FAST, *args])


def _rows(output: str) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["id"], r["sample"]): r for r in iter_rows(output)}


def _save_checkpoint(folder: Path, seed: int) -> None:
    """A checkpoint of the tests' tokenizer with weights over 16 MB (one wide MLP), from the seed: two seeds give
    weights of the same shape and size, different values, and the very same tokenizer and config files."""
    from klear.demo.tiny_model import TinySpec, build_model, train_tokenizer

    spec = TinySpec(num_hidden_layers=1, intermediate_size=22528, max_position_embeddings=256)
    tokenizer = train_tokenizer(spec)
    build_model(replace(spec, seed=seed), tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def test_a_new_checkpoint_of_the_same_shape_is_another_model(tmp_path: Path) -> None:
    model = tmp_path / "model"
    _save_checkpoint(model, seed=0)
    weights = model / "model.safetensors"
    first_weights, size = weights.read_bytes(), weights.stat().st_size
    assert size > 16 * 1024 * 1024
    files, digest = sorted(p.name for p in model.iterdir()), storage.content_digest(str(model))
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"What is {i} + 1?"} for i in range(2)])
    out = str(tmp_path / "out")
    assert _sample(prompts, out, "--model", str(model), "--set", "n=2", "--set", "max_tokens=4") == 0
    before = _rows(out)

    # The digests are cached beside the folder, not in it: the model's files and content digest are as they were.
    assert sorted(p.name for p in model.iterdir()) == files and storage.content_digest(str(model)) == digest
    assert (tmp_path / f".model{DIGEST_CACHE_SUFFIX}").is_file()

    # A new checkpoint into the same folder: same files, same sizes, other weights.
    _save_checkpoint(model, seed=1)
    assert weights.stat().st_size == size and weights.read_bytes() != first_weights
    assert sorted(p.name for p in model.iterdir()) == files
    rc = _sample(prompts, out, "--model", str(model), "--set", "n=2", "--set", "max_tokens=4")
    assert rc == 2, "samples of the old checkpoint were taken for the new one's"
    assert _rows(out) == before
    # A fresh output samples the new checkpoint.
    assert _sample(prompts, str(tmp_path / "new"), "--model", str(model), "--set", "n=2", "--set", "max_tokens=4") == 0
    assert json.loads((tmp_path / "new" / "report.json").read_text())["units"]["sampled"] == 4


def test_the_refusal_names_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model: str) -> None:
    """The same on a small model whose weights change in place (size and names kept): refused, naming why."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / storage.MANIFEST_NAME).unlink()
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "q", "prompt": "What is 1 + 1?"}])
    out = str(tmp_path / "out")
    assert _sample(prompts, out, "--model", str(model), "--set", "n=1", "--set", "max_tokens=2") == 0
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4] ^= 1  # the lowest mantissa bit of the last value of the last tensor
    stat = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as a copy that keeps times would leave it
    capsys.readouterr()
    assert _sample(prompts, out, "--model", str(model), "--set", "n=1", "--set", "max_tokens=2") == 2
    err = capsys.readouterr().err
    assert "holds samples taken under other settings" in err and "identity.model:" in err


def test_plain_folder_digests_are_cached_and_checked(tmp_path: Path, tiny_model: str) -> None:
    published = storage.read_manifest(tiny_model)
    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    (folder / storage.MANIFEST_NAME).unlink()
    # A plain copy of a published model is the same model.
    assert fingerprint(folder, None) == fingerprint(Path(tiny_model), published)
    cache = digest_cache_path(folder)
    assert cache == tmp_path / f".m{DIGEST_CACHE_SUFFIX}" and cache.is_file()
    assert folder_digests(folder, cache) == {rel: e["sha256"] for rel, e in published.files.items()}

    # An unchanged file's digest comes from the cache (here, one planted to show it is used) ...
    body = json.loads(cache.read_text())
    body["files"]["config.json"]["sha256"] = "planted"
    cache.write_text(json.dumps(body))
    assert folder_digests(folder, cache)["config.json"] == "planted"
    # ... and a file rewritten with its size and mtime kept is hashed again (its ctime moved).
    time.sleep(0.05)
    config = folder / "config.json"
    stat = config.stat()
    config.write_text(config.read_text().replace("qwen3", "qwen4"))
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert folder_digests(folder, cache)["config.json"] == storage.sha256_file(config)

    # No cache file lands in a published output; without a cache the digests are the same.
    inside = Path(tiny_model) / "sub"
    assert digest_cache_path(inside) is None
    assert folder_digests(folder, None) == folder_digests(folder, cache)
    # A cache that cannot be written (a read-only place; here one that does not exist) is done without.
    assert folder_digests(folder, tmp_path / "absent" / "cache.json") == folder_digests(folder, None)


def test_a_corrected_answer_resamples_its_units_on_top_up(tmp_path: Path) -> None:
    rows = [{"id": "p0", "prompt": "q0", "answer": "4"}, {"id": "p1", "prompt": "q1", "answer": "7"}]
    prompts = write_prompts(tmp_path / "p.jsonl", rows)
    out = str(tmp_path / "out")
    with FakeServer() as server:
        endpoint = ["--endpoint", server.url, "--served-model", server.served_model]
        assert _sample(prompts, out, *endpoint, "--set", "n=2") == 0
        rows[0]["answer"] = "42"
        write_prompts(tmp_path / "p.jsonl", rows)
        before = server.requests
        assert _sample(prompts, out, *endpoint, "--set", "n=4") == 0
        # p0's two earlier units are of the old record: all four are sampled, and p1's two new ones.
        assert server.requests - before == 6
    got = _rows(out)
    assert sorted(got) == [(p, j) for p in ("p0", "p1") for j in range(4)]
    assert [json.loads(got[("p0", j)]["record"])["answer"] for j in range(4)] == ["42"] * 4
    assert len({got[("p0", j)]["prompt_hash"] for j in range(4)}) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["units"]["done_before"] == 2 and report["units"]["stale_rows_dropped"] >= 2


def test_a_changed_record_is_not_taken_for_the_published_output_on_s3(tmp_path: Path, s3_bucket: str) -> None:
    """The output that "already holds all units" of this run must hold them for this record too."""
    prompts = f"{s3_bucket}/prompts.jsonl"
    rows: list[dict[str, Any]] = [{"id": "p0", "prompt": "q0", "tests": [{"input": "1", "output": "2"}]},
                                  {"id": "p1", "prompt": "q1"}]
    storage.write_bytes(prompts, "".join(json.dumps(r) + "\n" for r in rows).encode())
    out = f"{s3_bucket}/out"
    with FakeServer() as server:
        endpoint = ["--endpoint", server.url, "--served-model", server.served_model]
        assert _sample(prompts, out, *endpoint, "--set", "n=2") == 0
        assert _sample(prompts, out, *endpoint, "--set", "n=2") == 0 and server.requests == 4  # unchanged: nothing
        rows[0]["tests"] = [{"input": "1", "output": "3"}]
        storage.write_bytes(prompts, "".join(json.dumps(r) + "\n" for r in rows).encode())
        assert _sample(prompts, out, *endpoint, "--set", "n=2") == 0
        assert server.requests == 6  # p0's two units, again
    got = _rows(out)
    assert len(got) == 4 and all(json.loads(got[("p0", j)]["record"])["tests"][0]["output"] == "3" for j in (0, 1))


def test_an_edited_shipped_trace_is_imported_again(tmp_path: Path) -> None:
    def traces(answer: str) -> str:
        return write_prompts(tmp_path / "traces.jsonl", [
            {"id": "m1", "messages": [{"role": "user", "content": "Q1"},
                                      {"role": "assistant", "content": f"<think>\nR1\n</think>\n\n{answer}"}]},
            {"id": "m2", "problem": "Q2", "generations": ["<think>\nR2\n</think>\n\nA2"]}])

    out = str(tmp_path / "out")
    records = ["--set", "backend=records", "--set", "n=4"]
    assert _sample(traces("A1") + "#prompt=problem", out, *records) == 0
    assert _rows(out)[("m1", 0)]["response"].endswith("A1")
    assert _sample(traces("A1 corrected") + "#prompt=problem", out, *records) == 0
    got = _rows(out)
    assert got[("m1", 0)]["response"].endswith("A1 corrected") and got[("m2", 0)]["response"].endswith("A2")
    # With the output deleted, the work area's shards of the old trace are not reused either.
    shutil.rmtree(out)
    assert (tmp_path / "out.work" / "shards").is_dir()
    assert _sample(traces("A1 again") + "#prompt=problem", out, *records) == 0
    assert _rows(out)[("m1", 0)]["response"].endswith("A1 again")


@pytest.mark.slow
def test_evaluate_does_not_score_the_old_checkpoints_samples(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`klear evaluate --model M` again after a new checkpoint was written into M: its samples are M's old ones."""
    model = tmp_path / "model"
    _save_checkpoint(model, seed=0)
    out = tmp_path / "eval"
    command = ["evaluate", "--model", f"m={model}", "--output", str(out), "--config", "tiny",
               *[a for o in ("only=[aime24]", "benchmarks.aime24.k=1", "sampling.max_tokens=2") for a in ("--set", o)]]
    assert main(command) == 0
    report = (out / "report.json").read_bytes()
    _save_checkpoint(model, seed=1)
    capsys.readouterr()
    assert main(command) == 2
    assert "identity.model:" in capsys.readouterr().err and (out / "report.json").read_bytes() == report
