"""A real vLLM server as the sample stage's endpoint: the chart's teacher command and arguments
(charts/klear-reasoner/templates/teacher.yaml, rendered by Helm) run on vLLM's CPU build, on loopback, serving the
tiny model; `klear sample --endpoint` against it with n > 1, seeds, max_tokens truncation and the reasoning field
as this vLLM version names it (`reasoning`, from `--reasoning-parser deepseek_r1`)."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from klear.sample.stage import iter_rows
from tests.conftest import free_port
from tests.deploy.helpers import CREDENTIALS, find, merge, render
from tests.gpu_paths.conftest import VLLM_ENV, klear, write_prompts
from tests.processes import served_on_loopback

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]

SERVED = "deepseek-r1"


def teacher_command(model: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The teacher container's command, arguments and environment as the chart renders them, for this machine:
    the model folder for the volume, this interpreter for `python`, loopback for the pod's 0.0.0.0."""
    values = merge(CREDENTIALS, {"teacher": {"enabled": True, "servedModelName": SERVED, "port": port,
                                             "tensorParallelSize": 1, "maxModelLen": 512,
                                             "model": {"source": "pvc", "pvc": {"claimName": "models"}}}})
    server = find(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert server["command"][0] == "python" and "--model=/model" in server["args"]
    replace = {"--model=/model": f"--model={model}", "--host=0.0.0.0": "--host=127.0.0.1"}
    command = [sys.executable, *server["command"][1:], *[replace.get(a, a) for a in server["args"]]]
    return command, {e["name"]: e["value"] for e in server.get("env", [])}


@pytest.fixture(scope="module")
def server(vllm_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    command, env = teacher_command(vllm_model, port)
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    with served_on_loopback(command, {**os.environ, **VLLM_ENV, **env}, log, port, "the vLLM server", 240) as url:
        yield url


def test_the_reasoning_field_is_named_reasoning(server: str) -> None:
    body = {"model": SERVED, "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 8, "seed": 1}
    request = urllib.request.Request(f"{server}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        message = json.loads(response.read())["choices"][0]["message"]
    # A random model never closes its <think>: everything it says is reasoning, and the answer is empty.
    assert isinstance(message["reasoning"], str) and message["reasoning"] and not message.get("content")


def test_sample_against_the_chart_server(server: str, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"What is {i} + 5?"} for i in range(3)])
    sets = ["n=3", "max_tokens=10", "seed=7"]
    args = ["--prompts", prompts, "--endpoint", server, "--served-model", SERVED, "--config", "tiny"]
    for out in ("a", "b"):
        klear("sample", *args, "--output", str(tmp_path / out), *[x for s in sets for x in ("--set", s)])
    rows = {(r["id"], r["sample"]): r for r in iter_rows(str(tmp_path / "a"))}
    again = {(r["id"], r["sample"]): r for r in iter_rows(str(tmp_path / "b"))}
    assert sorted(rows) == [(f"q{i}", j) for i in range(3) for j in range(3)]
    for row in rows.values():
        # Cut inside the reasoning at max_tokens: the normal form keeps the reasoning and no closing tag.
        assert row["finish_reason"] == "length" and row["completion_tokens"] == 10, row
        assert row["response"].startswith("<think>\n") and "</think>" not in row["response"] and row["model"] == SERVED
    assert len({r["response"] for r in rows.values()}) > 3  # per-unit seeds: the samples of a prompt differ
    assert {k: r["response"] for k, r in rows.items()} == {k: r["response"] for k, r in again.items()}
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["complete"] and report["backend"]["backend"] == "openai"


def test_a_request_at_the_shipped_defaults_ratio_is_served(server: str) -> None:
    """The chart's server length against the paper preset's max_tokens, scaled to this server's 512: a request for
    that share of the length (and a short prompt) is served, not refused. Equal lengths, as the chart once had,
    leave no room for any prompt: vLLM's server allows max_model_len - max_tokens prompt tokens."""
    import yaml

    from klear.common.config import load_config
    from klear.sample.config import SampleConfig

    chart = yaml.safe_load((Path(__file__).parents[2] / "charts" / "klear-reasoner" / "values.yaml").read_text())
    ratio = load_config(SampleConfig, "paper", []).max_tokens / chart["teacher"]["maxModelLen"]
    assert ratio < 0.9, "the chart's teacher.maxModelLen leaves the prompt under a tenth of the context"

    def ask(max_tokens: int) -> int:
        body = {"model": SERVED, "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": max_tokens,
                "seed": 1}
        request = urllib.request.Request(f"{server}/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert ask(int(512 * ratio)) == 200
    assert ask(512) == 400  # the old ratio: no room for the prompt
