"""Endpoint replies that are not what they seem, through the real `klear sample --endpoint` command: content
as parts, empty answers, another model, impossible token counts; and values `klear sample` refuses at once
(counts out of range, credentials in the URL, extra_body keys that would change what the settings record)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from klear.cli import main
from klear.common import storage
from klear.sample.stage import iter_rows
from tests.sample.conftest import write_prompts
from tests.sample.fake_server import FakeServer, expected_parts

FAST = ["--set", "backoff_initial_s=0.01", "--set", "backoff_max_s=0.05", "--set", "request_timeout_s=5"]


def _klear_sample(server: FakeServer, prompts: str, out: Path, *overrides: str) -> int:
    sets = [arg for override in overrides for arg in ("--set", override)]
    return main(["sample", "--prompts", prompts, "--output", str(out), "--config", "tiny", "--endpoint", server.url,
                 "--served-model", server.served_model, *FAST, *sets])


def _rows(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["id"], r["sample"]): r for r in iter_rows(str(out))}


def test_every_content_shape_is_read_and_an_empty_answer_is_retried(fake_server: FakeServer, tmp_path: Path) -> None:
    plans = {"parts": "parts", "parts-think": "parts_think", "null": "null,ok", "empty": "empty,ok",
             "image": "image,ok", "cut-think": "cut_think"}
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": k, "prompt": f"{k} [[plan:{v}]]"} for k, v in plans.items()])
    assert _klear_sample(fake_server, prompts, tmp_path / "out", "n=2") == 0
    rows = _rows(tmp_path / "out")
    assert len(rows) == 12
    for (name, _), row in rows.items():
        reasoning, answer = expected_parts(row["prompt"], row["seed"])
        if name == "parts":  # the text of every part, none lost
            assert (row["response"], row["reasoning"], row["attempts"]) == (answer, None, 1)
        elif name == "cut-think":  # cut right after <think> (tokens written, none shown): an unfinished reasoning
            assert (row["response"], row["reasoning"], row["finish_reason"], row["attempts"]) == ("<think>\n", "", "length", 1)
        elif name == "parts-think":
            assert row["response"] == f"<think>\n{reasoning}\n</think>\n\n{answer}" and row["attempts"] == 1
        else:  # the empty or unreadable first reply was a failed attempt, the second the sample
            assert row["response"].endswith(answer) and row["attempts"] == 2, name

    # A server that only ever answers nothing: the units fail as empty answers, never a sample without text.
    empty = write_prompts(tmp_path / "e.jsonl", [{"id": "fine", "prompt": "fine"},
                                                 {"id": "void", "prompt": "void [[plan:null]]"}])
    assert _klear_sample(fake_server, empty, tmp_path / "out2", "n=1", "max_attempts=2", "max_failed_fraction=0.5") == 0
    assert sorted(_rows(tmp_path / "out2")) == [("fine", 0)]
    report = json.loads((tmp_path / "out2" / "report.json").read_text())
    assert report["failures"]["by_kind"] == {"empty_answer": 1}
    assert "empty answer and no reasoning" in report["failures"]["units"][0]["error"]


def test_a_reply_from_another_model_stops_the_run_unless_allowed(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"ok{i}", "prompt": f"fine {i}"} for i in range(3)]
                            + [{"id": "alias", "prompt": "routed elsewhere [[plan:other]]"}])
    out = tmp_path / "out"
    with FakeServer() as server:
        assert _klear_sample(server, prompts, out, "n=2", "concurrency=1") == 2
        error = capsys.readouterr().err
        assert "answered with model 'some-other-model', not --served-model 'fake-teacher'" in error
        assert "allow_model_mismatch=true" in error and not storage.exists(str(out / storage.MANIFEST_NAME))
        assert server.requests == 7  # one at a time: the six units of ok0..ok2, then the first reply of another model
        # Allowed (an alias): the units sampled before the stop are kept, the rest sampled, the mismatch counted.
        assert _klear_sample(server, prompts, out, "n=2", "concurrency=1", "allow_model_mismatch=true") == 0
        assert server.requests == 7 + 2
    report = json.loads((out / "report.json").read_text())
    assert report["units"]["model_mismatch"] == 2 and report["models"] == {"fake-teacher": 6, "some-other-model": 2}
    assert "**2 samples name another model than 'fake-teacher'**" in (out / "report.md").read_text()
    assert {r["model"] for key, r in _rows(out).items() if key[0] == "alias"} == {"some-other-model"}


def test_a_model_is_the_same_at_a_revision_or_dated_snapshot() -> None:
    from klear.sample.backends.openai_api import same_model

    assert same_model("/models/tiny", "/models/tiny@main") and same_model("gpt-4o", "gpt-4o-2024-08-06")
    assert not same_model("gpt-4o", "gpt-4o-mini") and not same_model("m.1", "mx1")
    assert not same_model("fake-teacher", "some-other-model") and same_model("a", "a")


def test_a_bad_token_count_is_a_failed_attempt_never_a_lost_shard(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"ok{i}", "prompt": f"fine {i}"} for i in range(4)] + [
        {"id": "huge-once", "prompt": "big [[plan:huge,ok]]"}, {"id": "negative-once", "prompt": "neg [[plan:negative,ok]]"},
        {"id": "huge", "prompt": "always big [[plan:huge]]"}])
    out = tmp_path / "out"
    with FakeServer() as server:
        assert _klear_sample(server, prompts, out, "n=2", "max_attempts=2") == 2
    assert "2 of 14 units failed after up to 2 attempts {'bad_usage': 2}" in capsys.readouterr().err
    failed = pq.read_table(tmp_path / "out.work" / "failed" / "part-00000.parquet").to_pylist()
    assert {f["id"] for f in failed} == {"huge"}
    assert "usage.prompt_tokens is 3000000000, not a count in 0..2147483647" in failed[0]["error"]
    # Every completed unit was written: a healed server is asked only for the two that failed.
    with FakeServer(obey_plans=False) as healed:
        assert _klear_sample(healed, prompts, out, "n=2", "max_attempts=2") == 0
        assert healed.requests == 2
    rows = _rows(out)
    assert len(rows) == 14 and all(0 <= r["prompt_tokens"] < 2**31 and r["completion_tokens"] >= 0
                                   for r in rows.values())
    assert rows[("huge-once", 0)]["attempts"] == 2 and rows[("negative-once", 1)]["attempts"] == 2


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "klear.cli", "sample", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("override", "message"), [
    ("n=99999999999999999999", "n: Input should be less than or equal to 65536"),
    ("max_attempts=100000", "max_attempts: Input should be less than or equal to 1000"),
    ("max_tokens=3000000000", "max_tokens: Input should be less than or equal to 2147483647"),
    ("concurrency=10000000", "concurrency: Input should be less than or equal to 65536"),
])
def test_counts_out_of_range_are_refused_at_once(fake_server: FakeServer, tmp_path: Path, override: str,
                                                 message: str) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "q"}])
    result = _cli("--prompts", prompts, "--output", str(tmp_path / "o"), "--config", "tiny", "--endpoint",
                  fake_server.url, "--served-model", "fake-teacher", "--set", override)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert fake_server.requests == 0 and not (tmp_path / "o").exists()


def test_credentials_in_the_endpoint_url_are_refused_unechoed(fake_server: FakeServer, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "q"}])
    host = fake_server.url.removeprefix("http://")
    for endpoint, what in ((f"http://user:pw-s3cr3t@{host}?token=tok-s3cr3t", "a user:password and a query string"),
                           (f"http://{host}?api_key=tok-s3cr3t", "a query string")):
        result = _cli("--prompts", prompts, "--output", str(tmp_path / "o"), "--config", "tiny", "--endpoint",
                      endpoint, "--served-model", "fake-teacher")
        assert result.returncode == 2, result.stderr[-2000:]
        assert f"--endpoint {fake_server.url} carries {what} (not shown)" in result.stderr
        assert "$OPENAI_API_KEY" in result.stderr and "klear-endpoint" in result.stderr
        assert "s3cr3t" not in result.stderr + result.stdout
    assert fake_server.requests == 0 and fake_server.auth_seen == [] and not (tmp_path / "o").exists()


def test_extra_body_may_not_shadow_a_setting(fake_server: FakeServer, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "q"}])
    for extra, message in (('{"temperature": 1.0, "max_tokens": 99999}', "extra_body.temperature shadows the setting "
                                                                         "temperature: set it with --set temperature"),
                           ('{"max_completion_tokens": 99999}', "extra_body.max_completion_tokens shadows the "
                                                                "setting max_tokens"),
                           ('{"seed": 7}', "extra_body.seed would replace what each request sets itself"),
                           ('{"top_k": 20}', "extra_body.top_k shadows the setting top_k")):
        assert _klear_sample(fake_server, prompts, tmp_path / "o", f"extra_body={extra}") == 2
        assert message in capsys.readouterr().err
    assert fake_server.requests == 0 and not storage.exists(str(tmp_path / "o" / storage.MANIFEST_NAME))
    # api_flavor=openai has no top_k field: extra_body is the way, and what it sends is what is recorded.
    assert _klear_sample(fake_server, prompts, tmp_path / "o", "api_flavor=openai", 'extra_body={"top_k": 20}',
                         "n=1") == 0
    assert fake_server.bodies[-1]["top_k"] == 20
    sampling = storage.read_manifest(str(tmp_path / "o")).meta["settings"]["sampling"]
    assert sampling["top_k"] == 20 and sampling["temperature"] == fake_server.bodies[-1]["temperature"] == 0.6
    assert "| top_k | 20 |" in (tmp_path / "o" / "report.md").read_text()
