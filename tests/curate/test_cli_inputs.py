"""`klear curate` as a user runs it: repeated flags, a published curate output as input, sources that share a
file name. Each test drives the real command in a subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from klear import testsets as benchmarks
from klear.common import storage
from klear.common.records import read_records
from klear.demo.generate import generate


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "data"
    generate(str(out), math_count=40, code_count=6, seed=3)
    return out


def curate(*args: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Runs `klear curate ARGS --config tiny`; returns (report.json of --output, the process)."""
    proc = subprocess.run([sys.executable, "-m", "klear.cli", "curate", *args, "--config", "tiny"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    output = args[args.index("--output") + 1]
    return json.loads((Path(output) / "report.json").read_text()), proc


def kept_rows(output: Path) -> list[dict]:
    with storage.fetch_published(str(output)) as (local, _):
        return pq.read_table(local / "prompts").to_pylist()


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_repeated_input_flags_read_every_source(demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report, _ = curate("--input", f"{demo}/math.jsonl#prompt=problem", "--input", f"{demo}/code.jsonl#prompt=question",
                       "--output", str(out))
    assert set(report["per_source"]) == {"math", "code"}
    math_lines = len((demo / "math.jsonl").read_text().splitlines())
    assert report["totals"]["read"] == math_lines + 6


def test_repeated_benchmark_flags_index_every_test_set(tmp_path: Path) -> None:
    aime = read_records(str(benchmarks.path("aime24")))[0]["problem"]
    hmmt = read_records(str(benchmarks.path("hmmt_feb_2025")))[1]["problem"]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [
        {"id": "aime-copy", "prompt": aime}, {"id": "hmmt-copy", "prompt": hmmt},
        {"id": "clean", "prompt": "How many ways can nine distinct books be arranged on a shelf of four slots?"},
    ])
    out = tmp_path / "out"
    report, _ = curate("--input", str(prompts), "--benchmark", str(benchmarks.path("aime24")),
                       "--benchmark", str(benchmarks.path("hmmt_feb_2025")), "--output", str(out))
    assert set(report["per_benchmark"]) == {"aime24", "hmmt_feb_2025"}
    assert [row["id"] for row in kept_rows(out)] == ["clean"]


def test_published_curate_output_is_a_valid_input(demo: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    report1, _ = curate("--input", f"{demo}/math.jsonl#prompt=problem", f"{demo}/code.jsonl#prompt=question",
                        "--output", str(first))
    assert report1["totals"]["removed"] > 0  # the demo plants duplicates and leaks: removed/ is not empty
    report2, _ = curate("--input", str(first), "--output", str(second))
    # Only prompts/ is read (not removed/ nor the reports), and nothing in it is removed again.
    assert report2["totals"]["read"] == report2["totals"]["kept"] == report1["totals"]["kept"]
    before, after = kept_rows(first), kept_rows(second)
    # Ids, prompts and the original source rows come through unchanged (the row is not wrapped a second time).
    assert [(r["id"], r["prompt"], r["record"]) for r in after] == [(r["id"], r["prompt"], r["record"]) for r in before]


def test_sources_sharing_a_file_name_stay_apart(tmp_path: Path) -> None:
    one = write_jsonl(tmp_path / "d1" / "math.jsonl", [{"prompt": f"Compute {i} plus {i} plus one, step by step."}
                                                       for i in range(3)])
    two = write_jsonl(tmp_path / "d2" / "math.jsonl", [{"prompt": f"Compute {i} times {i} minus one, step by step."}
                                                       for i in range(3)])
    out = tmp_path / "out"
    report, _ = curate("--input", str(one), str(two), "--output", str(out))
    assert {name: counts["read"] for name, counts in report["per_source"].items()} == {"d1/math": 3, "d2/math": 3}
    ids = [row["id"] for row in kept_rows(out)]
    assert ids == [f"d1/math:{i}" for i in (1, 2, 3)] + [f"d2/math:{i}" for i in (1, 2, 3)]


def test_inputs_named_alike_on_purpose_form_one_source_with_distinct_ids(tmp_path: Path) -> None:
    one = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "Find the sum of the first ten odd numbers."}])
    two = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "Find the product of the first four primes."}])
    out = tmp_path / "out"
    report, _ = curate("--input", f"{one}#source=mix", f"{two}#source=mix", "--output", str(out))
    assert report["per_source"]["mix"]["read"] == 2 and list(report["per_source"]) == ["mix"]
    assert [row["id"] for row in kept_rows(out)] == ["mix:1", "mix:2"]


def test_kept_ids_are_unique_even_when_sources_reuse_ids(tmp_path: Path) -> None:
    one = write_jsonl(tmp_path / "x" / "numina.jsonl", [{"id": "7", "prompt": "Find the sum of the first ten odd numbers."}])
    two = write_jsonl(tmp_path / "y" / "skywork.jsonl", [{"id": "7", "prompt": "Find the product of the first four primes."},
                                                         {"id": "8", "prompt": "Find the sum of the first ten odd numbers!"}])
    out = tmp_path / "out"
    curate("--input", str(one), str(two), "--output", str(out))
    # The duplicate (row "8") is removed; the second "7" is a different prompt and keeps a qualified id.
    assert [row["id"] for row in kept_rows(out)] == ["7", "skywork:7"]


def test_source_names_are_lengthened_only_as_far_as_needed() -> None:
    from klear.common.records import parse_sources

    names = [s.name for s in parse_sources([
        "s3://b/a/x/m.jsonl", "/data/b/x/m.jsonl", "/data/y/m.parquet", "/solo/n.jsonl", "/solo/n.jsonl",
        "/k/p.jsonl", "/other/q.jsonl#source=p",
    ])]
    assert names == ["a/x/m", "b/x/m", "y/m", "n", "n (2)", "k/p", "p"]
