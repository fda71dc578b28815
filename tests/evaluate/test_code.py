"""LiveCodeBench-format problems written for the tests: stdin and functional, private tests in both encodings,
date windows (inclusive, day level), judged as LiveCodeBench does with right, wrong, slow and crashing programs."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from klear.common import storage
from klear.common.config import load_config
from klear.evaluate.benchmarks import BenchmarkError, load_benchmarks
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.stage import run
from tests.evaluate.helpers import lcb_row, program, publish_samples, row, write_jsonl

LCB = ["only=[livecodebench_v5,livecodebench_v6]", "benchmarks.livecodebench_v5.k=4",
       "benchmarks.livecodebench_v6.k=4", "judge.verifier.timeout_s=1"]


def _stdin_tests(inputs: list[int]) -> list[dict[str, str]]:
    return [{"input": f"{n}\n", "output": f"{2 * n}\n", "testtype": "stdin"} for n in inputs]


ADD_TESTS = [{"input": f"{a}\n{b}", "output": str(a + b), "testtype": "functional"} for a, b in ((1, 2), (5, 7), (0, 9))]
STARTER = "class Solution:\n    def add(self, a: int, b: int) -> int:\n        "


def lcb_rows() -> list[dict[str, Any]]:
    return [
        lcb_row("abc100_a", "2024-09-10", _stdin_tests([1, 2, 5, 7]), "packed"),  # v5
        lcb_row("abc200_b", "2025-02-01", _stdin_tests([3, 4]), "json"),  # the shared day: v5 and v6
        lcb_row("lc-add", "2025-03-05", ADD_TESTS, "packed", func_name="add", starter_code=STARTER),  # v6
        lcb_row("abc001_a", "2024-07-31", _stdin_tests([1]), "json"),  # the day before v5: not scored
        lcb_row("abc999_z", "2025-05-02", _stdin_tests([1]), "packed"),  # the day after v6: not scored
    ]


RIGHT = program("print(2 * int(input()))")
# Fails the third test (n = 5) and passes the fourth: stop-at-first-failure counts 2 passed, all-tests would count 3.
WRONG = program("n = int(input())\nprint(0 if n == 5 else 2 * n)")
OFF_BY_ONE = program("print(int(input()) + 1)")
SLOW = program("n = int(input())\nwhile True:\n    n += 1")
CRASH = program("n = int(input())\nprint(n // 0)")
ADD_RIGHT = program(STARTER + "return a + b")
ADD_CRASH = program(STARTER + "return a / 0")


def code_samples() -> list[dict[str, Any]]:
    plan = {"abc100_a": [RIGHT, RIGHT, WRONG, SLOW], "abc200_b": [RIGHT, OFF_BY_ONE, CRASH, SLOW],
            "lc-add": [ADD_RIGHT, ADD_RIGHT, ADD_RIGHT, ADD_CRASH], "abc001_a": [RIGHT] * 4}
    return [row(pid, k, text) for pid, texts in plan.items() for k, text in enumerate(texts)]


def test_windows_are_inclusive_at_day_level(tmp_path: Path) -> None:
    lcb = write_jsonl(lcb_rows(), tmp_path / "test5.jsonl")
    bench = load_benchmarks([lcb], load_config(EvaluateConfig, "tiny", LCB))
    assert bench.members["livecodebench_v5"] == ["abc100_a", "abc200_b"]
    assert bench.members["livecodebench_v6"] == ["abc200_b", "lc-add"]
    assert sorted(bench.outside_windows) == ["abc001_a", "abc999_z"]
    assert bench.problems["abc200_b"].benchmarks == ("livecodebench_v5", "livecodebench_v6")
    assert bench.problems["lc-add"].problem.fn_name == "add" and bench.problems["lc-add"].problem.n_tests == 3
    assert STARTER in bench.problems["lc-add"].prompt
    assert not bench.shipped_math  # no math benchmark selected: the shipped math sets are not read
    custom = load_config(EvaluateConfig, "tiny", [
        "benchmarks.july.kind=code", "benchmarks.july.k=2", "benchmarks.july.start=2024-07-01",
        "benchmarks.july.end=2024-07-31", "only=[july]"])
    assert load_benchmarks([lcb], custom).members == {"july": ["abc001_a"]}


def test_a_code_only_protocol_reads_no_shipped_math_set(tmp_path: Path) -> None:
    """A protocol of LiveCodeBench alone: the shipped AIME/HMMT sets, whose rows name benchmarks it does not
    configure, are not read (they were, and the command failed with "benchmark 'aime24' has no protocol")."""
    import yaml

    from klear.cli import main
    from klear.evaluate import config as evaluate_config

    protocol = yaml.safe_load((Path(evaluate_config.__file__).parent / "presets" / "tiny.yaml").read_text())
    protocol["benchmarks"] = {"livecodebench_v5": protocol["benchmarks"]["livecodebench_v5"] | {"k": 4}}
    protocol["judge"]["verifier"]["timeout_s"] = 1
    config = tmp_path / "code-only.yaml"
    config.write_text(yaml.safe_dump(protocol))
    lcb = write_jsonl(lcb_rows(), tmp_path / "test5.jsonl")
    samples = publish_samples([r for r in code_samples() if r["id"] in ("abc100_a", "abc200_b")],
                              str(tmp_path / "samples"))
    out = tmp_path / "eval"
    assert main(["evaluate", "--samples", samples, "--benchmark", lcb, "--output", str(out), "--config",
                 str(config)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert list(report["benchmarks"]) == ["livecodebench_v5"]
    assert (report["benchmarks"]["livecodebench_v5"]["problems"], report["benchmarks"]["livecodebench_v5"]["correct"]) \
        == (2, 3)
    assert not any("shipped" in note for note in report["notes"])


def test_a_hostile_row_in_a_window_names_the_problem(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple:
            return (open, (str(tmp_path / "pwned"), "w"))

    evil = lcb_row("abc300_c", "2024-10-01", _stdin_tests([1]), "json")
    evil["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(Boom()))).decode()
    lcb = write_jsonl([evil], tmp_path / "evil.jsonl")
    with pytest.raises(BenchmarkError, match="abc300_c.*refusing to load global"):
        load_benchmarks([lcb], load_config(EvaluateConfig, "tiny", LCB))
    assert not (tmp_path / "pwned").exists()


def test_code_scores_on_s3(s3_bucket: str, tmp_path: Path) -> None:
    lcb = f"{s3_bucket}/lcb/test5.jsonl"
    storage.upload_file(write_jsonl(lcb_rows(), tmp_path / "test5.jsonl"), lcb)
    samples = publish_samples(code_samples(), f"{s3_bucket}/runs/samples")
    out = f"{s3_bucket}/runs/evaluate"
    report = run([f"rl={samples}"], out, load_config(EvaluateConfig, "tiny", LCB), [lcb])
    v5, v6 = report["benchmarks"]["livecodebench_v5"], report["benchmarks"]["livecodebench_v6"]
    assert (v5["problems"], v5["correct"], v6["problems"], v6["correct"]) == (2, 3, 2, 4)
    assert v5["pass@1"] == pytest.approx(100 * (2 / 4 + 1 / 4) / 2)  # 37.5
    assert v5["stderr"] == pytest.approx(12.5)  # fractions 0.5, 0.25: sd 0.1768 / sqrt 2
    assert v6["pass@1"] == pytest.approx(50.0) and v6["stderr"] == pytest.approx(25.0)
    assert v6["pass@k"]["4"] == pytest.approx(100.0) and v5["pass@k"]["2"] == pytest.approx(100 * (5 / 6 + 1 / 2) / 2)
    assert report["models"]["rl"]["unknown_rows"] == 4  # abc001_a: outside the windows
    with storage.fetch_published(out) as (local, _):
        judged = {(r["id"], r["sample"]): r for r in pq.read_table(local / "judged.parquet").to_pylist()}
        html = (local / "report.html").read_text()
    verdicts = {key: judged[key]["verdict"] for key in judged}
    assert verdicts == {
        ("abc100_a", 0): "correct", ("abc100_a", 1): "correct", ("abc100_a", 2): "wrong", ("abc100_a", 3): "program_timeout",
        ("abc200_b", 0): "correct", ("abc200_b", 1): "wrong", ("abc200_b", 2): "runtime_error",
        ("abc200_b", 3): "program_timeout",
        ("lc-add", 0): "correct", ("lc-add", 1): "correct", ("lc-add", 2): "correct", ("lc-add", 3): "runtime_error",
    }
    assert (judged[("abc100_a", 2)]["passed"], judged[("abc100_a", 2)]["total"]) == (2, 4)  # stopped at the failure
    assert (judged[("abc200_b", 1)]["passed"], judged[("abc200_b", 1)]["total"]) == (0, 2)
    assert "LiveCodeBench v5" in html and "2024-08-01 .. 2025-02-01" in html
