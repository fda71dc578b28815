"""The endpoint backend against the tests' own fault-injecting OpenAI-compatible server, through `run`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from klear.common import storage
from klear.common.records import RecordError
from klear.sample.backends.base import BackendError
from klear.sample.merge import SampleFailedError
from klear.sample.stage import iter_rows, run
from klear.sample.store import ResumeMismatchError
from tests.sample.conftest import fast_config, write_prompts
from tests.sample.fake_server import FakeServer, expected_parts


def _rows(output: str) -> dict[tuple[str, int], dict]:
    rows = list(iter_rows(output))
    keyed = {(r["id"], r["sample"]): r for r in rows}
    assert len(keyed) == len(rows), "duplicate units in the output"
    return keyed


def _sample(server: FakeServer, prompts: str, out: Path, *overrides: str, **kwargs: str) -> dict:
    return run([prompts], str(out), fast_config(*overrides), endpoint=server.url, served_model=server.served_model,
               **kwargs)


def test_every_fault_is_retried_and_every_reasoning_shape_normalized(fake_server: FakeServer, tmp_path: Path) -> None:
    plans = {"shape-reasoning": "ok", "shape-rc": "ok_rc", "shape-think": "ok_think", "shape-r1": "ok_r1",
             "plain": "plain", "cut": "cut", "rate": "429,ok", "err": "500,503,ok", "hang": "hang,ok",
             "drop": "drop,ok", "empty200": "nochoices,ok", "garbage": "garbage,ok"}
    prompts = write_prompts(tmp_path / "p.jsonl", [
        {"id": name, "prompt": f"{name} [[plan:{plan}]]", "answer": name.upper()} for name, plan in plans.items()])
    fake_server.hang_s = 3.0
    fake_server.retry_after = "1"
    started = time.monotonic()
    report = _sample(fake_server, prompts, tmp_path / "out", "n=2", "request_timeout_s=0.5")
    rows = _rows(str(tmp_path / "out"))
    assert len(rows) == 24 and report["units"]["failed"] == 0 and report["complete"]
    for (name, _index), row in rows.items():
        reasoning, answer = expected_parts(row["prompt"], row["seed"])
        if name == "plain":
            assert row["response"] == answer and row["reasoning"] is None
        elif name == "cut":
            assert row["response"] == f"<think>\n{reasoning}" and row["finish_reason"] == "length"
        else:
            assert row["response"] == f"<think>\n{reasoning}\n</think>\n\n{answer}", name
            assert (row["reasoning"], row["final"], row["finish_reason"]) == (reasoning, answer, "stop")
        assert json.loads(row["record"]) == {"id": name, "answer": name.upper()}
        assert row["model"] == "fake-teacher" and row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
        assert row["attempts"] == (3 if name == "err" else 2 if "," in plans[name] else 1)
    # One request per unit, the unit's own seed, the sampling settings of the tiny preset.
    seeds = {(b["messages"][-1]["content"], b["seed"]) for b in fake_server.bodies}
    assert len(seeds) == 24 and all(b["temperature"] == 0.6 and b["max_tokens"] == 32 for b in fake_server.bodies)
    assert fake_server.requests == 24 + 2 * 6 + 2  # the retries of six faulty plans, twice each for "err"
    assert time.monotonic() - started >= 1.0  # Retry-After: 1 was honoured
    assert report["speed"]["retries"] == 14
    assert 0 < report["speed"]["process_cpu_s"] < report["speed"]["sampling_s"] * 4  # this process, a few threads
    assert 0 < report["speed"]["own_work_s"] < report["speed"]["sampling_s"]  # shards written between completions
    assert f"| sampling thread's own work (shards, bookkeeping) | {report['speed']['own_work_s']} s of " in (
        tmp_path / "out" / "report.md").read_text()
    published = storage.read_manifest(str(tmp_path / "out"))
    assert {"samples/part-00000.parquet", "failed/part-00000.parquet", "report.json", "report.md"} <= set(published.files)


def test_a_unit_that_keeps_failing_is_recorded_and_retried_by_a_rerun(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"ok{i}", "prompt": f"fine {i}"} for i in range(5)]
                            + [{"id": "bad", "prompt": "broken [[plan:500]]"}])
    out = tmp_path / "out"
    with FakeServer() as server:
        with pytest.raises(SampleFailedError, match=r"2 of 12 units failed .*'http_500': 2.*nothing published"):
            _sample(server, prompts, out, "n=2", "max_attempts=3")
        assert server.attempts[("broken [[plan:500]]", server.bodies[-1]["seed"])] == 3
    assert not storage.exists(str(out / storage.MANIFEST_NAME))
    report = json.loads((tmp_path / "out.work" / "report.json").read_text())
    assert report["failures"]["by_kind"] == {"http_500": 2} and not report["published"]
    failed = pq.read_table(tmp_path / "out.work" / "failed" / "part-00000.parquet").to_pylist()
    assert {(f["id"], f["sample"], f["error_kind"], f["attempts"]) for f in failed} == {("bad", 0, "http_500", 3),
                                                                                       ("bad", 1, "http_500", 3)}
    assert failed[0]["error"] == "upstream overloaded"

    # The server recovers: only the two failed units are sampled again.
    with FakeServer(obey_plans=False) as healed:
        report = _sample(healed, prompts, out, "n=2", "max_attempts=3")
        assert healed.requests == 2
    assert report["units"]["done_before"] == 10 and report["units"]["sampled"] == 2 and report["complete"]
    assert sorted(_rows(str(out))) == sorted([(f"ok{i}", j) for i in range(5) for j in range(2)] + [("bad", 0), ("bad", 1)])


def test_failures_within_max_failed_fraction_are_published_with_the_failed_rows(fake_server: FakeServer,
                                                                                  tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "fine"},
                                                   {"id": "b", "prompt": "too long [[plan:400]]"}])
    report = _sample(fake_server, prompts, tmp_path / "out", "n=2", "max_failed_fraction=0.5")
    assert report["published"] and not report["complete"] and report["failures"]["by_kind"] == {"http_400": 2}
    # A 400 is not retried: the prompt cannot succeed.
    assert all(u["attempts"] == 1 and "maximum context length" in u["error"] for u in report["failures"]["units"])
    assert sorted(_rows(str(tmp_path / "out"))) == [("a", 0), ("a", 1)]
    failed = pq.read_table(tmp_path / "out" / "failed" / "part-00000.parquet").to_pylist()
    assert sorted((f["id"], f["sample"]) for f in failed) == [("b", 0), ("b", 1)]
    assert "## Failed units" in (tmp_path / "out" / "report.md").read_text()


def test_a_wrong_key_or_model_stops_the_run_at_once_with_the_servers_message(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(20)])
    with FakeServer(api_key="right-key") as server:
        monkeypatch.setenv("OPENAI_API_KEY", "wrong-key")
        with pytest.raises(BackendError, match=r"refused the API key from \$OPENAI_API_KEY \(401\): Incorrect API key"):
            _sample(server, prompts, tmp_path / "out")
        assert server.requests == 0
        monkeypatch.setenv("OPENAI_API_KEY", "right-key")
        with pytest.raises(BackendError, match=r"does not serve 'other-model'; it serves \['fake-teacher'\]"):
            run([prompts], str(tmp_path / "out"), fast_config(), endpoint=server.url, served_model="other-model")
    with FakeServer(served_model="fake-teacher", default="404") as server:
        with pytest.raises(BackendError, match="answered 404 for model 'fake-teacher': The model does not exist"):
            _sample(server, prompts, tmp_path / "out", "concurrency=1")
        assert server.requests == 1  # not retried, and nothing else was sent
    assert not storage.exists(str(tmp_path / "out" / storage.MANIFEST_NAME))


def test_an_unreachable_endpoint_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free, and nobody listens once the socket is closed
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "q"}])
    with pytest.raises(BackendError, match=rf"cannot reach endpoint http://127.0.0.1:{port}/v1 \(.*refused"):
        run([prompts], str(tmp_path / "out"), fast_config(), endpoint=f"http://127.0.0.1:{port}/v1",
            served_model="m")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists()


def test_bad_prompts_are_named_and_nothing_is_written(fake_server: FakeServer, tmp_path: Path) -> None:
    cases = {
        "noid.jsonl": ([{"prompt": "q"}], r"noid.jsonl:1: no prompt id in field 'id'"),
        "noprompt.jsonl": ([{"id": "a", "text": "q"}], r"noprompt.jsonl:1: prompt field 'prompt' is missing"),
        "dup.jsonl": ([{"id": "a", "prompt": "q"}, {"id": "a", "prompt": "r"}],
                      r"prompt id 'a' appears twice: .*dup.jsonl:1 and .*dup.jsonl:2"),
        "empty.jsonl": ([], r"empty.jsonl: no prompts \(an empty source\)"),
    }
    for name, (rows, message) in cases.items():
        prompts = write_prompts(tmp_path / name, rows)
        with pytest.raises(RecordError, match=message):
            _sample(fake_server, prompts, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="input not found"):
        _sample(fake_server, str(tmp_path / "missing.jsonl"), tmp_path / "out")
    assert fake_server.requests == 0 and not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists()


def test_changed_settings_are_refused_and_n_can_grow(fake_server: FakeServer, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(3)])
    out = tmp_path / "out"
    _sample(fake_server, prompts, out, "n=2")
    for change, named in (("temperature=0.7", "sampling.temperature: 0.6 -> 0.7"), ("seed=1", "sampling.seed: 0 -> 1"),
                          ("max_tokens=64", "sampling.max_tokens: 32 -> 64")):
        with pytest.raises(ResumeMismatchError, match=f"other settings .*{named}.*write to a new --output"):
            _sample(fake_server, prompts, out, "n=2", change)
    with pytest.raises(ResumeMismatchError, match="identity.model: 'fake-teacher' -> 'bigger'"):
        with FakeServer(served_model="bigger") as other:
            run([prompts], str(out), fast_config("n=2"), endpoint=other.url, served_model="bigger")
    before = fake_server.requests
    report = _sample(fake_server, prompts, out, "n=3")  # n is not a sampling setting: the output is topped up
    assert fake_server.requests - before == 3 and report["units"]["done_before"] == 6
    assert len(_rows(str(out))) == 9


def test_unseeded_requests_carry_no_seed_and_keep_to_their_own_work(fake_server: FakeServer, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(3)])
    seeded = _sample(fake_server, prompts, tmp_path / "seeded", "n=2")
    assert all("seed" in body for body in fake_server.bodies)
    # Seeding every unit is the default, and records nothing new: the settings (and the work area they key) of runs
    # made before seed_per_unit existed stay theirs.
    assert "seed_per_unit" not in seeded["settings"]["sampling"]
    before = len(fake_server.bodies)
    report = _sample(fake_server, prompts, tmp_path / "out", "n=2", "seed_per_unit=false")
    assert report["complete"] and report["settings"]["sampling"]["seed_per_unit"] is False
    assert len(fake_server.bodies) - before == 6 and not any("seed" in b for b in fake_server.bodies[before:])
    rows = _rows(str(tmp_path / "out"))
    assert sorted(rows) == [(f"p{i}", j) for i in range(3) for j in range(2)]
    assert all(row["seed"] is None for row in rows.values())
    # Units drawn unseeded are other samples than seeded ones: a seeded restart does not mix into them.
    with pytest.raises(ResumeMismatchError, match="sampling.seed_per_unit: False -> '\\(unset\\)'"):
        _sample(fake_server, prompts, tmp_path / "out", "n=2")


def test_a_rerun_of_a_complete_output_does_nothing(fake_server: FakeServer, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(3)])
    out = tmp_path / "out"
    first = _sample(fake_server, prompts, out, "n=2")
    manifest = (out / storage.MANIFEST_NAME).stat().st_mtime_ns
    again = _sample(fake_server, prompts, out, "n=2")
    assert again == first and fake_server.requests == 6 and (out / storage.MANIFEST_NAME).stat().st_mtime_ns == manifest
    fewer = _sample(fake_server, prompts, out, "n=1")  # other units wanted: published anew from the shards
    assert fake_server.requests == 6 and fewer["units"]["rows"] == 3 and fewer["units"]["stale_rows_dropped"] == 3
    assert sorted(_rows(str(out))) == [("p0", 0), ("p1", 0), ("p2", 0)]


def test_the_work_area_can_go_and_a_rerun_builds_on_the_published_output(fake_server: FakeServer,
                                                                         tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(3)])
    out = tmp_path / "out"
    first = _sample(fake_server, prompts, out, "n=2", "keep_work=false")
    assert not (tmp_path / "out.work").exists() and first["units"]["rows"] == 6
    before = fake_server.requests
    report = _sample(fake_server, prompts, out, "n=3", "keep_work=false")
    assert fake_server.requests - before == 3 and report["units"]["done_before"] == 6
    rows = _rows(str(out))
    assert len(rows) == 9 and rows[("p0", 0)]["response"].endswith(expected_parts("q0", rows[("p0", 0)]["seed"])[1])


def test_records_backend_imports_shipped_traces(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "traces.jsonl", [
        {"id": "m1", "messages": [{"role": "user", "content": "Q1"},
                                  {"role": "assistant", "content": "<think>\nR1\n</think>\n\nA1"}], "answer": "1"},
        {"id": "m2", "problem": "Q2", "generations": ["<think>\nR2a\n</think>\n\nA2a", "<think>\nR2b cut"]},
    ])
    curated = write_prompts(tmp_path / "curated.jsonl", [  # curate keeps the source row as JSON in `record`
        {"id": "c1", "source": "r1", "prompt": "Q3", "record": json.dumps(
            {"answer": "3", "messages": [{"role": "user", "content": "Q3"},
                                         {"role": "assistant", "content": "A3", "reasoning_content": "R3"}]})}])
    report = run([prompts + "#prompt=problem", curated], str(tmp_path / "out"), fast_config("backend=records", "n=16"))
    rows = _rows(str(tmp_path / "out"))
    assert sorted(rows) == [("c1", 0), ("m1", 0), ("m2", 0), ("m2", 1)] and report["backend"]["backend"] == "records"
    assert rows[("c1", 0)]["response"] == "<think>\nR3\n</think>\n\nA3" and rows[("c1", 0)]["source"] == "r1"
    assert rows[("m1", 0)]["response"] == "<think>\nR1\n</think>\n\nA1" and rows[("m1", 0)]["prompt"] == "Q1"
    assert (rows[("m2", 1)]["finish_reason"], rows[("m2", 1)]["response"]) == ("length", "<think>\nR2b cut")
    assert json.loads(rows[("m1", 0)]["record"])["answer"] == "1"
    with pytest.raises(RecordError, match="backend=records needs a response"):
        run([write_prompts(tmp_path / "bare.jsonl", [{"id": "x", "prompt": "q"}])], str(tmp_path / "o2"),
            fast_config("backend=records"))


def test_a_second_writer_is_refused_and_the_work_area_stays_outside_the_output(tmp_path: Path) -> None:
    import threading

    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(4)])
    out = tmp_path / "out"
    with FakeServer(latency_s=0.3) as server:
        first = threading.Thread(target=_sample, args=(server, prompts, out, "n=2", "concurrency=1"))
        first.start()
        while server.requests == 0:
            time.sleep(0.01)
        with pytest.raises(storage.OutputBusyError, match="is being written by another run"):
            _sample(server, prompts, out, "n=2")
        first.join()
    assert len(_rows(str(out))) == 8
    with pytest.raises(storage.InvalidOutputError, match="--output .* contains --work .*one would replace the other"):
        run([prompts], str(tmp_path / "o2"), fast_config(), endpoint="http://127.0.0.1:9/v1", served_model="m",
            work=str(tmp_path / "o2" / "work"))
