"""The speed figures a sample run reports."""

from __future__ import annotations

import time

from klear.sample.progress import Progress


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
    assert speed["sampling_s"] >= 0.2
