"""`klear sample --set backend=vllm` on vLLM's CPU build: the very backend a GPU pod runs, its output format,
resume and report; and greedy decoding through `hf` and through `vllm` giving the same tokens (the check that
catches chat-template, EOS and special-token drift between training and sampling)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from klear.sample.stage import iter_rows
from tests.gpu_paths.conftest import VLLM_ENV, klear, write_prompts

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]

PROMPTS = [{"id": f"q{i}", "prompt": f"What is {i} + {i + 3}? Think first."} for i in range(4)]
# Enough seeded requests in one call that vLLM splits prefills over steps, which its CPU build cannot do for
# seeded requests ("CPU Generator does not use offset") unless the preset turns chunked prefill off.
MANY = [{"id": f"m{i}", "prompt": f"Compute {i} * {i + 7} and explain every step."} for i in range(64)]


def _sample(model: str, prompts: str, output: Path, *settings: str) -> dict:
    klear("sample", "--prompts", prompts, "--output", str(output), "--model", model, "--config", "tiny-vllm-cpu",
          *[arg for s in settings for arg in ("--set", s)])
    return json.loads((output / "report.json").read_text())


def _rows(output: Path) -> dict[tuple[str, int], dict]:
    return {(r["id"], r["sample"]): r for r in iter_rows(str(output))}


def test_vllm_backend_samples_resumes_and_reports_on_cpu(vllm_model: str, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    report = _sample(vllm_model, prompts, tmp_path / "a", "backend=vllm", "n=3", "max_tokens=12", "batch_prompts=2")
    rows = _rows(tmp_path / "a")
    assert sorted(rows) == [(f"q{i}", j) for i in range(4) for j in range(3)] and report["complete"]
    backend = report["backend"]
    assert backend["backend"] == "vllm" and backend["device"] == "cpu"
    assert backend["engine_api"] == "llm_engine"  # one engine: stepped as LLM steps it
    assert backend["engine_args"]["tensor_parallel_size"] == 1 and backend["engine_args"]["enforce_eager"] is True
    assert backend["engine_args"]["kv_cache_memory_bytes"] == 2**30  # the preset's cpu_kvcache_space_gib
    # LLM's batch limits on a CPU (the engine's own default of 128 sequences halves the decode batches) and no
    # per-step vLLM statistics, as LLM runs.
    assert backend["batch_limits"]["max_num_seqs"] == 256 and backend["engine_args"]["disable_log_stats"] is True
    assert backend["versions"]["vllm"] == report["versions"]["vllm-cpu"] == "0.31.0"
    for row in rows.values():
        assert row["finish_reason"] in ("stop", "length") and row["prompt_tokens"] > 5
        assert (row["completion_tokens"] == 12) == (row["finish_reason"] == "length")
        assert "<|im_end|>" not in row["response"]
    assert len({r["response"] for r in rows.values()}) > 4  # seeded samples differ
    # Each unit samples with its own seed, whatever else of its prompt is pending: the same samples when they come
    # in other groups (sample 0 alone, then n raised to 3 tops up samples 1 and 2).
    _sample(vllm_model, prompts, tmp_path / "b", "backend=vllm", "n=1", "max_tokens=12")
    topped = _sample(vllm_model, prompts, tmp_path / "b", "backend=vllm", "n=3", "max_tokens=12")
    assert topped["units"]["done_before"] == 4 and topped["units"]["sampled"] == 8
    assert {k: r["response"] for k, r in _rows(tmp_path / "b").items()} == {k: r["response"] for k, r in rows.items()}

    many = write_prompts(tmp_path / "many.jsonl", MANY)
    report = _sample(vllm_model, many, tmp_path / "many", "backend=vllm", "n=4", "max_tokens=12")
    assert report["complete"] and report["units"]["rows"] == 256

    # seed_per_unit false: the units go to vLLM unseeded, and their rows hold no seed.
    unseeded = _sample(vllm_model, prompts, tmp_path / "u", "backend=vllm", "n=3", "max_tokens=12",
                       "seed_per_unit=false")
    assert unseeded["complete"] and unseeded["settings"]["sampling"]["seed_per_unit"] is False
    assert sorted(_rows(tmp_path / "u")) == sorted(rows)
    assert all(row["seed"] is None for row in _rows(tmp_path / "u").values())

    # As if the pod had died after its last shard but before publishing: the rerun samples nothing anew.
    shutil.rmtree(tmp_path / "a")
    again = _sample(vllm_model, prompts, tmp_path / "a", "backend=vllm", "n=3", "max_tokens=12", "batch_prompts=2")
    assert again["units"]["sampled"] == 0 and again["units"]["done_before"] == 12
    assert {k: r["response"] for k, r in _rows(tmp_path / "a").items()} == {k: r["response"] for k, r in rows.items()}


def test_greedy_hf_and_vllm_give_the_same_tokens(vllm_model: str, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    # n=2 at T=0: vLLM refuses it, the backend copies. float32 as the hf backend on CPU (vLLM's CPU build would
    # pick bfloat16, whose rounding flips the near-ties of a random model's flat logits).
    greedy = ("temperature=0.0", "n=2", "max_tokens=24")
    hf = _sample(vllm_model, prompts, tmp_path / "hf", "backend=hf", *greedy)
    vllm = _sample(vllm_model, prompts, tmp_path / "vllm", "backend=vllm", "engine_kwargs.dtype=float32", *greedy)
    assert hf["complete"] and vllm["complete"]
    hf_rows, vllm_rows = _rows(tmp_path / "hf"), _rows(tmp_path / "vllm")
    assert sorted(hf_rows) == sorted(vllm_rows) == [(f"q{i}", j) for i in range(4) for j in range(2)]
    for key, row in hf_rows.items():
        other = vllm_rows[key]
        assert (row["response"], row["prompt_tokens"], row["completion_tokens"], row["finish_reason"]) == (
            other["response"], other["prompt_tokens"], other["completion_tokens"], other["finish_reason"]), key
    assert hf_rows[("q0", 0)]["response"] == hf_rows[("q0", 1)]["response"]


@pytest.mark.parametrize(("engines", "api"), [(2, "async_llm"), (1, "llm_engine")])
def test_engines_fed_continuously_write_each_unit_when_it_finishes(vllm_model: str, tmp_path: Path, engines: int,
                                                                   api: str) -> None:
    # Sample lengths set by the context: max_model_len 512 and no max_tokens cap end each sample at 512 tokens of
    # prompt and response together, so the first prompt, 17 tokens, runs to ~495 new tokens and the 49 others,
    # ~465 tokens, to ~47: one sample in 50 ten times longer. The random model rarely ends a sample itself; seed 1
    # is one under which the long unit does not (seed 0 stops it at 171 tokens).
    rows = [{"id": "long", "prompt": "Go."}] + [{"id": f"s{i:02d}", "prompt": f"{i} " + "a " * 448} for i in range(49)]
    prompts = write_prompts(tmp_path / "p.jsonl", rows)
    report = _sample(vllm_model, prompts, tmp_path / "dp", "backend=vllm", "n=1", f"data_parallel_size={engines}",
                     "batch_prompts=4", "max_model_len=512", "max_tokens=100000", "shard_size=1", "seed=1")
    assert report["complete"] and report["units"]["rows"] == 50
    backend = report["backend"]
    assert backend["engine_args"]["data_parallel_size"] == engines and backend["engine_args"]["tensor_parallel_size"] == 1
    assert backend["engine_api"] == api
    assert len(backend["units_per_engine"]) == engines and min(backend["units_per_engine"]) >= 10, backend  # each
    # One unit per shard, shards numbered as written (<writer>-<seq>): the order the units were handed over in.
    shards = sorted((tmp_path / "dp.work" / "shards").glob("*.parquet"))
    per_shard = [pq.read_table(path, columns=["id"]).column("id").to_pylist() for path in shards]
    assert all(len(ids) == 1 for ids in per_shard)
    order = [ids[0] for ids in per_shard]
    lengths = {r["id"]: r["completion_tokens"] for r in iter_rows(str(tmp_path / "dp"))}
    assert lengths["long"] > 4 * max(v for k, v in lengths.items() if k != "long"), lengths
    # The long unit went in first; with chunks of batch_prompts it would have been among the first 4 rows written.
    # Fed continuously, the other slots kept taking short units while it ran: most were written before it.
    assert order.index("long") >= 20, order


@pytest.mark.parametrize("api", ["llm_engine", "async_llm"])
def test_a_refused_prompt_fails_alone_and_an_engine_failure_ends_the_call(vllm_model: str, api: str) -> None:
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("feed_probe.py")), vllm_model, api],
                          capture_output=True, text=True, env={**os.environ, **VLLM_ENV}, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["engine_api"] == api
    refused = {(pid, sample): (ok, kind) for pid, sample, ok, kind in result["refused"]}
    assert refused.pop(("long", 0)) == refused.pop(("long", 1)) == (False, "invalid_request")
    assert sorted(refused) == [(f"q{i}", j) for i in range(6) for j in range(2)]
    assert all(ok for ok, _ in refused.values())
    if api == "async_llm":
        assert result["engine_calls"] == {"get_supported_tasks_async": 0, "process_inputs_async": 0}
    for failed in [result["failed"], *([result["step_failed"]] if api == "llm_engine" else [])]:
        assert failed["error"] and "the engine failed: engine core died" in failed["error"]
        assert all(ok for _, _, ok in failed["yielded"]) and ["q3", 1, True] not in failed["yielded"]
        assert failed["yielded"], failed  # units finished before the failure are handed over
        assert failed["seconds"] < 60
