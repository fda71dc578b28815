"""Code verification: extraction, LiveCodeBench-style comparison, test subsets, real programs in the sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from klear.verifiers import CodeVerifier, TestCase, VerifierConfig, compare_stdout, extract_program
from klear.verifiers.code_verifier import compare_functional, select_tests

CONFIG = VerifierConfig(code_workers=2, timeout_s=2.0, memory_mb=512, output_limit_bytes=1 << 20)


@pytest.fixture(scope="module")
def verifier() -> Iterator[CodeVerifier]:
    with CodeVerifier(CONFIG) as v:
        yield v


# --- pure functions ----------------------------------------------------------------------------------
def test_extract_last_python_block_after_think() -> None:
    response = "<think>```python\nprint('draft')\n```</think>\nFirst:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```"
    assert extract_program(response) == "print(2)\n"
    assert extract_program("</think> ```cpp\nint main(){}\n```") is None
    assert extract_program("no code at all") is None
    assert extract_program("<think>```python\nprint(1)\n```") is None  # cut off while thinking
    assert extract_program("```python\nprint(1)\n```", require_think_end=False) == "print(1)\n"
    assert extract_program("```python\nprint(1)\n```", think_end="") == "print(1)\n"


@pytest.mark.parametrize(
    ("actual", "expected", "ok"),
    [
        ("1 2 3\n", "1 2 3", True),
        ("1 2 3   \n\n", "1 2 3\n", True),  # trailing spaces and blank lines
        ("  1 2 3", "1 2 3", True),
        ("1  2 3", "1 2 3", True),  # token-wise when lines differ in spacing
        ("1\r\n2\r\n", "1\n2\n", True),  # Windows line ends
        ("1.0", "1", True),  # numbers compare as numbers
        ("1e2", "100", True),
        ("0.50", "0.5", True),
        ("0.333333", "0.333334", False),  # no tolerance, like LiveCodeBench
        ("1 2", "1\n2", False),  # line structure matters
        ("YES", "yes", False),
        ("1 2 3", "1 2", False),
        ("", "0", False),
        ("nan", "nan", True),  # same text
        ("inf", "1e999", False),
        ("-0", "0", True),
    ],
)
def test_compare_stdout(actual: str, expected: str, ok: bool) -> None:
    assert compare_stdout(actual, expected) is ok


def test_compare_stdout_with_tolerance() -> None:
    assert compare_stdout("0.333333", "0.333334", rel_tol=1e-5)
    assert not compare_stdout("0.3", "0.4", rel_tol=1e-5)


def test_compare_functional() -> None:
    assert compare_functional(b"[1, [2, 3]]", "[1, [2, 3]]")
    assert compare_functional(b"2.0", "2")
    assert not compare_functional(b"[1, 2]", "[2, 1]")
    assert not compare_functional(b"not json", "1")
    assert not compare_functional(b"", "null")


def test_select_tests_deterministic_subset() -> None:
    assert select_tests(5, 10, "p") == [0, 1, 2, 3, 4]
    assert select_tests(5, None, "p") == [0, 1, 2, 3, 4]
    a = select_tests(100, 16, "problem-1")
    assert a == select_tests(100, 16, "problem-1") and len(a) == 16 and a == sorted(set(a))
    assert a != select_tests(100, 16, "problem-2")


# --- real programs -----------------------------------------------------------------------------------
SUM_TESTS = [TestCase("1 2\n", "3\n"), TestCase("10 -4\n", "6"), TestCase("0 0", "0")]
SUM_OK = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"
SUM_BAD = "a, b = map(int, input().split())\nprint(a - b)\n"

FUNC_TESTS = [
    TestCase("[2, 7, 11, 15]\n9", "[0, 1]", "functional"),
    TestCase("[3, 2, 4]\n6", "[1, 2]", "functional"),
    TestCase("[3, 3]\n6", "[0, 1]", "functional"),
]
FUNC_OK = """
class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return (seen[target - x], i)  # a tuple: compared as a list
            seen[x] = i
