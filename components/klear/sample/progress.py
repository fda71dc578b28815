"""Progress of a long run: counters the sampling loop updates, a line a timer thread logs."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from klear.common.tracking import format_duration
from klear.sample.backends.base import Completion


@dataclass
class Progress:
    """Counts of this process's work; rates are over this process's time (units done before it do not
    inflate them), the ETA is what is left at the current rate."""

    total: int  # units of the run
    done_before: int  # found done at start
    started: float = field(default_factory=time.monotonic)
    ok: int = 0
    failed: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    failed_kinds: Counter[str] = field(default_factory=Counter)
    ended: float | None = None  # set when sampling is over: the rates stop there
    # Seconds the sampling thread spent on its own work between the backend's completions (shards written, indexes
    # compacted, counts kept), while the engine or server works on: near sampling_s, the stage is the bottleneck.
    own_work_s: float = 0.0
    cpu_started: float = field(default_factory=time.process_time)
    cpu_ended: float | None = None

    def add(self, completion: Completion) -> None:
        self.attempts += completion.attempts
        if completion.ok:
            self.ok += 1
            self.completion_tokens += completion.completion_tokens or 0
        else:
            self.failed += 1
            self.failed_kinds[completion.error_kind] += 1

    def finish(self) -> None:
        self.ended, self.cpu_ended = time.monotonic(), time.process_time()

    def rates(self, now: float | None = None) -> tuple[float, float, float]:
        """(elapsed s, samples/s, tokens/s) of this process."""
        end = now if now is not None else self.ended if self.ended is not None else time.monotonic()
        elapsed = max(end - self.started, 1e-9)
        return elapsed, self.ok / elapsed, self.completion_tokens / elapsed

    def speed(self, elapsed: float) -> dict[str, Any]:
        """The report's speed figures; `elapsed`: the whole run's seconds. process_cpu_s: the CPU time of this
        process (all its threads) while it sampled: what the client itself costs beside a server or an engine's
        own processes; own_work_s: the part of sampling_s the sampling thread spent on its own work."""
        sampling_s, samples_per_s, tokens_per_s = self.rates()
        cpu_end = self.cpu_ended if self.cpu_ended is not None else time.process_time()
        return {"elapsed_s": round(elapsed, 3), "sampling_s": round(sampling_s, 3),
                "samples_per_s": round(samples_per_s, 3), "tokens_per_s": round(tokens_per_s, 1),
                "requests": self.attempts, "retries": self.attempts - self.ok - self.failed,
                "process_cpu_s": round(cpu_end - self.cpu_started, 3), "own_work_s": round(self.own_work_s, 3)}

    def line(self, now: float | None = None) -> str:
        elapsed, per_s, tokens_per_s = self.rates(now)
        finished = self.done_before + self.ok + self.failed
        left = self.total - finished
        eta = left / ((self.ok + self.failed) / elapsed) if self.ok + self.failed else None
        share = 100.0 * finished / self.total if self.total else 100.0
        failed = f", {self.failed} failed ({dict(self.failed_kinds)})" if self.failed else ""
        return (f"{finished}/{self.total} units ({share:.1f}%){failed}, {per_s:.2f} samples/s, "
                f"{tokens_per_s:.0f} tokens/s, retries {self.attempts - self.ok - self.failed}, "
                f"ETA {format_duration(eta)}")


class ProgressLogger:
    """Logs the progress line every `seconds` from a thread, so it appears even while no sample completes
    (a teacher can take minutes per 32K-token answer)."""

    def __init__(self, progress: Progress, seconds: float, log: logging.Logger) -> None:
        self.progress, self.seconds, self.log = progress, seconds, log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="klear-sample-progress", daemon=True)

    def __enter__(self) -> ProgressLogger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds):
            self.log.info("progress: %s", self.progress.line())
