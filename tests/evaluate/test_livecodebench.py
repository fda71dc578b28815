"""LiveCodeBench rows: both private-test encodings, a hostile pickle, dates, functional metadata, the prompt."""

from __future__ import annotations

import base64
import datetime as dt
import json
import pickle
import zlib
from pathlib import Path

import pytest

from klear.evaluate.livecodebench import LcbError, contest_day, decode_private_tests, is_livecodebench, lcb_prompt, parse_problem
from tests.evaluate.helpers import lcb_row, packed

TESTS = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}, {"input": "5\n", "output": "10\n", "testtype": "stdin"}]


class _OpensAFile:
    """Unpickling this calls open(path, "w"): a payload that runs code (here: creates a file) on load."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


def test_private_tests_in_both_encodings() -> None:
    assert decode_private_tests(json.dumps(TESTS)) == TESTS
    assert decode_private_tests(packed(TESTS)) == TESTS
    assert decode_private_tests("") == []
    with pytest.raises(ValueError, match="neither JSON nor base64"):
        decode_private_tests("not base64 !!")
    with pytest.raises(ValueError, match="zlib"):
        decode_private_tests(base64.b64encode(b"plain bytes").decode())


def test_a_pickle_that_runs_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = base64.b64encode(zlib.compress(pickle.dumps(_OpensAFile(marker)))).decode()
    pickle.loads(zlib.decompress(base64.b64decode(payload))).close()  # the payload is live: plain pickle runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ValueError, match="refusing to load global"):
        decode_private_tests(payload)
    assert not marker.exists()
    row = lcb_row("evil", "2024-09-01", TESTS)
    row["private_test_cases"] = payload
    with pytest.raises(LcbError, match="evil.*refusing"):
        parse_problem(row, "lcb.jsonl:1")
    assert not marker.exists()


def test_a_pickle_of_anything_but_the_tests_text_is_refused() -> None:
    wrapped = base64.b64encode(zlib.compress(pickle.dumps({"input": "1"}))).decode()
    with pytest.raises(ValueError, match="holds a dict"):
        decode_private_tests(wrapped)


def test_contest_day_is_day_level() -> None:
    assert contest_day("2025-02-01T23:59:59") == dt.date(2025, 2, 1)
    assert contest_day("2025-02-01") == dt.date(2025, 2, 1)
    assert contest_day(dt.datetime(2025, 2, 1, 12)) == dt.date(2025, 2, 1)
    with pytest.raises(ValueError):
        contest_day("Feb 2025")


def test_stdin_and_functional_problems() -> None:
    stdin = parse_problem(lcb_row("s1", "2024-09-01", TESTS, "packed"), "f:1")
    assert (stdin.fn_name, stdin.day, stdin.tests) == (None, dt.date(2024, 9, 1), TESTS)  # public + private, in order
    functional_tests = [{"input": "1\n2", "output": "3", "testtype": "functional"},
                        {"input": "4\n5", "output": "9", "testtype": "functional"}]
    starter = "class Solution:\n    def add(self, a: int, b: int) -> int:\n        "
    functional = parse_problem(lcb_row("f1", "2025-03-01", functional_tests, "json", func_name="add",
                                       starter_code=starter), "f:2")
    assert functional.fn_name == "add" and len(functional.tests) == 2
    assert starter in functional.prompt and "### Format: You will use the following starter code" in functional.prompt
    assert "Read the inputs from stdin" in stdin.prompt and "# YOUR CODE HERE" in stdin.prompt
    assert stdin.prompt.startswith("### Question:\nSolve problem s1.\n\n")
    assert stdin.prompt.endswith("### Answer: (use the provided format with backticks)\n\n")
    with pytest.raises(LcbError, match="func_name"):
        parse_problem(lcb_row("f2", "2025-03-01", functional_tests, "json"), "f:3")
    assert is_livecodebench(lcb_row("x", "2025-01-01", TESTS)) and not is_livecodebench({"id": "a", "answer": "1"})


def test_lcb_prompt_matches_livecodebench_text() -> None:
    before = ("### Question:\nQ\n\n### Format: Read the inputs from stdin solve the problem and write the answer to stdout "
              "(do not directly test on the sample inputs). Enclose your code within delimiters as follows.")
    after = "\n```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with backticks)\n\n"
    assert lcb_prompt("Q", "", "lcb-2024") == before + after
    assert lcb_prompt("Q", "") == before + (" Ensure that when the python program runs, it reads the inputs, runs the "
                                            "algorithm and writes output to STDOUT.") + after


def test_code_prompts_carry_lcb_runners_system_turn(tmp_path: Path) -> None:
    from klear.common.config import load_config
    from klear.evaluate.benchmarks import load_benchmarks
    from klear.evaluate.config import EvaluateConfig
    from klear.evaluate.livecodebench import LCB_SYSTEM_MESSAGE
    from klear.evaluate.stage import prompt_groups

    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(lcb_row("q1", "2024-09-01", TESTS)) + "\n")
    for system, form in ((LCB_SYSTEM_MESSAGE, "lcb"), ("", "lcb-2024")):
        config = load_config(EvaluateConfig, "paper", [f"code_system_prompt={json.dumps(system)}", f"code_prompt={form}",
                                                       "only=[livecodebench_v5]"])
        (row,) = next(iter(prompt_groups(load_benchmarks([str(path)], config), config).values()))
        chat = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
        assert [t["role"] for t in chat] == (["system", "user"] if system else ["user"])
        assert chat[0]["content"] == system or not system
        assert ("Ensure that when the python program runs" in chat[-1]["content"]) == (form == "lcb")
