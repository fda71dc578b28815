"""`klear verify-math` / `klear verify-code` on bad input: exit code 2 and a message naming the file, the line
or test, and what was expected -- never a traceback, never a silent default. Nothing here runs a program."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


def klear(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klear.cli", *args], capture_output=True, text=True, timeout=120)


def refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


@pytest.fixture()
def program(tmp_path: Path) -> Path:
    path = tmp_path / "p.py"
    path.write_text("print(sum(map(int, input().split())))\n")
    return path


def test_verify_math_names_the_undecodable_line(tmp_path: Path) -> None:
    cases = tmp_path / "cases.jsonl"
    good = json.dumps({"response": "</think> \\boxed{1}", "gold": "1"}).encode()
    cases.write_bytes(good + b"\n" + good + b"\n" + b'{"response": "caf\xe9", "gold": "1"}\n')
    refused(klear("verify-math", "--input", str(cases)), f"{cases}:3", "UTF-8")


def test_verify_math_counts_lines_as_the_file_does(tmp_path: Path) -> None:
    # U+2028 inside a JSON string is one line of the file, not two (str.splitlines would split it).
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"response": "a\u2028b", "gold": "1"}, ensure_ascii=False) + "\n" + '{"gold": "1"}\n')
    refused(klear("verify-math", "--input", str(cases)), f"{cases}:2:")


def test_verify_code_names_an_undecodable_tests_file(tmp_path: Path, program: Path) -> None:
    tests = tmp_path / "t.json"
    tests.write_bytes(b'[\n {"input": "1 2", "output": "3"},\n {"input": "\xff", "output": "3"}\n]\n')
    refused(klear("verify-code", "--program", str(program), "--tests", str(tests)), f"{tests}:3", "UTF-8")


def test_verify_code_names_an_undecodable_program(tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_bytes(b"# \xff\nprint(1)\n")
    tests = tmp_path / "t.json"
    tests.write_text(json.dumps([{"input": "", "output": "1"}]))
    refused(klear("verify-code", "--program", str(program), "--tests", str(tests)), f"{program}:1", "UTF-8")


def test_verify_code_names_malformed_json(tmp_path: Path, program: Path) -> None:
    tests = tmp_path / "t.json"
    tests.write_text('[{"input": "1 2", "output": "3"},\n {"input": ]')
    refused(klear("verify-code", "--program", str(program), "--tests", str(tests)), f"{tests}:2", "JSON")


@pytest.mark.parametrize(
    ("tests", "where", "what"),
    [
        ([{"inp": "1 2", "out": "3"}], "test 0", "'input', 'output'"),
        ({"tests": [{"input": "1 2", "output": "3"}, {"input": "1 2"}]}, "test 1", "'output'"),
        ([["1 2", "3"]], "test 0", "an object"),
    ],
)
def test_verify_code_names_the_malformed_test(tmp_path: Path, program: Path, tests: object, where: str,
                                              what: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(tests))
    refused(klear("verify-code", "--program", str(program), "--tests", str(path)), f"{path}: {where}", what,
            "expected keys input, output")


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "soon"])
def test_verify_code_refuses_a_timeout_that_is_not_positive(tmp_path: Path, program: Path, timeout: str) -> None:
    tests = tmp_path / "t.json"
    tests.write_text(json.dumps([{"input": "1 2", "output": "3"}]))
    refused(klear("verify-code", "--program", str(program), "--tests", str(tests), f"--timeout={timeout}"),
            "argument --timeout", "positive")
