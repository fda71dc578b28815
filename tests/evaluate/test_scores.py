"""Scores of saved generations with a planted correctness pattern: exact pass@1, stderr, pass@k, truncation and
lengths; the first k samples by index count; errors for too few samples and for off-protocol settings."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from klear.common.config import load_config
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.samples import SampleError, parse_sample_specs
from klear.evaluate.stage import ProtocolMismatchError, check_sampling, run
from tests.evaluate.helpers import TINY_SAMPLING, boxed, publish_samples, respond, row, write_jsonl

TOY = ["benchmarks.toy.kind=math", "benchmarks.toy.k=8", "benchmarks.toy.title=Toy", "only=[toy]"]
GOLD = {"t1": "12", "t2": "\\frac{1}{2}", "t3": "7", "t4": "100"}
CORRECT_TOKENS, WRONG_TOKENS, CUT_TOKENS = 50, 150, 32


def _config(*extra: str) -> EvaluateConfig:
    return load_config(EvaluateConfig, "tiny", [*TOY, *extra])


def _benchmark(tmp: Path) -> str:
    return write_jsonl([{"id": pid, "benchmark": "toy", "problem": f"Compute {pid}.", "answer": answer}
                        for pid, answer in GOLD.items()], tmp / "toy.jsonl")


def _right(pid: str, k: int) -> dict[str, Any]:
    return row(pid, k, boxed({"t2": "0.5"}.get(pid, GOLD[pid])), tokens=CORRECT_TOKENS)


def _wrong(pid: str, k: int, text: str | None = None) -> dict[str, Any]:
    return row(pid, k, text or boxed("3"), tokens=WRONG_TOKENS)


def planted_rows() -> list[dict[str, Any]]:
    """t1: 8 of 8 (+2 wrong past k); t2: 4 of 8, one cut at max tokens; t3: 1 of 8 with indices 0..6 and 10 (the
    correct one last, a hedge); t4: 0 of 8 (+1 right past k); one row of a problem in no benchmark."""
    rows = [_right("t1", k) for k in range(8)] + [_wrong("t1", 8), _wrong("t1", 9)]
    rows += [_right("t2", k) if k % 2 == 0 else _wrong("t2", k) for k in range(7)]
    rows.append(row("t2", 7, "<think>\nso it is \\boxed{\\frac12} and then", "length", CUT_TOKENS))
    rows.append(_wrong("t3", 0, respond("First I thought $\\boxed{7}$, but finally $\\boxed{8}$.")))
    rows.append(_wrong("t3", 1, respond("The answer is 7.")))  # no box
    rows += [_wrong("t3", k) for k in range(2, 7)]
    rows.append(row("t3", 10, respond("First I thought $\\boxed{8}$, but finally $\\boxed{7}$."), tokens=CORRECT_TOKENS))
    rows += [_wrong("t4", k) for k in range(8)] + [_right("t4", 8)]
    rows.append(_wrong("stranger", 0))
    return rows[::-1]  # order in the file must not matter


def test_planted_scores_exactly(planted: dict[str, Any]) -> None:
    report = planted["report"]
    assert report["labels"] == ["sft", "rl"] and report["primary"] == "sft"
    toy = report["benchmarks"]["toy"]
    assert toy == report["models"]["sft"]["benchmarks"]["toy"]
    fractions = [8 / 8, 4 / 8, 1 / 8, 0 / 8]
    mean = sum(fractions) / 4
    assert (toy["k"], toy["problems"], toy["samples"], toy["correct"]) == (8, 4, 32, 13)
    assert toy["pass@1"] == pytest.approx(40.625)
    assert toy["stderr"] == pytest.approx(100 * math.sqrt(sum((f - mean) ** 2 for f in fractions) / 3) / math.sqrt(4))
    assert toy["pass@k"] == pytest.approx({"1": 40.625, "2": 100 * (1 + 22 / 28 + 7 / 28) / 4,
                                           "4": 100 * (1 + 69 / 70 + 35 / 70) / 4, "8": 75.0})
    assert toy["truncated"] == pytest.approx(1 / 32)
    assert toy["mean_response_tokens"] == pytest.approx((13 * CORRECT_TOKENS + 18 * WRONG_TOKENS + CUT_TOKENS) / 32)
    assert toy["verdicts"] == {"correct": 13, "wrong": 17, "no_box": 1, "truncated": 1}
    rl = report["models"]["rl"]["benchmarks"]["toy"]
    assert (rl["pass@1"], rl["stderr"], rl["pass@k"]["8"]) == (100.0, 0.0, 100.0)


def test_first_k_by_index_and_what_was_left_out(planted: dict[str, Any]) -> None:
    report, out = planted["report"], planted["out"]
    sft = report["models"]["sft"]
    assert (sft["beyond_k"], sft["unknown_rows"], sft["unknown_ids"]) == (3, 1, ["stranger"])
    notes = " ".join(report["notes"])
    assert "3 samples beyond their problem's first k" in notes and "1 sample rows of problems in no selected" in notes
    assert "rl.jsonl: sampling settings unknown" in notes
    problems = {(r["label"], r["id"]): r for r in pq.read_table(out / "problems.parquet").to_pylist()}
    assert [problems[("sft", p)]["correct"] for p in GOLD] == [8, 4, 1, 0]
    assert problems[("sft", "t2")]["truncated"] == 1 and problems[("sft", "t2")]["pass_rate"] == 0.5
    judged = pq.read_table(out / "judged.parquet").to_pylist()
    t3 = sorted((r["sample"], r["correct"], r["verdict"]) for r in judged if r["label"] == "sft" and r["id"] == "t3")
    assert t3[0] == (0, False, "wrong") and t3[1] == (1, False, "no_box") and t3[-1] == (10, True, "correct")
    assert not any(r["sample"] >= 8 for r in judged if r["id"] in ("t1", "t4"))  # past k: never judged


def test_settings_are_printed(planted: dict[str, Any]) -> None:
    settings = planted["report"]["settings"]
    assert settings["sampling"]["temperature"] == 0.6 and settings["sampling"]["top_p"] == 0.95
    assert settings["sampling"]["max_tokens"] == 32 and settings["protocol"]["toy"]["k"] == 8
    assert settings["judge"]["verifier"]["code_mode"] == "first-failure"
    assert settings["samples"]["sft"][0]["check"] == "matches the protocol"
    assert settings["samples"]["sft"][0]["sampling"] == TINY_SAMPLING
    assert "allowed (the last one counts)" in settings["math_judging"]
    md = (planted["out"] / "report.md").read_text()
    for text in ("| Toy | 8 | 4 | 40.6 ± 22.5 | 100.0 ± 0.0 |", "| Toy | 40.6 | 22.5 | 50.9 | 62.1 | 75.0 | 3.1% |",
                 "sampling.temperature | 0.6", "sampling.top_p | 0.95", "sampling.max_tokens | 32",
                 "first k samples by sample index", "within &#92;boxed{}."):  # a backslash shows as itself
        assert text in md, text


def test_too_few_samples_is_an_error_naming_the_problems(tmp_path: Path) -> None:
    rows = [_right(pid, k) for pid in GOLD for k in range(8) if not (pid == "t3" and k >= 5)]
    samples = publish_samples(rows, str(tmp_path / "s"))
    with pytest.raises(SampleError, match=r"toy \(k=8\): 1 of 4 problems have fewer samples than k: t3 \(5 of 8\)"):
        run([samples], str(tmp_path / "out"), _config(), [_benchmark(tmp_path)])
    assert not (tmp_path / "out" / "report.json").exists()


def test_a_duplicated_sample_is_an_error(tmp_path: Path) -> None:
    rows = [_right(pid, k) for pid in GOLD for k in range(8)]
    a = write_jsonl(rows, tmp_path / "a.jsonl")
    b = write_jsonl(rows[:1], tmp_path / "b.jsonl")
    with pytest.raises(SampleError, match="sample 0 of problem 't1' appears twice"):
        run([a, b], str(tmp_path / "out"), _config(), [_benchmark(tmp_path)])


def test_samples_off_protocol_are_refused_or_reported(tmp_path: Path) -> None:
    rows = [_right(pid, k) for pid in GOLD for k in range(8)]
    hot = publish_samples(rows, str(tmp_path / "hot"), {**TINY_SAMPLING, "temperature": 1.0, "top_k": 20})
    with pytest.raises(ProtocolMismatchError, match=r"temperature=1.0 \(protocol 0.6\); top_k=20 \(protocol 0\)"):
        run([hot], str(tmp_path / "out"), _config(), [_benchmark(tmp_path)])
    # The official script's extras, declared: then top_k 20 is the protocol and temperature 1.0 still is not.
    with pytest.raises(ProtocolMismatchError, match="temperature") as info:
        run([hot], str(tmp_path / "out"), _config("official_extras.enabled=true"), [_benchmark(tmp_path)])
    assert "top_k" not in str(info.value)


def test_check_sampling() -> None:
    protocol = {"temperature": 0.6, "max_tokens": 32768}
    assert check_sampling({"temperature": 0.6, "max_tokens": 32768, "seed": 3}, protocol) == ("matches", [])
    assert check_sampling({"temperature": 0.6, "max_tokens": 2000}, protocol)[0] == "differs"
    assert check_sampling({"temperature": 0.6}, protocol) == ("unknown", ["not recorded: max_tokens"])
    assert check_sampling(None, protocol)[0] == "unknown" and check_sampling({}, protocol)[0] == "unknown"


def test_sample_specs() -> None:
    specs = parse_sample_specs(["sft=s3://b/x", "s3://b/y", "/data/f.jsonl#id=qid", "rl=file:///a=b"])
    assert [(s.label, s.uri) for s in specs] == [("sft", "s3://b/x"), ("model", "s3://b/y"),
                                                 ("model", "/data/f.jsonl#id=qid"), ("rl", "file:///a=b")]


def test_report_json_is_the_published_one(planted: dict[str, Any]) -> None:
    published = json.loads((planted["out"] / "report.json").read_text())
    assert published["benchmarks"]["toy"]["pass@1"] == pytest.approx(40.625)
    assert {"report.md", "report.html", "scores.png", "pass_counts.png", "lengths-sft.png", "lengths-rl.png",
            "problems.parquet", "judged.parquet", "_MANIFEST.json"} <= {p.name for p in planted["out"].iterdir()}


def test_a_crashed_run_resumes_from_saved_judgements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from klear.judge.pool import Judge

    samples = publish_samples(planted_rows(), str(tmp_path / "s"))
    config = _config("judge.chunk_size=8")
    real = Judge.judge
    calls = {"n": 0}

    def crash_on_third_chunk(self: Judge, rows: Any, problems: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("pod preempted")
        return real(self, rows, problems)

    monkeypatch.setattr(Judge, "judge", crash_on_third_chunk)
    with pytest.raises(RuntimeError, match="pod preempted"):
        run([samples], str(tmp_path / "out"), config, [_benchmark(tmp_path)])
    monkeypatch.setattr(Judge, "judge", real)
    report = run([samples], str(tmp_path / "out"), config, [_benchmark(tmp_path)])
    reused = report["judge"]["reused"]  # the two chunks judged before the crash (rows past k are not judged)
    assert 8 <= reused <= 16 and report["judge"]["judged"] + reused == 32  # judged: judged in this run
    assert report["benchmarks"]["toy"]["pass@1"] == pytest.approx(40.625)
    assert report["benchmarks"]["toy"]["verdicts"] == {"correct": 13, "wrong": 17, "no_box": 1, "truncated": 1}
    assert any(f"{reused} judgements reused" in note for note in report["notes"])
    assert not (tmp_path / "out" / "_scores").exists()  # the publish removed the saved scores
