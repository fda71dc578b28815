"""LiveCodeBench parity: programs on which this harness and lcb_runner are known to disagree, judged under
every code rule (verifier.code_rules strict, official and runner), with the verdict lcb_runner's run_test gives and why.

Each case: (name, program, tests, fn_name, strict verdict, official verdict, lcb_runner verdict, reason). A verdict
is "passed" or the first failing test's: wrong_answer, runtime_error, timeout, memory_limit. Where lcb_runner's
verdict differs from the official one, the reason says which runner artifact the official rules leave out (README,
LiveCodeBench parity). The programs run in two real sandbox pools, concurrently.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from klear.judge.problems import Problem
from klear.judge.scoring import prepare
from klear.verifiers._zygote import encode_value
from klear.verifiers.code_verifier import CodeVerifier, TestCase, compare_stdout_lcb, extract_program_lcb, shared_call_verdicts
from klear.verifiers.config import VerifierConfig
from klear.verifiers.sandbox import RunResult, SandboxPool, kernel_support
from tests.verifiers.numbers import decimal

support = kernel_support()
pytestmark = pytest.mark.skipif(support["landlock_abi"] < 6 or not support["seccomp"],
                                reason="the sandbox needs Landlock ABI >= 6 and seccomp")

P, WA, RE, TLE, MLE = "passed", "wrong_answer", "runtime_error", "timeout", "memory_limit"


def S(inp: str, out: str) -> dict:
    return {"input": inp, "output": out, "testtype": "stdin"}


def F(args: str, out: str) -> dict:
    return {"input": args, "output": out, "testtype": "functional"}


RUNNER_STDIN = "lcb_runner's MockStdinWithBuffer"
CASES = [
    # --- reading stdin ---
    ("stdin_iterate", "import sys\nt = 0\nfor line in sys.stdin:\n    t += int(line)\nprint(t)", [S("1\n2\n3\n", "6")],
     None, P, P, RE, f"{RUNNER_STDIN} defines no __iter__: `for line in sys.stdin` is a TypeError there (runner bug)"),
    ("stdin_read_split", "import sys\nprint(sum(map(int, sys.stdin.read().split())))", [S("1 2\n3\n", "6")],
     None, P, P, P, "read() returns the whole input in both"),
    ("stdin_readline_alias", "import sys\ninput = sys.stdin.readline\nn = int(input())\nprint(n * 2)", [S("21\n", "42")],
     None, P, P, P, "the mock's readline reads lines as a file does"),
    ("stdin_readlines_count", "import sys\nprint(len(sys.stdin.readlines()))", [S("a\nb\n", "2")],
     None, P, P, WA, f"{RUNNER_STDIN}.readlines() is input.split('\\n'): a final newline adds an empty line"),
    ("stdin_buffer_read", "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))", [S("4 5\n", "9")],
     None, P, P, P, "the mock's buffer.read() returns the whole input as bytes"),
    ("stdin_buffer_readline", "import sys\ninput = sys.stdin.buffer.readline\nn = int(input())\n"
     "print(sum(int(input()) for _ in range(n)))", [S("3\n1\n2\n3\n", "6")],
     None, P, P, WA, "the mock's buffer.readline() always returns the first line (runner bug)"),
    ("stdin_buffer_iterate", "import sys\nprint(sum(int(x) for x in sys.stdin.buffer))", [S("1\n2\n", "3")],
     None, P, P, RE, "the mock's buffer is not iterable (runner bug)"),
    ("stdin_open_0", "print(open(0).read().split()[1])", [S("x y\n", "y")],
     None, P, P, RE, "the helper imports bind `open` (from builtins import *) before the runner patches builtins.open: "
                     "open(0) reads the runner's own stdin, empty in a batch run (IndexError; its run_test, stdin /dev/null)"),
    ("stdin_input_until_eof", "out = []\nwhile True:\n    try:\n        out.append(input())\n    except EOFError:\n"
     "        break\nprint(len(out))", [S("a\nb\nc\n", "3")], None, P, P, P, "input() raises EOFError at the end in both"),
    ("stdin_os_read", "import os\nprint(os.read(0, 100).decode().split()[0])", [S("7 8\n", "7")],
     None, P, P, RE, "os.read(0) reads the runner's own stdin, not the test input: empty in a batch run (IndexError; "
                     "its run_test, stdin /dev/null)"),
    # --- program structure ---
    ("global_counter_stdin", "count = 0\ndef bump():\n    global count\n    count += 1\nfor _ in range(int(input())):\n"
     "    bump()\nprint(count)", [S("3\n", "3")],
     None, P, P, RE, "make_function wraps the program in a function: `count` is its local, `global count` a NameError"),
    ("global_set_in_function", "def solve():\n    global ans\n    ans = int(input()) * 2\nsolve()\nprint(ans)",
     [S("4\n", "8")], None, P, P, P, "a name only assigned under `global` stays a module global in the wrapper too"),
    ("main_guard_last", "def main():\n    print(int(input()) + 1)\nif __name__ == '__main__':\n    main()",
     [S("1\n", "2")], None, P, P, P, "clean_if_name unwraps a final main guard"),
    ("main_guard_reversed", "def main():\n    print(int(input()) + 1)\nif '__main__' == __name__:\n    main()",
     [S("1\n", "2")], None, P, P, WA, "clean_if_name misses the reversed test; the module is tmp_sol, main never runs"),
    ("main_guard_not_last", "def main():\n    print(int(input()) + 1)\nif __name__ == '__main__':\n    main()\nDONE = 1",
     [S("1\n", "2")], None, P, P, WA, "a main guard that is not the last statement never runs under the runner"),
    ("exit_early", "n = int(input())\nif n == 0:\n    print('zero')\n    exit()\nprint(n)", [S("0\n", "zero")],
     None, P, P, P, "exit() raises SystemExit (from sys, through the helper imports), caught by both"),
    ("sys_exit_nonzero", "import sys\nprint(5)\nsys.exit(1)", [S("", "5")],
     None, RE, P, P, "the runner swallows SystemExit whatever its code; strict counts a non-zero exit as an error"),
    ("quit_call", "print(5)\nquit()", [S("", "5")],
     None, RE, RE, RE, "quit is no builtin without site (ours) and set to None by reliability_guard (runner)"),
    ("stdout_buffer_write", "import sys\nsys.stdout.buffer.write(b'7\\n')", [S("", "7")],
     None, P, P, RE, "the runner captures stdout in a StringIO, which has no buffer (runner artifact)"),
    ("stdout_os_write", "import os\nos.write(1, b'7\\n')", [S("", "7")],
     None, P, P, WA, "os.write(1) bypasses the runner's captured sys.stdout (runner artifact)"),
    ("stderr_ignored", "import sys\nprint('debug', file=sys.stderr)\nprint(1)", [S("", "1")],
     None, P, P, P, "only stdout is compared"),
    ("thread_big_stack", "import sys, threading\nsys.setrecursionlimit(10**6)\nthreading.stack_size(1 << 26)\n"
     "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\ndef main():\n    print(f(int(input())))\n"
     "t = threading.Thread(target=main)\nt.start()\nt.join()", [S("20000\n", "20000")],
     None, P, P, P, "the competitive-programming thread idiom; threads print to the same stdout"),
    # --- output comparison ---
    ("float_10_0_vs_10", "print(10.0)", [S("", "10")], None, P, P, P, "Decimal('10.0') == Decimal('10')"),
    ("float_not_rounded", "print(0.1 + 0.2)", [S("", "0.3")], None, WA, WA, WA, "no tolerance: Decimals differ"),
    ("word_and_float", "print('Yes', 10.0)", [S("", "Yes 10")],
     None, P, WA, WA, "a line with a word is compared as text by the runner; strict compares token by token"),
    ("inner_spaces_words", "print('a  b')", [S("", "a b")],
     None, P, WA, WA, "text lines must match exactly after stripping; strict splits tokens"),
    ("inner_spaces_numbers", "print('1  2')", [S("", "1 2")], None, P, P, P, "numeric lines compare as Decimal lists"),
    ("trailing_spaces", "print('1 2 ')", [S("", "1 2")], None, P, P, P, "each line is stripped"),
    ("trailing_blank_lines", "print('5\\n\\n\\n')", [S("", "5")], None, P, P, P, "the whole output is stripped first"),
    ("leading_blank_line", "print('\\n5')", [S("", "5")], None, P, P, P, "the whole output is stripped first"),
    ("blank_line_inside", "print('1\\n\\n2')", [S("", "1\n2")], None, WA, WA, WA, "an inner blank line is a line"),
    ("crlf_lines", "import sys\nsys.stdout.write('1\\r\\n2\\r\\n')", [S("", "1\n2")], None, P, P, P,
     "\\r is stripped with the line"),
    ("missing_line", "print(1)", [S("", "1\n2")], None, WA, WA, WA, "line counts differ"),
    ("scientific", "print('1e2')", [S("", "100")], None, P, P, P, "Decimal('1e2') == Decimal('100')"),
    ("infinity_spelling", "print('inf')", [S("", "Infinity")],
     None, WA, P, P, "Decimal reads both as infinity; strict compares only finite numbers as numbers"),
    ("no_final_newline", "import sys\nsys.stdout.write('5')", [S("", "5")], None, P, P, P, "the output is stripped"),
    ("unicode_text", "print('héllo')", [S("", "héllo")], None, P, P, P, "UTF-8 in both"),
    ("big_int_output", "print(7 ** 9000)", [S("", decimal(7 ** 9000))],
     None, RE, P, P, "the runner raises int->str to 50,000 digits; strict keeps Python's 4,300"),
    # --- packages ---
    ("import_numpy", "import numpy as np\nprint(np.array(list(map(int, input().split()))).sum())", [S("1 2 3\n", "6")],
     None, RE, P, P, "numpy is in LiveCodeBench's environment; strict offers the standard library only"),
    ("numpy_float_output", "import numpy as np\nprint(np.float64(2.5) * 4)", [S("", "10")],
     None, RE, P, P, "numpy prints 10.0, equal to 10 as Decimals"),
    ("import_sortedcontainers", "from sortedcontainers import SortedList\nprint(SortedList([2, 1])[0])", [S("", "1")],
     None, RE, RE, RE, "sortedcontainers is not in LiveCodeBench's environment"),
    # --- recursion, time, memory ---
    ("recursion_10k", "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\nprint(f(10000))", [S("", "10000")],
     None, P, P, P, "within the helper imports' recursion limit of 50,000"),
    ("recursion_past_limit", "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\nprint(f(100000))", [S("", "100000")],
     None, RE, RE, RE, "RecursionError at 50,000 in both"),
    ("recursion_raised_limit", "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n"
     "print(f(200000))", [S("", "200000")], None, P, P, P, "Python 3.11+ frames are not on the C stack"),
    ("slow_within_limit", "s = 0\nfor i in range(2 * 10**6):\n    s += i\nprint(s)", [S("", str(sum(range(2 * 10**6))))],
     None, P, P, P, "well under the time limit"),
    ("busy_loop", "while True:\n    pass", [S("", "1")], None, TLE, TLE, TLE, "killed at the per-test time limit"),
    ("sleeper", "import time\ntime.sleep(30)\nprint(1)", [S("", "1")], None, TLE, TLE, TLE, "wall-clock limit in both"),
    ("memory_100mb", "x = bytearray(100 << 20)\nprint(len(x) >> 20)", [S("", "100")], None, P, P, P, "under the limit"),
    ("memory_1500mb", "x = bytearray(1500 << 20)\nprint(len(x) >> 20)", [S("", "1500")],
     None, MLE, MLE, P, "reliability_guard() is called without a limit (its comment says 4 GB): the runner has none; "
                        "both rules keep memory_mb (4,096 in the paper preset, 1,024 here)"),
    # --- call-based (functional) ---
    ("functional_tuple", "class Solution:\n    def f(self, a, b):\n        return (a, b)", [F("1\n2", "[1, 2]")],
     "f", P, P, P, "a returned tuple is made a list"),
    ("functional_nested_tuple", "class Solution:\n    def f(self, a):\n        return [(a, a)]", [F("1", "[[1, 1]]")],
     "f", P, WA, WA, "the runner turns only the top-level tuple into a list; strict compares the JSON"),
    ("functional_main_block", "class Solution:\n    def f(self, a):\n        return a + 1\nif __name__ == '__main__':\n"
     "    print(Solution().f(int(input())))", [F("1", "2")],
     "f", RE, P, P, "the runner imports the code as module tmp_sol: its main block does not run"),
    ("functional_no_class", "def f(a):\n    return a * 2", [F("3", "6")],
     "f", RE, P, P, "without `class Solution` the runner calls the module's function"),
    ("functional_numpy_scalar", "import numpy as np\nclass Solution:\n    def f(self, nums):\n        return np.sum(nums)",
     [F("[1, 2, 3]", "6")], "f", RE, P, P, "np.int64(6) == 6 in-process; strict has no numpy"),
    ("functional_global_counter", "calls = 0\nclass Solution:\n    def f(self, a):\n        global calls\n"
     "        calls += 1\n        return calls", [F("5", "1"), F("6", "1")],
     "f", P, P, WA, "the runner runs every test in one module and one Solution: state leaks into the next test "
                    "(runner artifact)"),
    ("functional_instance_state", "class Solution:\n    def __init__(self):\n        self.seen = []\n"
     "    def f(self, a):\n        self.seen.append(a)\n        return len(self.seen)", [F("5", "1"), F("6", "1")],
     "f", P, P, WA, "one Solution for every test: what __init__ set is not reset between tests (runner artifact)"),
    ("functional_mutable_default", "class Solution:\n    def f(self, a, acc=[]):\n        acc.append(a)\n"
     "        return sum(acc)", [F("1", "1"), F("2", "2")],
     "f", P, P, WA, "one bound method for every test: its default list keeps the first test's items (runner artifact)"),
    ("functional_class_cache", "class Solution:\n    memo = {}\n    def f(self, n):\n        if n not in self.memo:\n"
     "            self.memo[n] = n * n\n        return self.memo[n]", [F("3", "9"), F("4", "16"), F("3", "9")],
     "f", P, P, P, "a cache shared between tests holds right answers: sharing the module changes nothing"),
    ("functional_float", "class Solution:\n    def f(self, a):\n        return a / 2", [F("3", "1.5")],
     "f", P, P, P, "equal floats"),
]


def _verdict(verifier: CodeVerifier, case: tuple) -> str:
    _, program, tests, fn_name, *_ = case
    result = verifier.run_tests(program, [TestCase.from_dict(t) for t in tests], fn_name, mode="first-failure")
    return next((t["verdict"] for t in result.tests if t["verdict"] != "passed"), P)


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for rules in ("strict", "official", "runner"):
        # 3 s per test: a 50,000-frame RecursionError takes over a second on a loaded CI core
        config = VerifierConfig(code_rules=rules, code_workers=2, timeout_s=3.0, memory_mb=1024)
        with SandboxPool(config) as pool:
            verifier = CodeVerifier(config, pool)
            with ThreadPoolExecutor(pool.workers) as ex:
                out[rules] = dict(zip([c[0] for c in CASES], ex.map(_verdict, [verifier] * len(CASES), CASES)))
    return out


def test_corpus_is_large_and_explained() -> None:
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)
    assert all(len(c[7]) > 10 for c in CASES)
    assert {c[4] for c in CASES} == {P, WA, RE, TLE, MLE}
    # the corpus has cases where the modes disagree with each other and with the runner
    assert any(c[4] != c[5] for c in CASES) and any(c[5] != c[6] for c in CASES)


# Where code_rules runner does not give lcb_runner's verdict: its verdict here, and why.
RUNNER_RULES_DIFFER = {
    "memory_1500mb": (MLE, "runner rules keep memory_mb: the runner has no limit at all"),
}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_parity_case(case: tuple, verdicts: dict[str, dict[str, str]]) -> None:
    name, *_, strict, official, runner, reason = case
    assert (verdicts["strict"][name], verdicts["official"][name]) == (strict, official), reason
    expected_runner, why = RUNNER_RULES_DIFFER.get(name, (runner, reason))
    assert verdicts["runner"][name] == expected_runner, why


def test_runner_rules_change_scores_where_the_runner_is_wrong() -> None:
    """Runner rules reproduce lcb_runner's own artifacts on the corpus: most cases where it differs from the
    official rules (and so from a correct harness) get its verdict, which is why the option exists."""
    differing = [c[0] for c in CASES if c[5] != c[6]]
    assert len(differing) >= 10
    assert len(set(differing) - set(RUNNER_RULES_DIFFER)) >= len(differing) - 1


def test_lcb_runner_source_wraps_as_the_runner_does() -> None:
    from klear.verifiers._zygote import lcb_runner_source

    source = lcb_runner_source("import sys\nx = 1\nif __name__ == '__main__':\n    print(x)")
    assert source.startswith("import sys\n") and "def wrapped_function():" in source and "__name__" not in source
    kept = lcb_runner_source("x = 1\nif '__main__' == __name__:\n    print(x)")  # reversed: not unwrapped
    assert "if '__main__' == __name__:" in kept
    assert lcb_runner_source("def (:") == "def (:"  # does not parse: left as is


def test_runner_rules_share_one_module_across_call_based_tests() -> None:
    """Runner rules, all mode: state carries on past a wrong answer in the same process; a test that kills the
    process (timeout) is named, and the tests after it start again in a fresh module."""
    program = ("calls = 0\nclass Solution:\n    def f(self, a):\n        global calls\n        calls += 1\n"
               "        while a == 9:\n            pass\n        return calls")
    tests = [TestCase.from_dict(F(a, out)) for a, out in (("5", "1"), ("6", "1"), ("7", "3"), ("9", "0"), ("8", "1"))]
    config = VerifierConfig(code_rules="runner", code_workers=1, timeout_s=1.0, memory_mb=1024)
    with CodeVerifier(config) as verifier:
        shared = [t["verdict"] for t in verifier.run_tests(program, tests, "f", mode="all").tests]
        assert shared == [P, WA, P, TLE, P]
        first = [t["verdict"] for t in verifier.run_tests(program, tests, "f", mode="first-failure").tests]
        assert first == [P, WA, "not_run", "not_run", "not_run"]


def test_report_names_the_runner_rules() -> None:
    from klear.evaluate.stage import code_judging

    runner, official = (code_judging(VerifierConfig(code_rules=r)) for r in ("runner", "official"))
    assert runner.startswith("rules runner (lcb_runner)") and official.startswith("rules official (lcb_runner)")
    assert "one module and one Solution" in runner and "wrapped in a function" in runner
    assert "one module" not in official and "with real stdin" in official


def test_shared_call_verdicts() -> None:
    def run(result: bytes, status: str = "ok") -> RunResult:
        return RunResult(status, result=result, wall_s=2.0)

    def ok(seconds: float, value: object) -> bytes:
        return b"ok %g %s\n" % (seconds, encode_value(value))

    want = ["1", "2", "3"]  # judged here, against the values the lines carry
    assert shared_call_verdicts(run(b"ready\n" + ok(0.5, 1) + ok(0.25, 5)), want) == [(P, 0.5), (WA, 0.25)]
    assert shared_call_verdicts(run(b"ready\n" + ok(0.5, 1) + b"ok 0.1 [", "timeout"), want) == [(P, 0.5), (TLE, 1.5)]
    assert shared_call_verdicts(run(b"", "runtime_error"), want[:2]) == [(RE, 2.0)]  # the module itself failed
    assert shared_call_verdicts(run(b"ready\n"), want[:2]) == [(RE, 2.0)]  # ended cleanly mid-test
    # not stopping at failures: a process that ends after a wrong answer ended during the next test
    assert shared_call_verdicts(run(b"ready\n" + ok(0.5, 0), "memory_limit"), want, False) == [(WA, 0.5), (MLE, 1.5)]
    assert shared_call_verdicts(run(b"ready\nerror 0.1\n" + ok(0.1, 2)), want[:2], False) == [(RE, 0.1), (P, 0.1)]
    # stopping at failures: lines after the first failure (the process ran on until the harness ended it) are cut
    assert shared_call_verdicts(run(b"ready\nerror 0.1\n" + ok(0.1, 2)), want[:2]) == [(RE, 0.1)]


def test_offered_packages_are_read_only_and_alone() -> None:
    config = VerifierConfig(code_rules="official", code_workers=1, timeout_s=2.0, memory_mb=1024)
    with SandboxPool(config) as pool:
        assert "numpy" in pool.packages
        writes = pool.run("import numpy, os\nopen(os.path.join(os.path.dirname(numpy.__file__), 'x.py'), 'w')")
        assert writes.status == "runtime_error" and b"PermissionError" in writes.stderr
        site = os.path.dirname(os.path.dirname(np.__file__))  # the harness's real site-packages
        listing = pool.run(f"import os\nos.listdir({site!r})")
        assert listing.status == "runtime_error" and b"PermissionError" in listing.stderr  # not the site-packages
        other = pool.run("import boto3")  # installed beside the verifier, not offered
        assert other.status == "runtime_error" and b"ModuleNotFoundError" in other.stderr


# --- extraction and comparison (pure) -------------------------------------------------------------------
def test_lcb_extraction_takes_the_last_fenced_lines_of_the_raw_output() -> None:
    thought_only = "<think>try\n```python\nprint(1)\n```\nhmm"
    assert extract_program_lcb(thought_only) == "print(1)"  # no </think>: strict finds no program
    assert extract_program_lcb("```python\na\n```\nthen\n```cpp\nb\n```") == "b"  # the last block, any language
    assert extract_program_lcb("```python\na\n```\nnow:\n```python\nprint(") == "now:"  # odd fences: the runner's pair
    assert extract_program_lcb("no code") is None


def test_prepare_official_judges_truncated_and_unclosed_thoughts() -> None:
    problem = Problem.make("p", "code", None, [S("", "1")], None)
    strict, official = VerifierConfig(), VerifierConfig(code_rules="official")
    response = "<think>so\n```python\nprint(1)\n```\n"
    assert prepare(response, "length", problem, strict).verdict == "truncated"  # type: ignore[union-attr]
    assert prepare(response, "stop", problem, strict).verdict == "no_think_end"  # type: ignore[union-attr]
    task, _ = prepare(response, "length", problem, official)  # type: ignore[misc]
    assert task["program"] == "print(1)"
    assert prepare("no code", "stop", problem, official).verdict == "no_program"  # type: ignore[union-attr]


def test_lcb_comparison() -> None:
    assert compare_stdout_lcb("10.0\n", "10") and compare_stdout_lcb(" 1  2 \n\n", "1 2")
    assert not compare_stdout_lcb("Yes 10.0", "Yes 10") and not compare_stdout_lcb("0.30000000000000004", "0.3")
    assert not compare_stdout_lcb("sNaN", "sNaN 1") and not compare_stdout_lcb("1\n\n2", "1\n2")
