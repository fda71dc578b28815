import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from klear.common.parallel import available_cores, cgroup_cpu_limit, ordered_map, read_ahead, resolve_workers


def _square_after_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_ordered_map_keeps_order_across_processes() -> None:
    results = list(ordered_map(_square_after_pid, range(200), workers=2))
    assert [r[0] for r in results] == [x * x for x in range(200)]
    assert len({r[1] for r in results} - {os.getpid()}) >= 1  # really ran in worker processes


def test_ordered_map_single_worker_runs_inline() -> None:
    assert {pid for _, pid in ordered_map(_square_after_pid, range(5), workers=1)} == {os.getpid()}


def test_read_ahead_keeps_order_and_produces_on_another_thread() -> None:
    producers: set[int] = set()

    def numbers() -> Iterator[int]:
        for x in range(100):
            producers.add(threading.get_ident())
            yield x

    assert list(read_ahead(numbers(), depth=3)) == list(range(100))
    assert producers and threading.get_ident() not in producers


def test_read_ahead_raises_the_producers_error_in_its_place() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("row 2 is malformed")

    stream = read_ahead(failing())
    assert next(stream) == 1
    with pytest.raises(ValueError, match="row 2 is malformed"):
        next(stream)


def test_read_ahead_stops_its_producer_when_the_consumer_stops() -> None:
    produced: list[int] = []

    def endless() -> Iterator[int]:
        x = 0
        while True:
            produced.append(x)
            yield x
            x += 1

    stream = read_ahead(endless(), depth=2)
    assert next(stream) == 0
    stream.close()  # joins the producer
    assert len(produced) <= 4  # the one taken, `depth` queued, and the one it was handing over
    assert not any(t.name == "read-ahead" for t in threading.enumerate())


def test_cgroup_limit_parsing(tmp_path: Path) -> None:
    limited, unlimited = tmp_path / "limited", tmp_path / "unlimited"
    limited.write_text("150000 100000\n")
    unlimited.write_text("max 100000\n")
    assert cgroup_cpu_limit(str(limited)) == 1.5
    assert cgroup_cpu_limit(str(unlimited)) is None
    assert cgroup_cpu_limit(str(tmp_path / "absent")) is None


def test_workers_follow_the_container_limit_not_the_node() -> None:
    assert resolve_workers(3) == 3  # an explicit count is taken as is
    assert available_cores(affinity=64, limit=2.5) == 3  # a pod limited to 2.5 CPUs on a 64-core node
    assert available_cores(affinity=2, limit=None) == 2  # no limit: the affinity mask
    assert available_cores(affinity=4, limit=0.5) == 1  # never zero workers
    assert available_cores(affinity=2, limit=8.0) == 2  # a limit above the mask does not add cores
