import argparse
from collections.abc import Callable

import pytest

from benchmarks.repeat import (
    add_repeat_argument,
    cpu_flags,
    cpu_model,
    in_turns,
    interleaved,
    preamble,
    spread,
    timed,
)

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16
"""


def test_the_two_sides_take_turns_and_swap_who_goes_first():
    calls: list[str] = []

    def first() -> str:
        calls.append("a")
        return "a"

    def second() -> str:
        calls.append("b")
        return "b"

    assert list(interleaved(3, first, second)) == [("a", "b")] * 3
    assert calls == ["a", "b", "b", "a", "a", "b"]


def test_no_runs_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        list(interleaved(0, lambda: 1, lambda: 2))
    with pytest.raises(ValueError, match="ratio: no runs"):
        spread("ratio", [])


def test_the_spread_gives_median_and_range():
    line = spread("ratio", [0.9, 1.2, 0.8], "x")
    assert line.startswith("ratio: median 0.90x (min 0.80x, max 1.20x; 3 runs")


def test_the_machine_names_model_and_the_flags_that_matter():
    assert cpu_model(CPUINFO) == "AMD EPYC 9B14"
    flags = cpu_flags(CPUINFO)
    assert flags["avx512f"] and flags["avx512_bf16"] and not flags["amx_bf16"]


def test_repeat_defaults_to_three():
    parser = argparse.ArgumentParser()
    add_repeat_argument(parser)
    assert parser.parse_args([]).repeat == 3 and parser.parse_args(["--repeat", "5"]).repeat == 5


def test_each_round_starts_with_the_next_side_and_results_keep_the_sides_order():
    calls: list[str] = []

    def side(name: str) -> Callable[[], str]:
        def run() -> str:
            calls.append(name)
            return name
        return run

    rounds = list(in_turns(3, [side("a"), side("b"), side("c")]))
    assert rounds == [["a", "b", "c"]] * 3
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    with pytest.raises(ValueError, match="at least 1"):
        list(in_turns(0, [side("a")]))
    with pytest.raises(ValueError, match="no sides"):
        list(in_turns(1, []))


def test_large_figures_keep_their_thousands_apart():
    assert spread("rows/s", [44225.0, 22671.0, 30000.0], digits=0) == \
        "rows/s: median 30,000 (min 22,671, max 44,225; 3 runs: 44,225; 22,671; 30,000)"


def test_timed_returns_the_result_and_a_duration():
    seconds, result = timed(lambda: sum(range(1000)))
    assert result == 499500 and 0 <= seconds < 5


def test_the_preamble_names_the_machine_then_the_versions():
    machine_line, versions_line = preamble("pytest", "no-such-package-here").splitlines()
    assert machine_line.startswith("machine: ") and "avx512f=" in machine_line and "amx_tile=" in machine_line
    assert versions_line == f"versions: pytest {pytest.__version__}, no-such-package-here (not installed)"
    alone = preamble().splitlines()
    assert len(alone) == 1 and alone[0].startswith("machine: ")  # no packages: no empty versions line
