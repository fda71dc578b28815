import argparse

import pytest

from benchmarks.repeat import add_repeat_argument, cpu_flags, cpu_model, interleaved, spread

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
