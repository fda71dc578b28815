"""The speed figures a sample run reports."""

from __future__ import annotations

import time
from pathlib import Path

from klear.common.config import load_config
from klear.sample.backends.base import Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.coordinator import sample_units
from klear.sample.progress import Progress
from klear.sample.reasoning import Parsed
from klear.sample.store import WorkArea
from klear.sample.units import Prompt, canonical_hash


def burn(seconds: float) -> None:
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass


def test_process_cpu_counts_the_sampling_only() -> None:
    progress = Progress(total=10, done_before=0)
    burn(0.2)
    progress.finish()
    burn(0.3)  # after sampling (the merge, the report): not the client's cost
    speed = progress.speed(elapsed=5.0)
    assert 0.2 <= speed["process_cpu_s"] < 0.45
    assert speed["elapsed_s"] == 5.0 and speed["requests"] == 0 and speed["retries"] == 0
    assert speed["sampling_s"] >= 0.2 and speed["own_work_s"] == 0.0


WRITE_S, BACKEND_S = 0.2, 0.05  # the extra seconds of each shard write; the backend's between completions


class SlowStore(WorkArea):
    """A work area whose every shard write takes WRITE_S longer, as on a slow object store."""

    def write_shard(self, completions, name=None):  # type: ignore[no-untyped-def]
        time.sleep(WRITE_S)
        return super().write_shard(completions, name)


class PacedBackend:
    """Hands over each request's completion BACKEND_S after the last, as an engine that is still computing."""

    def generate(self, requests):  # type: ignore[no-untyped-def]
        for request in requests:
            time.sleep(BACKEND_S)
            yield Completion(request, Parsed("r", "a", True), "stop", 3, 4, "m")


def test_own_work_counts_the_sampling_threads_shard_writing_not_the_backends_time(tmp_path: Path) -> None:
    chat = ({"role": "user", "content": "q"},)
    prompt = Prompt(0, "p0", chat, "q", "test", "{}", "t:0", canonical_hash(chat))
    requests = [Request(prompt, sample, sample) for sample in range(10)]
    config = load_config(SampleConfig, "tiny", ["shard_size=4"])
    progress = Progress(total=10, done_before=0)
    failed = sample_units(PacedBackend(), SlowStore(str(tmp_path / "work")), requests, config, progress)  # type: ignore[arg-type]
    progress.finish()
    speed = progress.speed(elapsed=10.0)
    assert failed == [] and progress.ok == 10
    # Three shards (4, 4 and the last 2), each written by the sampling thread: its own work; the backend's 10 x 0.05 s
    # are not.
    assert 3 * WRITE_S <= speed["own_work_s"] < 3 * WRITE_S + 10 * BACKEND_S
    assert speed["sampling_s"] >= speed["own_work_s"] + 10 * BACKEND_S
    assert len(list((tmp_path / "work" / "shards").glob("*.parquet"))) == 3
