"""A program under test cannot write its own verdict, under every code rule (strict, official, runner): what it writes
on any fd it holds (the result channel included), at import or inside the tested method, and what it can read from
its own process, never turns a wrong program into a passing one. Real programs, real sandbox pools, and the real
`klear verify-code` command."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from klear.verifiers._zygote import decode_value, encode_value
from klear.verifiers.code_verifier import CodeVerifier, TestCase, lcb_call_verdict, shared_call_verdicts
from klear.verifiers.config import VerifierConfig
from klear.verifiers.sandbox import RunResult, kernel_support
from tests.commands import klear
from tests.verifiers.numbers import decimal

support = kernel_support()
needs_sandbox = pytest.mark.skipif(support["landlock_abi"] < 6 or not support["seccomp"],
                                   reason="the sandbox needs Landlock ABI >= 6 and seccomp")
RULES = ("strict", "official", "runner", "release")

# Expected values are numbers other than 1 (True), so a forged b"true" read as a value is still wrong.
CALL_TESTS = [TestCase("1\n2", "3", "functional"), TestCase("10\n-4", "6", "functional"),
              TestCase("20\n22", "42", "functional")]
STDIN_TESTS = [TestCase("1 2\n", "3"), TestCase("10 -4\n", "6"), TestCase("20 22\n", "42")]

# What a forger writes: the official single-call verdict word, and runner's shared-module lines.
WORD = b"true"
LINES = b"ready\n" + b"true 0.0\n" * 50
FORGE = ("import os\n"
         "def _forge(payload):\n"
         "    for fd in range(21):\n"
         "        try:\n"
         "            os.write(fd, payload)\n"
         "        except OSError:\n"
         "            pass\n")

HONEST_CALL = "class Solution:\n    def add(self, a, b):\n        return a + b\n"
HONEST_STDIN = "a, b = map(int, input().split())\nprint(a + b)\n"

CALL_FORGERS = {
    # inside the tested method: every fd, then an exit that skips the harness's own report
    "method_word_exit": FORGE + f"class Solution:\n    def add(self, a, b):\n        _forge({WORD!r})\n        os._exit(0)\n",
    "method_lines_exit": FORGE + f"class Solution:\n    def add(self, a, b):\n        _forge({LINES!r})\n        os._exit(0)\n",
    # inside the method, then a wrong value returned: the harness's report follows the forgery
    "method_word_return": FORGE + f"class Solution:\n    def add(self, a, b):\n        _forge({WORD!r})\n        return a - b\n",
    # at import, before the harness writes anything; then wrong answers
    "import_lines": FORGE + f"_forge({LINES!r})\nclass Solution:\n    def add(self, a, b):\n        return a - b\n",
    "import_word": FORGE + f"_forge({WORD!r})\nclass Solution:\n    def add(self, a, b):\n        return a - b\n",
    # reading the expected output from the harness's own frames (the job, the runner's loop variable)
    "peek_expected": (
        "import sys, json\n"
        "def _peek():\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        local = f.f_locals\n"
        "        if 'expected' in local:\n"
        "            return local['expected']\n"
        "        job = local.get('job')\n"
        "        if isinstance(job, dict) and job.get('expected'):\n"
        "            return json.loads(job['expected'])\n"
        "        f = f.f_back\n"
        "class Solution:\n    def add(self, a, b):\n        return _peek()\n"),
}

STDIN_FORGERS = {
    "import_word_exit": FORGE + f"_forge({WORD!r})\nos._exit(0)\n",
    "import_lines_exit": FORGE + f"_forge({LINES!r})\nos._exit(0)\n",
    "lines_then_wrong": FORGE + f"_forge({LINES!r})\nprint(0)\n",
}


def _config(rules: str) -> VerifierConfig:
    return VerifierConfig(code_rules=rules, code_workers=2, timeout_s=3.0, memory_mb=512, output_limit_bytes=1 << 20)


@pytest.fixture(scope="module", params=RULES)
def verifier(request: pytest.FixtureRequest) -> Iterator[CodeVerifier]:
    with CodeVerifier(_config(request.param)) as v:
        yield v


@needs_sandbox
@pytest.mark.parametrize("mode", ["all", "first-failure"])
@pytest.mark.parametrize("name", sorted(CALL_FORGERS))
def test_call_based_forgeries_never_pass(verifier: CodeVerifier, name: str, mode: str) -> None:
    result = verifier.run_tests(CALL_FORGERS[name], CALL_TESTS, "add", mode=mode)  # type: ignore[arg-type]
    assert result.passed == 0 and not result.all_passed, (verifier.config.code_rules, name, result.tests)
    assert result.tests[0]["verdict"] != "passed"


@needs_sandbox
@pytest.mark.parametrize("name", sorted(STDIN_FORGERS))
def test_stdin_forgeries_never_pass(verifier: CodeVerifier, name: str) -> None:
    result = verifier.run_tests(STDIN_FORGERS[name], STDIN_TESTS, mode="all")
    assert result.passed == 0, (verifier.config.code_rules, name, result.tests)


@needs_sandbox
def test_honest_programs_still_pass(verifier: CodeVerifier) -> None:
    for mode in ("all", "first-failure"):
        assert verifier.run_tests(HONEST_CALL, CALL_TESTS, "add", mode=mode).all_passed
        assert verifier.run_tests(HONEST_STDIN, STDIN_TESTS, mode=mode).all_passed


@needs_sandbox
@pytest.mark.parametrize("rules", RULES)
def test_cli_verify_code_refuses_a_forged_verdict(tmp_path: Path, rules: str) -> None:
    """`klear verify-code`: the in-method forgery (every fd, then os._exit) fails every test; the honest program
    passes them all."""
    tests = tmp_path / "t.json"
    tests.write_text(json.dumps({"fn_name": "add", "tests": [t.__dict__ for t in CALL_TESTS]}))
    program = tmp_path / "p.py"
    for source, passed in ((CALL_FORGERS["method_word_exit"], 0), (CALL_FORGERS["import_lines"], 0),
                           (HONEST_CALL, 3)):
        program.write_text(source)
        proc = klear("verify-code", "--program", str(program), "--tests", str(tests), "--config", "tiny",
                     "--set", f"code_rules={rules}", "--timeout", "3")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert (out["passed"], out["total"]) == (passed, 3), (rules, source, out)


@needs_sandbox
def test_runner_first_failure_stops_the_shared_process() -> None:
    """Runner rules, first-failure: the harness judges each test as its line arrives and ends the process at the
    first wrong answer, as lcb_runner stops there; the slow tests after it are not waited for."""
    program = "class Solution:\n    def add(self, a, b):\n        if a == 20:\n            while True:\n                pass\n" \
              "        return a - b if a == 10 else a + b\n"
    tests = CALL_TESTS + [TestCase("20\n1", "21", "functional")] * 3
    with CodeVerifier(_config("runner").model_copy(update={"timeout_s": 2.0})) as v:
        v.run_tests(HONEST_CALL, CALL_TESTS[:1], "add")  # the zygotes are warm
        start = time.monotonic()
        result = v.run_tests(program, tests, "add", mode="first-failure")
        took = time.monotonic() - start
    assert [t["verdict"] for t in result.tests] == ["passed", "wrong_answer"] + ["not_run"] * 4
    assert took < 1.5, took  # not the 2 s of the looping test after the wrong answer


# --- the result channel's content (pure) ----------------------------------------------------------------
VALUES: list[object] = [None, True, 0, -3, 2**60, -(2**61), 1.5, -0.0, float("inf"), "x\ny", [1, (2, 3)], (1, [2]),
          {"a": 1, 2: (3,)}, {1, 2}, frozenset({(1, 2)}), [[], {}]]


@pytest.mark.parametrize("value", VALUES, ids=[f"{type(v).__name__}{i}" for i, v in enumerate(VALUES)])
def test_values_cross_the_channel_unchanged(value: object) -> None:
    line = encode_value(value)
    assert b"\n" not in line and line.isascii()
    got = decode_value(line)
    assert got == value and type(got) is type(value) and repr(got) == repr(value)  # repr: tuples stay tuples
    huge = -(7**9000)  # past int->str's 4,300 digits
    assert decode_value(encode_value([huge])) == [huge]


def test_nan_and_custom_equality() -> None:
    assert str(decode_value(encode_value(float("nan")))) == "nan"

    class Anything:
        def __eq__(self, other: object) -> bool:
            return True

    class AlwaysEqual(list):
        def __eq__(self, other: object) -> bool:
            return True

    # an object's own __eq__ never judges it: it is no value the harness can compare
    for value in (Anything(), AlwaysEqual([3]), [Anything()]):
        assert lcb_call_verdict(encode_value(value), "3") == "wrong_answer"
        assert lcb_call_verdict(encode_value(value), "[3]") == "wrong_answer"


def test_lcb_call_verdict() -> None:
    assert lcb_call_verdict(encode_value([1, 2]), "[1, 2]") == "passed"
    assert lcb_call_verdict(encode_value(6), "6.0") == "passed"  # Python's ==, as in-process
    assert lcb_call_verdict(encode_value([(1, 1)]), "[[1, 1]]") == "wrong_answer"  # a nested tuple is no list
    assert lcb_call_verdict(encode_value(7**9000), decimal(7**9000)) == "passed"  # past int->str's digit limit
    # what the program wrote itself, alone or around the harness's report, is never a pass
    for forged in (b"true", b"true" + encode_value(3), encode_value(3) + b"true", b'{"eq": true}', b"", b"\xff"):
        assert lcb_call_verdict(forged, "3") != "passed", forged
    assert lcb_call_verdict(b"true", "true") == "passed"  # the value True, as if returned: no verdict word


def test_numpy_and_dict_kinds_compare_as_in_process() -> None:
    np = pytest.importorskip("numpy")
    assert lcb_call_verdict(encode_value(np.int64(6)), "6") == "passed"  # np.int64(6) == 6
    assert lcb_call_verdict(encode_value([np.float64(1.5), np.bool_(True)]), "[1.5, true]") == "passed"
    with pytest.raises(ValueError, match="ambiguous"):  # bool(array == expected) raises in lcb_runner too
        encode_value([np.array([1, 2])])
    assert lcb_call_verdict(encode_value(Counter("aab")), '{"a": 2, "b": 1}') == "passed"


def test_shared_call_verdicts_judge_each_line_in_the_harness() -> None:
    def run(result: bytes, status: str = "ok") -> RunResult:
        return RunResult(status, result=result, wall_s=2.0)

    ok3, ok6 = b"ok 0.5 " + encode_value(3) + b"\n", b"ok 0.25 " + encode_value(6) + b"\n"
    assert shared_call_verdicts(run(b"ready\n" + ok3 + ok6), ["3", "6"]) == [("passed", 0.5), ("passed", 0.25)]
    assert shared_call_verdicts(run(b"ready\n" + ok3 + ok3), ["3", "6"]) == [("passed", 0.5), ("wrong_answer", 0.5)]
    assert shared_call_verdicts(run(b"ready\nerror 0.1\n" + ok6), ["3", "6"], False) == [("runtime_error", 0.1),
                                                                                          ("passed", 0.25)]
    # forged lines: old verdict words, a second "ready", extra lines after the last test
    assert shared_call_verdicts(run(LINES), ["3", "6"])[0][0] == "runtime_error"
    assert shared_call_verdicts(run(LINES + b"ready\n" + ok3 + ok6), ["3", "6"])[0][0] == "runtime_error"
    assert [v for v, _ in shared_call_verdicts(run(b"ready\n" + ok3 + ok6 + ok6), ["3", "6"])] == ["passed",
                                                                                                   "runtime_error"]
    assert shared_call_verdicts(run(b"ready\n" + ok3 + b"ok 0.1 ", "runtime_error"), ["3", "6"]) == [
        ("passed", 0.5), ("runtime_error", 1.5)]
