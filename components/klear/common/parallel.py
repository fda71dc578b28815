"""Ordered parallel map over a stream, with a bounded number of batches in flight; a stream read ahead on a thread."""

from __future__ import annotations

import collections
import math
import multiprocessing
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from klear.common.workers import die_with_parent

T = TypeVar("T")
R = TypeVar("R")


def cgroup_cpu_limit(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> float | None:
    """The CPU limit of this container (cgroup v2 quota / period), or None when unlimited or unknown.

    In a Kubernetes pod the affinity mask lists every core of the node; the pod's CPU limit is here.
    """
    try:
        quota, period = open(cpu_max).read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def available_cores(affinity: int, limit: float | None) -> int:
    """Cores a process may use: its affinity mask, capped by the container's CPU limit (rounded up), at least 1."""
    cores = affinity if limit is None else min(affinity, math.ceil(limit))
    return max(1, cores)


def resolve_workers(requested: int) -> int:
    """0 means one worker per core available to this process (affinity mask and container CPU limit)."""
    if requested > 0:
        return requested
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    return available_cores(affinity, cgroup_cpu_limit())


def ordered_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    workers: int,
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
) -> Iterator[R]:
    """`map(fn, items)` on `workers` processes, results in input order.

    Unlike Pool.imap, which drains its input as fast as it can, at most 4 x workers items are
    read ahead, so memory stays bounded however long the stream is. With one worker everything
    runs in this process (no pickling, easy to debug).
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, items)
        return
    # fork: workers inherit the (read-only) state built by the initializer's arguments cheaply.
    context = multiprocessing.get_context("fork")
    # Workers die with this process (die_with_parent); strictly, with the thread that forks them: the one iterating
    # here (the pool's own thread for a replacement), so iterate on a thread that lives as long as the map.
    setup = (os.getpid(), initializer, initargs)
    with context.Pool(workers, initializer=_start_worker, initargs=setup) as pool:
        pending: collections.deque[Any] = collections.deque()
        for item in items:
            pending.append(pool.apply_async(fn, (item,)))
            if len(pending) >= 4 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _start_worker(parent: int, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    die_with_parent(parent)  # a worker busy in an item would otherwise outlive a killed stage
    if initializer is not None:
        initializer(*initargs)


_END = object()


def read_ahead(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """`items` in order, produced on a background thread at most `depth` ahead of the consumer: the producer's
    numpy, Arrow and file work, which releases the GIL, runs on a second core while the consumer works on the
    previous item. A producer's error is raised here in its place in the stream; a consumer that stops early
    stops the producer before its next item."""
    handoff: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand(value: Any, error: BaseException | None = None) -> bool:
        while not stop.is_set():
            try:
                handoff.put((value, error), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not hand(item):
                    return
            hand(_END)
        except BaseException as exc:  # noqa: BLE001 (handed to the consumer, which raises it)
            hand(_END, exc)

    producer = threading.Thread(target=produce, name="read-ahead", daemon=True)
    producer.start()
    try:
        while True:
            value, error = handoff.get()
            if error is not None:
                raise error
            if value is _END:
                return
            yield value
    finally:
        stop.set()
        producer.join()

