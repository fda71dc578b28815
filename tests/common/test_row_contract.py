"""What a sample row says, by the contract's one rule for each: the prompt of a source row, the response's
normal form (render and split), and a row's response parts (its columns where they are its response's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klear.common.chat import THINK_CLOSE, THINK_OPEN, ResponseParts, render_response, split_response
from klear.common.sample_rows import PROMPT_FIELDS, prompt_text, response_parts
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
    ResponseParts("r", "an answer naming </think> again", True),
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


# --------------------------------------------------------------------------- a row's response parts


def test_a_rows_columns_are_its_parts_when_they_are_its_responses() -> None:
    row = {"response": response("r", "a"), "reasoning": "r", "answer": "a"}
    assert response_parts(row) == ResponseParts("r", "a", True)
    # The columns tell what a string search cannot: a reasoning that names the closing tag and never ended.
    cut = {"response": f"{THINK_OPEN}\nI will write {THINK_CLOSE} once done", "reasoning": f"I will write "
           f"{THINK_CLOSE} once done", "answer": ""}
    assert response_parts(cut) == ResponseParts(f"I will write {THINK_CLOSE} once done", "", False)
    closed_empty = {"response": render_response(ResponseParts("r", "", True)), "reasoning": "r", "answer": ""}
    assert response_parts(closed_empty).closed
    plain = {"response": "plain", "reasoning": None, "answer": "plain"}
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
             "answer": ""}]
    teacher = publish_samples(rows, str(tmp_path / "teacher"))
    out = tmp_path / "sft"
    assert main(["sft-data", "--samples", teacher, "--output", str(out), "--config", "tiny"]) == 0
    records = read_parquet_folder(str(out), "records")
    assert [r["sample"] for r in records] == [0]
    assert records[0]["messages"][0]["content"] == "What is 2 + 2?"
    report = json.loads((out / "report.json").read_text())
    assert report["totals"]["dropped"]["truncated"] == 1
