"""The endpoint backend against a real OpenAI-compatible server: `transformers serve` on loopback serving the
tiny model on CPU (offline). It ignores `n` (one request per unit), refuses top_k as a field (api_flavor
transformers puts the sampling settings in its generation_config), and wants the served path as `model`."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from klear.sample.stage import iter_rows, run
from tests.conftest import free_port
from tests.processes import served_on_loopback
from tests.sample.conftest import fast_config, write_prompts


@pytest.fixture(scope="module")
def served(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    binary = Path(sys.executable).parent / "transformers"
    if not binary.exists() and not shutil.which("transformers"):
        pytest.fail("the transformers CLI is missing: install the serve extra (transformers[serving])")
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(log.parent / "hub")}
    (log.parent / "hub").mkdir()
    command = [str(binary), "serve", tiny_model, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with served_on_loopback(command, env, log, port, "transformers serve", 120) as url:
        yield url, tiny_model


def test_transformers_serve_samples_every_unit_reproducibly(served: tuple[str, str], tmp_path: Path) -> None:
    url, model = served
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"What is {i} + 2?"} for i in range(2)])
    # One request at a time: the server seeds torch's global generator per request, so overlapping requests
    # would draw from each other's streams.
    config = fast_config("n=2", "max_tokens=6", "top_k=20", "api_flavor=transformers", "concurrency=1",
                         "request_timeout_s=60.0")
    first = run([prompts], str(tmp_path / "a"), config, endpoint=url, served_model=model)
    second = run([prompts], str(tmp_path / "b"), config, endpoint=url, served_model=model)
    rows_a = {(r["id"], r["sample"]): r for r in iter_rows(str(tmp_path / "a"))}
    rows_b = {(r["id"], r["sample"]): r for r in iter_rows(str(tmp_path / "b"))}
    assert sorted(rows_a) == [("q0", 0), ("q0", 1), ("q1", 0), ("q1", 1)] and first["complete"]
    for row in rows_a.values():
        assert row["finish_reason"] in ("length", "stop") and 0 < row["completion_tokens"] <= 6
        assert row["prompt_tokens"] > 5 and row["model"].startswith(model)
    assert {k: r["response"] for k, r in rows_a.items()} == {k: r["response"] for k, r in rows_b.items()}
    assert len({r["response"] for r in rows_a.values()}) > 1  # seeded per unit, not one sample repeated
    assert second["backend"]["api_flavor"] == "transformers"
