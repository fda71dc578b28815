"""Exactly once under SIGKILL: a real `klear sample` process is killed at random moments and restarted until it
finishes; the output must hold every unit once, as the server answered it, for few extra requests."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from klear.sample.stage import iter_rows
from klear.sample.units import unit_seed
from tests.sample.conftest import write_prompts
from tests.sample.fake_server import FakeServer, expected_parts

PROMPTS, N = 40, 4
UNITS = PROMPTS * N


def _command(prompts: str, out: Path, url: str) -> list[str]:
    return [sys.executable, "-m", "klear.cli", "sample", "--prompts", prompts, "--output", str(out),
            "--endpoint", url, "--served-model", "fake-teacher", "--config", "tiny",
            "--set", f"n={N}", "--set", "concurrency=4", "--set", "shard_size=4", "--set", "flush_seconds=0.2",
            "--set", "progress_seconds=0.5"]


def _kill_at(process: subprocess.Popen, moment: float | None, server: FakeServer, requests: int, deadline: float) -> bool:
    """SIGKILL the process after `moment` seconds, or (moment None) once the server has seen `requests` more
    requests; False if it finished first."""
    start, seen = time.monotonic(), server.requests
    while process.poll() is None and time.monotonic() < deadline:
        if (moment is not None and time.monotonic() - start >= moment) or (
                moment is None and server.requests - seen >= requests):
            process.send_signal(signal.SIGKILL)
            process.wait()
            return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_random_moments_then_restart(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"question {i}"} for i in range(PROMPTS)])
    out = tmp_path / "out"
    kills = 0
    with FakeServer(latency_s=0.03, keep_bodies=False) as server:
        command = _command(prompts, out, server.url)
        # Three kills: two at a random point of the sampling (after k requests), one at a random time (start-up,
        # sampling or publishing), each followed by a restart; then a run to the end.
        for moment in (None, rng.uniform(0.2, 2.5), None):
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            kills += _kill_at(process, moment, server, rng.randint(1, UNITS // 3), time.monotonic() + 60)
            if process.poll() is None:
                process.kill()
            process.communicate()
        final = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert final.returncode == 0, final.stderr[-2000:]
        requests = server.requests
    assert kills >= 2  # the runs were really interrupted
    rows = list(iter_rows(str(out)))
    keys = [(r["id"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == UNITS
    assert set(keys) == {(f"p{i}", j) for i in range(PROMPTS) for j in range(N)}
    for row in rows:
        assert row["seed"] == unit_seed(0, row["id"], row["sample"])
        reasoning, answer = expected_parts(row["prompt"], row["seed"])
        assert row["response"] == f"<think>\n{reasoning}\n</think>\n\n{answer}"
    assert requests < 1.5 * UNITS, f"{requests} requests for {UNITS} units"
    report = json.loads((out / "report.json").read_text())
    assert report["units"]["total"] == UNITS and report["complete"]
    # No shard is ever half-written: every file in the work area is a complete shard or a leftover temp file.
    leftovers = [p.name for p in (tmp_path / "out.work" / "shards").iterdir() if not p.name.endswith(".parquet")]
    assert all(name.startswith(".") for name in leftovers)
    assert "progress:" in final.stderr or "sampling done" in final.stderr
    assert os.path.exists(out / "_MANIFEST.json")


def test_sigterm_writes_what_completed_before_the_pod_goes(tmp_path: Path) -> None:
    """Preemption sends SIGTERM first: units completed but not yet in a shard are written on the way out."""
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"question {i}"} for i in range(PROMPTS)])
    out = tmp_path / "out"
    with FakeServer(latency_s=0.05, keep_bodies=False) as server:
        # Shards only every 1,000 units or 10 minutes: without the handler, nothing would be kept.
        command = _command(prompts, out, server.url) + ["--set", "shard_size=1000", "--set", "flush_seconds=600.0"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while server.requests < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 143, stderr.decode()[-2000:]
        sent = server.requests
        final = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert final.returncode == 0, final.stderr[-2000:]
        report = json.loads((out / "report.json").read_text())
    assert report["units"]["done_before"] >= 20  # kept: about every request answered before the signal
    assert report["units"]["done_before"] + report["units"]["sampled"] == UNITS
    assert server.requests - sent == report["units"]["sampled"]
