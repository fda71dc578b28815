"""The demo's learnable task: worked solutions that verify, a held-out split curate finds no overlap with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klear.common.config import load_config
from klear.common.records import read_records
from klear.curate.config import CurateConfig
from klear.curate.stage import run as curate
from klear.demo import tasks
from klear.demo.generate import generate


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo-tasks") / "data"
    generate(str(out), math_count=20, code_count=2, seed=0, arithmetic_count=600, benchmark_count=100)
    return out


def test_worked_solution_adds_column_by_column() -> None:
    assert tasks.worked_lines((47, 38)) == ["7 + 8 = 15", "4 + 3 + 1 = 8"]
    assert tasks.worked_lines((99, 99, 9)) == ["9 + 9 + 9 = 27", "9 + 9 + 2 = 20"]
    assert tasks.solution((47, 38)) == "<think>\n7 + 8 = 15\n4 + 3 + 1 = 8\n</think>\n\nThe answer is $\\boxed{85}$."


def test_splits_are_seeded_and_disjoint_by_operands() -> None:
    bench = tasks.benchmark_items(100, seed=0)
    assert bench == tasks.benchmark_items(100, seed=0) and bench != tasks.benchmark_items(100, seed=1)
    train = tasks.train_items(1500, seed=0, held_out=100)
    def operands(text: str) -> tuple[int, ...]:
        return tuple(sorted(int(x) for x in text.removeprefix("What is ").rstrip("?").split(" + ")))

    held = {operands(row["problem"]) for row in bench}
    assert len(held) == 100 and not held & {operands(row["problem"]) for row in train}
    assert len({row["problem"] for row in train}) == 1500
    # The benchmark does not depend on how many training problems are drawn.
    assert [row["problem"] for row in tasks.benchmark_items(100, seed=0)] == [row["problem"] for row in bench]
    with pytest.raises(ValueError):
        tasks.train_items(4000, seed=0, held_out=100)  # most of the 4095 possible problems: refused, not a long loop


def test_generate_writes_the_training_split_and_the_benchmark(data: Path) -> None:
    rows = read_records(str(data / "arithmetic.jsonl"))
    bench = read_records(str(data / "demo_benchmark.jsonl"))
    assert len(rows) == 600 and len(bench) == 100
    assert set(bench[0]) == {"id", "benchmark", "problem", "answer"} and bench[0]["benchmark"] == "demo"
    row = rows[0]
    assert row["messages"][0] == {"role": "user", "content": row["problem"]}
    assert row["messages"][1]["content"] == row["solution"]
    # The planted rows of math.jsonl are still listed.
    assert json.loads((data / "planted.json").read_text())["planted"]


def test_worked_solutions_verify(data: Path) -> None:
    from klear.verifiers.config import VerifierConfig
    from klear.verifiers.math_verifier import MathVerifier

    rows = read_records(str(data / "arithmetic.jsonl"))[:50]
    with MathVerifier(VerifierConfig(math_workers=1)) as verifier:
        results = verifier.verify_batch([(r["solution"], r["answer"]) for r in rows])
    assert all(r.correct and r.format_ok for r in results)


def test_curate_finds_no_overlap_with_the_benchmark_or_the_shipped_test_sets(data: Path, tmp_path: Path) -> None:
    config = load_config(CurateConfig, "tiny")
    source = [f"{data}/arithmetic.jsonl#prompt=problem"]
    for name, specs in (("demo", [str(data / "demo_benchmark.jsonl")]), ("shipped", None)):
        report = curate(source, str(tmp_path / name), config, specs)
        assert report["totals"]["read"] == 600 and report["totals"]["removed"] == 0, (name, report["totals"])


def test_digits_are_single_tokens(tiny_model: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    pieces = [tok.decode([i]) for i in tok.encode("What is 47 + 385?", add_special_tokens=False)]
    assert [p for p in pieces if p.strip().isdigit()] == ["4", "7", "3", "8", "5"]