"""
FUNC_BAD = FUNC_OK.replace("return (seen[target - x], i)", "return [i, seen[target - x]]")


def test_stdin_correct_and_wrong(verifier: CodeVerifier) -> None:
    ok = verifier.run_tests(SUM_OK, SUM_TESTS)
    assert (ok.passed, ok.total, ok.pass_fraction, ok.all_passed) == (3, 3, 1.0, True)
    assert all(t["time_s"] > 0 for t in ok.tests)
    bad = verifier.run_tests(SUM_BAD, SUM_TESTS)
    assert [t["verdict"] for t in bad.tests] == ["wrong_answer", "wrong_answer", "passed"]
    assert bad.pass_fraction == pytest.approx(1 / 3)


def test_functional_correct_and_wrong(verifier: CodeVerifier) -> None:
    assert verifier.run_tests(FUNC_OK, FUNC_TESTS, fn_name="twoSum").all_passed
    bad = verifier.run_tests(FUNC_BAD, FUNC_TESTS, fn_name="twoSum")
    assert bad.passed == 0 and {t["verdict"] for t in bad.tests} == {"wrong_answer"}


def test_functional_program_printing_does_not_matter(verifier: CodeVerifier) -> None:
    noisy = FUNC_OK.replace("seen = {}", "print('debug', nums)\n        seen = {}")
    assert verifier.run_tests(noisy, FUNC_TESTS, fn_name="twoSum").all_passed


def test_functional_results_cannot_fake_equality(verifier: CodeVerifier) -> None:
    """Results cross the sandbox as JSON and are compared outside: a custom __eq__ cannot pass a test."""
    hack = (
        "class AlwaysEqual(list):\n"
        "    def __eq__(self, other):\n        return True\n"
        "class Anything:\n"
        "    def __eq__(self, other):\n        return True\n"
        "class Solution:\n"
        "    def twoSum(self, nums, target):\n"
        "        return AlwaysEqual() if target % 2 else Anything()\n"
    )
    result = verifier.run_tests(hack, FUNC_TESTS, fn_name="twoSum")
    assert [t["verdict"] for t in result.tests] == ["wrong_answer", "runtime_error", "runtime_error"]


def test_first_failure_mode_stops(verifier: CodeVerifier) -> None:
    program = "x = int(input())\nassert x != 2\nprint(x)\n"
    tests = [TestCase(str(i), str(i)) for i in range(1, 5)]
    first = verifier.run_tests(program, tests, mode="first-failure")
    assert [t["verdict"] for t in first.tests] == ["passed", "runtime_error", "not_run", "not_run"]
    assert "AssertionError" in first.tests[1]["stderr"]
    every = verifier.run_tests(program, tests, mode="all")
    assert [t["verdict"] for t in every.tests] == ["passed", "runtime_error", "passed", "passed"]


def test_verdicts(verifier: CodeVerifier) -> None:
    programs = {
        "timeout": "while True: pass",
        "memory_limit": "x = bytearray(2 << 30)",
        "output_limit": "import sys\nwhile True: sys.stdout.write('y' * 65536)",
        "runtime_error": "raise ValueError('boom')",
        "wrong_answer": "print('nope')",
        "passed": "print(input())",
    }
    for verdict, program in programs.items():
        result = verifier.run_tests(program, [TestCase("hi", "hi")])
        assert result.tests[0]["verdict"] == verdict, (verdict, result)
    assert verifier.run_tests("import sys\nsys.exit(0)\n", [TestCase("", "")]).all_passed
    assert verifier.run_tests("import sys\nsys.exit(3)\n", [TestCase("", "")]).tests[0]["verdict"] == "runtime_error"


def test_test_cap_picks_subset_from_problem_id() -> None:
    config = CONFIG.model_copy(update={"max_tests": 3})
    tests = [TestCase(str(i), str(i)) for i in range(10)]
    with CodeVerifier(config) as v:
        a = v.run_tests("print(input())", tests, problem_id="abc")
        b = v.run_tests("print(input())", tests, problem_id="abc")
    assert a.total == 3 and [t["index"] for t in a.tests] == [t["index"] for t in b.tests] == select_tests(10, 3, "abc")


def test_verify_response_and_batch(verifier: CodeVerifier) -> None:
    good = f"<think>hmm</think>\n```python\n{SUM_OK}```"
    results = verifier.verify_batch([
        {"response": good, "tests": [t.__dict__ for t in SUM_TESTS]},
        {"response": "<think>hmm</think> no code", "tests": SUM_TESTS},
        {"response": f"</think>```python\n{FUNC_OK}```", "tests": FUNC_TESTS, "fn_name": "twoSum"},
    ])
    assert [r.pass_fraction for r in results] == [1.0, 0.0, 1.0]
    assert not results[1].program_found and results[1].tests[0]["verdict"] == "not_run"


def test_legitimate_stdin_and_deep_recursion(verifier: CodeVerifier) -> None:
    deep = (
        "import sys, threading\n"
        "sys.setrecursionlimit(1 << 20)\n"
        "threading.stack_size(1 << 27)\n"
        "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
        "def main():\n    n = int(sys.stdin.readline())\n    print(depth(n))\n"
        "threading.Thread(target=main).start()\n"
    )
    assert verifier.run_tests(deep, [TestCase("200000\n", "200000")]).all_passed
    lines = "import sys\ndata = sys.stdin.read().split()\nprint(len(data), sum(map(int, data)))\n"
    big = " ".join(str(i) for i in range(200000))
    assert verifier.run_tests(lines, [TestCase(big, f"200000 {sum(range(200000))}")]).all_passed


def test_cli_verify_code(tmp_path) -> None:
    program = tmp_path / "p.py"
    program.write_text(FUNC_OK)
    tests = tmp_path / "t.json"
    tests.write_text(json.dumps({"fn_name": "twoSum", "tests": [t.__dict__ for t in FUNC_TESTS]}))
    cmd = [sys.executable, "-m", "klear.cli", "verify-code", "--program", str(program), "--tests", str(tests),
           "--config", "tiny", "--mode", "first-failure", "--timeout", "3"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout)
    assert (out["passed"], out["total"], out["pass_fraction"]) == (3, 3, 1.0)
    assert [t["verdict"] for t in out["tests"]] == ["passed"] * 3 and all("time_s" in t for t in out["tests"])
    # a plain list with stdin tests and a wrong program
    program.write_text(SUM_BAD)
    tests.write_text(json.dumps([{"input": "1 2", "output": "3", "testtype": "stdin"}]))
    out = json.loads(subprocess.run(cmd[:-4], capture_output=True, text=True, timeout=120, check=True).stdout)
    assert out["passed"] == 0 and out["tests"][0]["verdict"] == "wrong_answer"


def test_test_case_validation() -> None:
    assert TestCase.from_dict({"input": "1", "output": "2"}).testtype == "stdin"
    with pytest.raises(ValueError, match="testtype"):
        TestCase.from_dict({"input": "1", "output": "2", "testtype": "interactive"})


def test_extract_takes_an_unmarked_block_only_without_a_python_one() -> None:
    assert extract_program("</think>\n```\nprint(3)\n```") == "print(3)\n"
    assert extract_program("</think>\n```cpp\nint main(){}\n```\n\n```\nprint(4)\n```") == "print(4)\n"
    assert extract_program("</think>\n```python\nprint(1)\n```\n```\nprint(5)\n```") == "print(1)\n"
    assert extract_program("</think>\n```Python3 \r\nprint(6)\r\n```") == "print(6)\r\n"
    assert extract_program("</think> ```py print(1)```") is None  # one line: not a block
