"""sft-data: difficulty labels and policies on a set where the right answer is known per row, truncation, the
length filter with a real tokenizer, bad input, and records that `klear sft` trains on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klear.common import storage
from klear.common.config import load_config
from klear.judge.io import SampleInputError
from klear.sft_data.config import SftDataConfig
from klear.sft_data.policy import difficulty, keeps, reference_pass_rate, truncated
from klear.sft_data.stage import SftDataError, run
from tests.judge.samples import boxed, math_record, publish_samples, read_parquet_folder, response, sample_row

CONFIG = load_config(SftDataConfig, "tiny")


# --- pure parts ------------------------------------------------------------------------------------------
def test_difficulty_and_first_k() -> None:
    assert difficulty(0.5, 0.5) == "easy" and difficulty(0.49, 0.5) == "hard" and difficulty(None, 0.5) == "unknown"
    # The first k samples by index count, whatever order they come in and however many extra there are.
    assert reference_pass_rate([(3, False), (0, True), (1, True), (2, False), (4, True)], 4) == 0.5
    assert reference_pass_rate([(0, True)], 4) == 1.0 and reference_pass_rate([], 4) is None


@pytest.mark.parametrize(("policy", "expected"), [
    # (easy, correct), (easy, wrong), (hard, correct), (hard, wrong), (unknown, wrong), (hard, unlabelled)
    ("keep_all", [True, True, True, True, True, True]),
    ("drop_incorrect_on_easy", [True, False, True, True, True, True]),
    ("drop_incorrect", [True, False, True, False, False, True]),
])
def test_policies(policy: str, expected: list[bool]) -> None:
    cases = [("easy", True), ("easy", False), ("hard", True), ("hard", False), ("unknown", False), ("hard", None)]
    assert [keeps(policy, level, correct) for level, correct in cases] == expected  # type: ignore[arg-type]
    assert keeps("drop_incorrect_on_easy", "unknown", False, unknown_as="easy") is False
    assert keeps("keep_all", "hard", None, keep_unlabelled=False) is False


def test_truncated() -> None:
    assert truncated(response("r", "a"), "length") and truncated("<think>\nno end", "stop")
    assert not truncated(response("r", "a"), "stop")


# --- the stage -------------------------------------------------------------------------------------------
def _teacher_and_reference(tmp_path: Path) -> tuple[str, str]:
    """easy: the reference solves it 4/4; hard: 1/4; unknown: no reference samples; open: no answer at all."""
    records = {"easy": math_record("easy", "10", source="numina"), "hard": math_record("hard", "20", source="numina"),
               "unknown": math_record("unknown", "30", source="skywork"),
               "open": {"id": "open", "problem": "Prove that there are infinitely many primes, with a full proof.",
                        "source": "skywork"}}
    teacher = [
        sample_row("easy", 0, boxed("10"), records["easy"]), sample_row("easy", 1, boxed("11"), records["easy"]),
        sample_row("hard", 0, boxed("20"), records["hard"]), sample_row("hard", 1, boxed("21"), records["hard"]),
        sample_row("unknown", 0, boxed("31"), records["unknown"]),
        sample_row("open", 0, response("proof", "Done."), records["open"]),
        sample_row("easy", 2, boxed("10"), records["easy"], finish_reason="length"),  # truncated
        sample_row("hard", 2, "<think>\nthinking forever", records["hard"]),  # no </think>
    ]
    reference = [sample_row("easy", k, boxed("10"), records["easy"], model="ref") for k in range(4)]
    reference += [sample_row("hard", k, boxed("20" if k == 0 else "0"), records["hard"], model="ref") for k in range(4)]
    reference += [sample_row("hard", 9, boxed("20"), records["hard"], model="ref")]  # beyond k=4: not counted
    return (publish_samples(teacher, str(tmp_path / "teacher")), publish_samples(reference, str(tmp_path / "reference")))


EXPECTED = {
    "keep_all": {("easy", 0), ("easy", 1), ("hard", 0), ("hard", 1), ("unknown", 0), ("open", 0)},
    "drop_incorrect_on_easy": {("easy", 0), ("hard", 0), ("hard", 1), ("unknown", 0), ("open", 0)},
    "drop_incorrect": {("easy", 0), ("hard", 0), ("open", 0)},
}


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_each_policy_keeps_exactly_what_it_should(tmp_path: Path, policy: str) -> None:
    teacher, reference = _teacher_and_reference(tmp_path)
    config = load_config(SftDataConfig, "tiny", [f"policy={policy}"])
    report = run(teacher, str(tmp_path / "out"), config, reference=reference)
    records = read_parquet_folder(str(tmp_path / "out"), "records")
    assert {(r["id"], r["sample"]) for r in records} == EXPECTED[policy]
    by_id = {(r["id"], r["sample"]): r for r in records}
    assert by_id[("easy", 0)]["difficulty"] == "easy" and by_id[("easy", 0)]["reference_pass_rate"] == 1.0
    assert by_id[("hard", 0)]["difficulty"] == "hard" and by_id[("hard", 0)]["reference_pass_rate"] == 0.25
    assert by_id[("open", 0)]["correct"] is None and by_id[("open", 0)]["difficulty"] == "unknown"
    assert report["would_keep"] == {p: len(keys) for p, keys in EXPECTED.items()}
    assert report["totals"]["dropped"]["truncated"] == 2 and report["totals"]["unlabelled"] == 1
    assert report["per_source"]["numina"]["easy"] == {"correct": 1, "incorrect": 1}
    assert report["per_source"]["skywork"]["unknown"] == {"incorrect": 1, "unlabelled": 1}
    assert report["difficulty"]["k"] == 4 and report["prompts_missing_from_reference"] == 2
    assert "NO length filter ran" in report["length"]["note"]
    message = by_id[("easy", 0)]["messages"]
    assert [m["role"] for m in message] == ["user", "assistant"]
    assert message[0]["content"].startswith("Problem easy") and message[1]["content"].startswith("<think>\n")
    assert "</think>" in message[1]["content"] and message[1]["content"].endswith("$\\boxed{10}$.")
    with storage.fetch_published(str(tmp_path / "out")) as (local, manifest):
        assert manifest.meta["stage"] == "sft-data"
        assert (local / "token_lengths.png").read_bytes()[:4] == b"\x89PNG"


def test_length_filter_with_the_target_tokenizer(tmp_path: Path, tiny_model: str) -> None:
    record = math_record("p", "4")
    rows = [sample_row("p", 0, boxed("4"), record), sample_row("p", 1, boxed("4", "step " * 2000), record)]
    teacher = publish_samples(rows, str(tmp_path / "teacher"))
    report = run(teacher, str(tmp_path / "out"), CONFIG, tokenizer=tiny_model)
    records = read_parquet_folder(str(tmp_path / "out"), "records")
    assert [(r["sample"], r["tokens"] < CONFIG.max_length) for r in records] == [(0, True)]
    assert report["totals"]["dropped"]["too_long"] == 1
    assert "length filter ran" in report["length"]["note"] and report["length"]["tokenizer"] == tiny_model


def test_bad_input_publishes_nothing(tmp_path: Path) -> None:
    empty = publish_samples([], str(tmp_path / "empty"))
    with pytest.raises(SampleInputError, match="no sample rows"):
        run(empty, str(tmp_path / "out1"), CONFIG)
    assert not (tmp_path / "out1" / storage.MANIFEST_NAME).exists()
    only_truncated = publish_samples([sample_row("p", 0, "<think>\ncut", math_record("p", "1"), "length")],
                                     str(tmp_path / "trunc"))
    with pytest.raises(SftDataError, match="no record"):
        run(only_truncated, str(tmp_path / "out2"), CONFIG)
    assert not (tmp_path / "out2" / storage.MANIFEST_NAME).exists()


def test_records_train_in_klear_sft(tmp_path: Path, tiny_model: str, demo_files: list[str]) -> None:
    from klear.sft.config import SftConfig
    from klear.sft.stage import run as sft_run

    rows = []
    for i, line in enumerate(Path(demo_files[0]).read_text().splitlines()[:12]):
        item = json.loads(line)
        rows.append(sample_row(f"d{i}", 0, item["solution"], item, prompt=item["problem"]))
    teacher = publish_samples(rows, str(tmp_path / "teacher"))
    report = run(teacher, str(tmp_path / "sft-data"), CONFIG, tokenizer=tiny_model)
    assert report["totals"]["kept"] == 12
    config = load_config(SftConfig, "tiny", ["num_epochs=2", "save_steps=100"])
    trained = sft_run(tiny_model, [str(tmp_path / "sft-data")], str(tmp_path / "sft"), config,
                      work_dir=str(tmp_path / "work"))
    assert trained["data"]["read"] == 12 and trained["data"]["kept"] == 12
    assert trained["training"]["global_step"] >= 2


def test_a_tokenizer_sft_cannot_load_is_refused_before_any_work(tmp_path: Path, tiny_model: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """sft-data loads the target tokenizer with sft's own loader (klear.common.tokenizer): what sft would refuse,
    `klear sft-data` refuses first, in the same words, naming the folder."""
    import shutil

    from klear.cli import main
    from klear.sft.config import SftConfig
    from klear.sft.stage import SftError, load_tokenizer

    teacher = publish_samples([sample_row("p", 0, boxed("4"), math_record("p", "4"))], str(tmp_path / "teacher"))
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(Path(tiny_model) / "config.json", bare)
    no_template = tmp_path / "no-template"
    shutil.copytree(tiny_model, no_template)
    (no_template / "chat_template.jinja").unlink()
    sft_config = load_config(SftConfig, "tiny", ["chat_template=model"])
    for folder, expected in ((bare, "no tokenizer files"), (no_template, "no chat template")):
        out = tmp_path / f"out-{folder.name}"
        argv = ["sft-data", "--samples", teacher, "--output", str(out), "--tokenizer", str(folder), "--config", "tiny"]
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert f"{folder}: " in error and expected in error and not out.exists()
        with pytest.raises(SftError) as refused:
            load_tokenizer(folder, str(folder), sft_config)
        assert str(refused.value) in error
