"""What a sample row says, by the contract's one rule for each: the prompt of a source row, the response's
normal form (render and split), and a row's response parts (its columns where they are its response's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from klear.common.chat import (
    THINK_CLOSE,
    THINK_OPEN,
    ResponseParts,
    answer_section,
    answer_start,
    format_fault,
    render_response,
    split_response,
)
from klear.common.sample_rows import MESSAGES_TYPE, PROMPT_FIELDS, iter_sample_tables, prompt_text, response_parts
from tests.judge.samples import boxed, math_record, publish_samples, read_parquet_folder, response, sample_row

# --------------------------------------------------------------------------- the prompt of a source row


def test_prompt_fields_in_the_order_klear_sample_looks() -> None:
    assert PROMPT_FIELDS[0] == "prompt"  # klear sample's default prompt_field
    assert prompt_text({"prompt": "P", "problem": "Q", "question": "R"}) == "P"
    assert prompt_text({"problem": "Q", "question": "R"}) == "Q"
    assert prompt_text({"question": "R"}) == "R"
    assert prompt_text({"prompt": "  \n", "problem": "Q"}) == "Q"  # a blank prompt is no prompt
    assert prompt_text({"prompt": 3, "problem": ["Q"], "question": None}) is None
    assert prompt_text({}) is None


def test_every_stage_takes_the_same_prompt_of_a_row() -> None:
    from klear.common.config import load_config
    from klear.common.records import Source
    from klear.evaluate.benchmarks import _math_problem
    from klear.evaluate.config import EvaluateConfig
    from klear.gppo.data import rl_row
    from klear.judge.problems import problem_from_row

    config = load_config(EvaluateConfig, "tiny", ['math_template="{problem}"'])
    for row, prompt in [({"prompt": "Compute 2 + 2.", "problem": "What is 2 + 2?"}, "Compute 2 + 2."),
                        ({"prompt": " ", "problem": "What is 2 + 2?", "question": "Q?"}, "What is 2 + 2?")]:
        row = {"id": "p1", "benchmark": "aime24", "answer": "4", **row}
        gppo, _ = rl_row(row, "math", "x:1")
        assert gppo is not None and gppo["prompt"][0]["content"] == prompt
        judged = problem_from_row({"id": "p1", "record": json.dumps(row)})
        assert judged is not None and judged.prompt == prompt
        evaluated = _math_problem(row, "x:1", Source.parse("bench.jsonl"), config)
        assert evaluated is not None and evaluated.prompt == prompt


# --------------------------------------------------------------------------- the normal form


@pytest.mark.parametrize("parts", [
    ResponseParts("step 1\nstep 2", "The answer is 4.", True),
    ResponseParts("", "A", True),
    ResponseParts("r", "", True),  # closed, nothing after the reasoning
    ResponseParts("half a thought", "", False),  # cut inside the reasoning
    ResponseParts(None, "just an answer", True),
    ResponseParts("a reasoning naming </think> once", "the answer", True),
])
def test_render_then_split_gives_the_parts_back(parts: ResponseParts) -> None:
    text = render_response(parts)
    assert split_response(text) == parts
    assert render_response(split_response(text)) == text


def test_the_normal_form() -> None:
    assert render_response(ResponseParts("r", "a", True)) == f"{THINK_OPEN}\nr\n{THINK_CLOSE}\n\na"
    assert render_response(ResponseParts("r", "a", True)) == response("r", "a")
    assert render_response(ResponseParts("r", "", False)) == f"{THINK_OPEN}\nr"
    # Raw model text: extra blank lines, a think block the template opened in the prompt.
    assert split_response("<think>\n\n r \n\n</think>\n\n\n a") == ResponseParts("r", "a", True)
    assert split_response("r</think>a") == ResponseParts("r", "a", True)
    assert split_response("  <think>cut") == ResponseParts("cut", "", False)


# --------------------------------------------------------------------------- where thinking ends


@pytest.mark.parametrize(("text", "parts"), [
    # Two ends: the last one ends the thinking (the released reward's split("</think>")[-1]), not the first.
    ("<think>\nR\n</think>\nmid \\boxed{1} </think> The answer is \\boxed{2}",
     ResponseParts("R\n</think>\nmid \\boxed{1}", "The answer is \\boxed{2}", True)),
    ("plain text, no tags", ResponseParts(None, "plain text, no tags", True)),  # no end: an answer without reasoning
    ("<think>\nunclosed, and \\boxed{3}", ResponseParts("unclosed, and \\boxed{3}", "", False)),  # cut inside
    ("R</think>A", ResponseParts("R", "A", True)),  # the template opened <think> in the prompt
    ("Sure. <think>R</think>A", ResponseParts("Sure. <think>R", "A", True)),  # text before <think> stays reasoning
    ("Sure. <think>cut", ResponseParts(None, "Sure. <think>cut", True)),  # ...and without an end, it is no reasoning
])
def test_thinking_ends_at_the_last_think_end(text: str, parts: ResponseParts) -> None:
    assert split_response(text) == parts
    start = answer_start(text)
    assert (start is None) is (text.find(THINK_CLOSE) < 0)
    assert answer_section(text) == (None if start is None else text[start:])
    assert answer_section(text, require_think_end=False) == text.split(THINK_CLOSE)[-1]  # the release's own split
    assert answer_section(text, think_end="") == text


def test_every_reader_of_an_answer_takes_the_same_one() -> None:
    """The sample backends (raw text, a server's parser that split at the first </think>), a row's columns, the
    verifiers and the rewards read one answer from a response with two </think>."""
    from klear.gppo.config import RewardConfig
    from klear.gppo.rewards import format_check
    from klear.sample.reasoning import from_message, from_text
    from klear.verifiers import VerifierConfig
    from klear.verifiers.code_verifier import extract_program, extract_program_release, program_of
    from klear.verifiers.math_verifier import extract_answer

    text = "<think>\nR\n</think>\n\nmid \\boxed{1} ```python\nprint(1)\n``` </think> \\boxed{2}\n```python\nprint(2)\n```"
    rule = split_response(text)
    assert rule.final == "\\boxed{2}\n```python\nprint(2)\n```"
    server = from_message({"reasoning": "R", "content": "mid \\boxed{1} ```python\nprint(1)\n``` </think> "
                                         "\\boxed{2}\n```python\nprint(2)\n```"}, "stop")
    assert from_text(text) == server == rule
    row = {"response": render_response(rule), "reasoning": rule.reasoning, "final": rule.final}
    assert response_parts(row) == rule and split_response(render_response(rule)) == rule
    assert extract_answer(text).answer == "2"
    assert extract_program(text) == "print(2)\n"  # its body keeps the newline before the closing fence
    assert extract_program_release(text) == "print(2)"  # the released code regex agrees while the answer has a block
    assert program_of(text, VerifierConfig(code_rules="release")) == "print(2)"
    # Two </think> is no format fault under the release's rules, one under the paper's (tags repeated).
    assert format_check(text, RewardConfig(mode="official"))[0] is None
    assert format_check(text, RewardConfig())[1].startswith("not one <think>")


@pytest.mark.parametrize(("text", "fault"), [
    ("<think>\nr\n</think>\n\na", None), ("r</think>a", "no_think_start"), ("<think>\nr", "no_think_end"),
    ("no tags", "no_think_end"), ("<think>r</think>a</think>", "malformed"), ("x<think>r</think>a", "malformed"),
    ("<think></think>a", "malformed"), ("</think><think>r", "malformed"),
])
def test_format_faults_in_the_release_order(text: str, fault: str | None) -> None:
    assert format_fault(text) == fault
    assert format_fault(text.removeprefix(THINK_OPEN), think_start_in_prompt=True) == (
        None if fault is None else fault if fault != "no_think_start" else None)


# --------------------------------------------------------------------------- a row's response parts


def test_a_rows_columns_are_its_parts_when_they_are_its_responses() -> None:
    row = {"response": response("r", "a"), "reasoning": "r", "final": "a"}
    assert response_parts(row) == ResponseParts("r", "a", True)
    # The columns tell what a string search cannot: a reasoning that names the closing tag and never ended.
    cut = {"response": f"{THINK_OPEN}\nI will write {THINK_CLOSE} once done", "reasoning": f"I will write "
           f"{THINK_CLOSE} once done", "final": ""}
    assert response_parts(cut) == ResponseParts(f"I will write {THINK_CLOSE} once done", "", False)
    closed_empty = {"response": render_response(ResponseParts("r", "", True)), "reasoning": "r", "final": ""}
    assert response_parts(closed_empty).closed
    plain = {"response": "plain", "reasoning": None, "final": "plain"}
    assert response_parts(plain) == ResponseParts(None, "plain", True)


def test_columns_that_are_not_the_responses_parts_are_not_taken_for_them() -> None:
    gold = {"response": response("r", "\\boxed{4}"), "answer": "4"}  # a user's row: `answer` is the gold answer
    assert response_parts(gold) == ResponseParts("r", "\\boxed{4}", True)
    assert response_parts({"response": "<think>\ncut"}) == ResponseParts("cut", "", False)
    assert response_parts({"response": None}) == ResponseParts(None, "", True)


# --------------------------------------------------------------------------- through klear sft-data


def test_sft_data_takes_the_rows_parts_and_the_prompt_rule(tmp_path: Path) -> None:
    """A teacher reasoning that names `</think>` and never ends is truncated (a search for the tag kept it), and
    a blank prompt field gives way to the record's problem (sft-data took the blank one)."""
    from klear.cli import main

    record = {**math_record("p", "4", problem="What is 2 + 2?"), "prompt": "  "}
    cut = f"{THINK_OPEN}\nI will close with {THINK_CLOSE} once sure and then"
    rows = [sample_row("p", 0, boxed("4"), record, prompt=""),
            {**sample_row("p", 1, cut, record, prompt=""), "reasoning": cut.removeprefix(f"{THINK_OPEN}\n"),
             "final": ""}]
    teacher = publish_samples(rows, str(tmp_path / "teacher"))
    out = tmp_path / "sft"
    assert main(["sft-data", "--samples", teacher, "--output", str(out), "--config", "tiny"]) == 0
    records = read_parquet_folder(str(out), "records")
    assert [r["sample"] for r in records] == [0]
    assert records[0]["messages"][0]["content"] == "What is 2 + 2?"
    report = json.loads((out / "report.json").read_text())
    assert report["totals"]["dropped"]["truncated"] == 1


# --------------------------------------------------------------------------- rows written before `final` and turns

# The sample rows of an earlier version: the final text under `answer`, the conversation as JSON text.
OLD_SCHEMA = pa.schema([("id", pa.string()), ("sample", pa.int64()), ("prompt", pa.string()),
                        ("response", pa.string()), ("reasoning", pa.string()), ("answer", pa.string()),
                        ("finish_reason", pa.string()), ("record", pa.string()), ("messages", pa.string())])
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


def _old_rows() -> list[dict[str, Any]]:
    """A kept response, and a reasoning that names `</think>` and was cut: only its `answer` column ("") says so."""
    record = math_record("p", "4", problem="What is 2 + 2?")
    cut = f"{THINK_OPEN}\nI will close with {THINK_CLOSE} once sure and then"
    rows = [sample_row("p", 0, boxed("4"), record),
            {**sample_row("p", 1, cut, record), "reasoning": cut.removeprefix(f"{THINK_OPEN}\n"), "final": ""}]
    return [{**{k: row[k] for k in OLD_SCHEMA.names if k in row}, "answer": row["final"], "messages": json.dumps(CHAT)}
            for row in rows]


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_rows_written_before_final_and_the_list_of_turns_still_read(kind: str, tmp_path: Path) -> None:
    """Through the reader and sft-data: `messages` as JSON text is read into the list of turns, and `answer` is
    the final text where it is the response's (the cut reasoning is dropped as truncated, as when written)."""
    from klear.cli import main

    if kind == "parquet":
        samples = publish_samples(_old_rows(), str(tmp_path / "teacher"), schema=OLD_SCHEMA)
    else:
        samples = str(tmp_path / "teacher.jsonl")
        Path(samples).write_text("".join(json.dumps(row) + "\n" for row in _old_rows()))
    (_, table), = iter_sample_tables(samples)
    assert table.schema.field("messages").type == MESSAGES_TYPE and table.column("messages").to_pylist() == [CHAT] * 2
    assert [response_parts(row).closed for row in table.to_pylist()] == [True, False]
    out = tmp_path / "sft"
    assert main(["sft-data", "--samples", samples, "--output", str(out), "--config", "tiny"]) == 0
    records = read_parquet_folder(str(out), "records")
    assert [(r["sample"], r["messages"]) for r in records] == [(0, [*CHAT, {"role": "assistant", "content": boxed("4")}])]
    assert json.loads((out / "report.json").read_text())["totals"]["dropped"]["truncated"] == 1


# --------------------------------------------------------------------------- two </think>: sample -> judge -> sft-data


def test_a_reply_with_two_think_ends_has_one_answer_from_sample_to_sft_data(tmp_path: Path) -> None:
    """The real commands on one reply with two </think>, as a reasoning parser splits it (at the first) and inline:
    `klear sample` writes the answer after the last one, `klear judge` judges that answer's box (the draft box
    between the two is wrong), and `klear sft-data` keeps the same response, whose answer is the row's."""
    from tests.commands import jsonl, klear
    from tests.sample.fake_server import TWO_ENDS_ANSWER, TWO_ENDS_DRAFT, FakeServer, expected_parts

    plans = ("two_ends", "two_ends_inline")
    prompts = jsonl(tmp_path / "p.jsonl", [{"id": plan, "prompt": f"Compute 1 + 1. [[plan:{plan}]]", "answer": "2"}
                                           for plan in plans])
    samples, judged, sft = (str(tmp_path / name) for name in ("samples", "judged", "sft"))
    with FakeServer() as server:
        done = klear("sample", "--prompts", prompts, "--output", samples, "--config", "tiny", "--endpoint", server.url,
                     "--served-model", server.served_model, "--set", "n=1")
        assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["id"]: r for r in read_parquet_folder(samples, "samples")}
    assert sorted(rows) == sorted(plans)
    for row in rows.values():
        reasoning, _ = expected_parts(row["prompt"], row["seed"])
        assert (row["reasoning"], row["final"]) == (f"{reasoning}\n</think>\n\n{TWO_ENDS_DRAFT}", TWO_ENDS_ANSWER)
        assert split_response(row["response"]) == ResponseParts(row["reasoning"], row["final"], True)
    for command in (("judge", "--samples", samples, "--output", judged),
                    ("sft-data", "--samples", judged, "--output", sft)):
        done = klear(*command, "--config", "tiny")
        assert done.returncode == 0, done.stderr[-2000:]
    for row in read_parquet_folder(judged, "judged"):
        assert (row["extracted"], row["verdict"], row["correct"]) == ("2", "correct", True), row["id"]
        assert row["response"] == rows[row["id"]]["response"]
    records = read_parquet_folder(sft, "records")
    assert sorted(r["id"] for r in records) == sorted(plans)
    for record in records:
        said = record["messages"][-1]
        assert said["role"] == "assistant" and said["content"] == rows[record["id"]]["response"]
        assert split_response(said["content"]).final == TWO_ENDS_ANSWER
