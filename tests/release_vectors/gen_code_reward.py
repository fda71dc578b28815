"""Vectors of the release's code reward: code_r1_compute.compute_score as its RL data calls it (data_source
coder1_longcot: is_longcot=True), the release's own module run on planted responses and tests, and the names its
call-based programs get (code_r1_reward/utils.py BASE_IMPORTS + BASE_LEETCODE_IMPORTS).

The release runs each test through firejail_exec.code_exec_firejail, itself run here unchanged but for its command
line (see `executor`): with firejail installed, the release's flags less `--private` (it hides the interpreter of a
machine whose Python lives under /root, where the release's image kept it under /usr) and `--kill-at-exit` (unknown
to Debian's firejail 0.9.72), and this interpreter for `python`; without firejail, the program alone under the same
rlimits and timeout. Tests are given in this project's form and turned into the release's ground truth
(`release_ground_truth`); each case's `timeout_s` is the ground truth's "timeout" (the release's 35 s default is
not needed to show a timeout).
"""

from __future__ import annotations

import importlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.release_vectors.release import HEAD, package, provenance

FILES = ["verl/utils/reward_score/code_r1_compute.py", "verl/utils/reward_score/reward_config.py",
         "verl/utils/reward_score/code_r1_reward/firejail_exec.py", "verl/utils/reward_score/code_r1_reward/utils.py"]
MODULE = "verl.utils.reward_score.code_r1_compute"
DROPPED_FLAGS = ("--private", "--kill-at-exit")
TIMEOUT_S = 10  # every case's but the timeouts': bounds a case gone wrong, never reached by a right one
# The timeout cases': firejail itself takes about a second to start a program here, inside the release's timeout.
SHORT_S = 3

THOUGHT = "<think>\nRead two numbers, print their sum.\n</think>\n\n"
SUM = "a, b = map(int, input().split())\nprint(a + b)"
SUM_TESTS = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
             {"input": "40 2\n", "output": "42\n", "testtype": "stdin"}]


def block(program: str, fence: str = "```python") -> str:
    return f"{fence}\n{program}\n```\n"


def stdin_case(name: str, response: str, tests: list[dict] | None = None, timeout_s: int = TIMEOUT_S) -> dict:
    return {"name": name, "response": response, "tests": tests or SUM_TESTS, "fn_name": None, "timeout_s": timeout_s}


def call_case(name: str, program: str, fn_name: str, tests: list[tuple[str, str]]) -> dict:
    return {"name": name, "response": THOUGHT + block(program), "fn_name": fn_name, "timeout_s": TIMEOUT_S,
            "tests": [{"input": args, "output": out, "testtype": "functional"} for args, out in tests]}


BIG = "1" + "0" * 5000  # 10 ** 5000, past the 4,300 digits Python prints by default
CASES = [
    stdin_case("```python block", THOUGHT + block(SUM)),
    stdin_case("```py block", THOUGHT + block(SUM, "```py")),
    stdin_case("```Python block", THOUGHT + block(SUM, "```Python")),
    stdin_case("bare ``` block", THOUGHT + block(SUM, "```")),
    stdin_case("```python3 block", THOUGHT + block(SUM, "```python3")),
    stdin_case("```python with a trailing space", THOUGHT + block(SUM, "```python ")),
    stdin_case("two blocks, the last right", THOUGHT + block(SUM.replace("a + b", "a - b")) + "Better:\n" + block(SUM)),
    stdin_case("two blocks, the last wrong", THOUGHT + block(SUM) + "Or:\n" + block(SUM.replace("a + b", "a - b"))),
    stdin_case("a block before </think> only", "<think>\n" + block(SUM) + "</think>\n\nDone."),
    stdin_case("a wrong block after </think>, a right one before", "<think>\n" + block(SUM) + "</think>\n\n"
               + block(SUM.replace("a + b", "a * b"))),
    stdin_case("an empty ```python block", THOUGHT + "```python\n\n```\n"),
    stdin_case("an unclosed ```python block", THOUGHT + "```python\n" + SUM),
    stdin_case("missing </think>", "<think>\nRead two numbers.\n" + block(SUM)),
    stdin_case("missing <think>", "Read two numbers.\n</think>\n\n" + block(SUM)),
    stdin_case("no think tags", block(SUM)),
    stdin_case("sqrt without an import", THOUGHT + block("print(int(sqrt(int(input()))))"),
               [{"input": "16\n", "output": "4\n", "testtype": "stdin"}]),
    stdin_case("sqrt imported", THOUGHT + block("from math import sqrt\nprint(int(sqrt(int(input()))))"),
               [{"input": "16\n", "output": "4\n", "testtype": "stdin"}]),
    stdin_case("deque without an import", THOUGHT + block("q = deque(map(int, input().split()))\nprint(sum(q))")),
    stdin_case("numpy", THOUGHT + block("import numpy as np\nprint(int(np.array(input().split(), dtype=int).sum()))")),
    stdin_case("pandas", THOUGHT + block("import pandas as pd\nprint(int(pd.Series(input().split()).astype(int).sum()))")),
    stdin_case("a runtime error on one test of two", THOUGHT + block(SUM.replace("a + b", "a + b if a < 10 else 1 // 0"))),
    stdin_case("a wrong answer on every test", THOUGHT + block(SUM.replace("a + b", "a * b"))),
    stdin_case("a wrong answer on one test of two", THOUGHT + block(SUM.replace("a + b", "a + b if a < 10 else 0"))),
    stdin_case("trailing and leading whitespace", THOUGHT + block(SUM.replace("print(a + b)",
                                                                              "print('  ', a + b, end=' \\n\\n')"))),
    stdin_case("whitespace inside a line", THOUGHT + block("a, b = input().split()\nprint(a + '  ' + b)"),
               [{"input": "1 2\n", "output": "1 2\n", "testtype": "stdin"}]),
    stdin_case("3.0 for 3", THOUGHT + block(SUM.replace("a + b", "float(a + b)"))),
    stdin_case("exit code 1 after the right output", THOUGHT + block("import sys\n" + SUM + "\nsys.exit(1)")),
    stdin_case("sys.exit(0) after the right output", THOUGHT + block("import sys\n" + SUM + "\nsys.exit(0)")),
    stdin_case("exit() after the right output", THOUGHT + block(SUM + "\nexit()")),
    stdin_case("quit() before a wrong output", THOUGHT + block(SUM + "\nquit()\nprint(0)")),
    stdin_case("stdin read whole through sys.stdin.buffer", THOUGHT + block(
        "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)")),
    stdin_case("stderr beside the right output", THOUGHT + block("import sys\n" + SUM + "\nprint('debug', file=sys.stderr)")),
    stdin_case("recursion past Python's default limit", THOUGHT + block(
        "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n" + SUM.replace("a + b", "a + b + 0 * depth(3000)"))),
    stdin_case("recursion with the limit raised", THOUGHT + block(
        "import sys\nsys.setrecursionlimit(10000)\ndef depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
        + SUM.replace("a + b", "a + b + 0 * depth(3000)"))),
    stdin_case("an int of 5,001 digits", THOUGHT + block("input()\nprint(10 ** 5000)"),
               [{"input": "x\n", "output": BIG + "\n", "testtype": "stdin"}]),
    stdin_case("a test timing out", THOUGHT + block("import time\ntime.sleep(30)\n" + SUM), timeout_s=SHORT_S),
    stdin_case("one test of two timing out", THOUGHT + block(SUM.replace("print(a + b)",
                                                                         "while a > 10:\n    pass\nprint(a + b)")),
               timeout_s=SHORT_S),
    call_case("call-based, the release's names without imports", (
        "class Solution:\n    def f(self, nums: List[int]) -> int:\n        q = deque(nums)\n"
        "        return int(np.sum(list(q))) + len(Counter(nums)) + int(sqrt(gcd(4, 8)))"),
        "f", [("[1, 2, 2]", "9"), ("[3]", "6")]),
    call_case("call-based, the release's ListNode helpers", (
        "class Solution:\n    def f(self, values: List[int]) -> List[int]:\n        head, out = list_node(values), []\n"
        "        while head:\n            out.append(head.val * 2)\n            head = head.next\n        return out"),
        "f", [("[1, 2, 3]", "[2, 4, 6]"), ("[]", "[]")]),
    call_case("call-based, the release's TreeNode helpers", (
        "class Solution:\n    def f(self, values: List[Optional[int]]) -> bool:\n"
        "        return is_same_tree(tree_node(values), tree_node(list(values)))"),
        "f", [("[1, null, 2, 3]", "true")]),
    call_case("call-based, a wrong value", "class Solution:\n    def f(self, nums: List[int]) -> int:\n        return 0",
              "f", [("[1, 2]", "3")]),
]


def release_ground_truth(case: dict) -> dict[str, Any]:
    """The case's tests as the release's data holds them: stdin inputs and outputs, or (call-based) one test program
    per test, run after the solution and passing when it exits 0 (the assertion holds)."""
    tests = case["tests"]
    if case["fn_name"] is None:
        return {"inputs": [t["input"] for t in tests], "outputs": [t["output"] for t in tests],
                "timeout": case["timeout_s"]}
    programs = [f"import json as _json\n_args = [_json.loads(_line) for _line in {t['input']!r}.split('\\n')]\n"
                f"assert Solution().{case['fn_name']}(*_args) == _json.loads({t['output']!r})" for t in tests]
    return {"functional": programs, "timeout": case["timeout_s"]}


def _release_limits() -> None:
    """firejail_exec's --rlimit-* flags, for the executor without firejail."""
    for limit, value in ((resource.RLIMIT_AS, 1024 << 20), (resource.RLIMIT_NOFILE, 32),
                         (resource.RLIMIT_FSIZE, 8 << 20), (resource.RLIMIT_NPROC, 32)):
        resource.setrlimit(limit, (value, value))


def executor(firejail: bool) -> Callable[..., subprocess.CompletedProcess]:
    """subprocess.run as firejail_exec calls it, its command adjusted (see the module's docstring)."""
    def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        command = list(command)
        at = command.index("python")
        command[at] = sys.executable
        if firejail:
            command = [arg for arg in command if arg not in DROPPED_FLAGS]
        else:
            command, kwargs["preexec_fn"] = command[at:], _release_limits
        return subprocess.run(command, **kwargs)  # noqa: PLW1510 - firejail_exec passes check=False itself

    return run


def describe(value: object) -> str:
    """What a name of a program's namespace is, comparable across processes: a module by its name, a function or class
    by where it is defined ("defined there" for the preamble's own), a number by its value."""
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, (int, float, str)):
        return f"{type(value).__name__} {value!r}"
    module = getattr(value, "__module__", None)
    if module == "__main__":
        return f"{type(value).__name__} defined there"
    name = getattr(value, "__qualname__", None)
    return f"{module}.{name}" if name else repr(value)


def names_of(preamble: str) -> dict[str, str]:
    """Every name `preamble` binds in a `__main__` namespace, described."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(preamble, "<preamble>", "exec"), namespace)  # noqa: S102 - the release's imports, or ours
    return {name: describe(value) for name, value in sorted(namespace.items()) if not name.startswith("__")}


def _forget_release_modules() -> None:
    """Another generator's `verl` package (another temporary folder) must not answer this one's imports."""
    for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
        del sys.modules[name]


def generate(git_dir: Path) -> dict[str, Any]:
    use_firejail = shutil.which("firejail") is not None
    _forget_release_modules()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            package(git_dir, HEAD, FILES, Path(tmp))
            compute = importlib.import_module(MODULE)
            utils = importlib.import_module("verl.utils.reward_score.code_r1_reward.utils")
            firejail_exec = importlib.import_module("verl.utils.reward_score.code_r1_reward.firejail_exec")
            shim = types.SimpleNamespace(run=executor(use_firejail), PIPE=subprocess.PIPE,
                                         TimeoutExpired=subprocess.TimeoutExpired)
            firejail_exec.subprocess = shim  # type: ignore[attr-defined]  # its `subprocess.run` alone, replaced
            if use_firejail and not firejail_exec.code_exec_firejail("print(1)", "x", 30)[0]:
                use_firejail = False  # firejail installed but unable to run here (no namespaces): the fallback
                shim.run = executor(False)
            cases = []
            for case in CASES:
                truth = release_ground_truth(case)
                reward = compute.compute_score(case["response"], json.dumps(truth), is_longcot=True)
                cases.append({**case, "release_ground_truth": truth, "reward": float(reward)})
            names = names_of(utils.BASE_IMPORTS + "\n\n" + utils.BASE_LEETCODE_IMPORTS)
    finally:
        _forget_release_modules()
    how = (f"firejail {_firejail_version()} with the release's flags less {', '.join(DROPPED_FLAGS)}; `python` = "
           "the generator's interpreter" if use_firejail else
           "no firejail: the program alone (the generator's interpreter) under the release's --rlimit-as=1024m, "
           "--rlimit-nofile=32, --rlimit-fsize=8m, --rlimit-nproc=32, with its timeout")
    return {"provenance": [provenance(git_dir, HEAD, FILES[0], "compute_score(solution, ground_truth, is_longcot=True)",
                                      executor=how, python=sys.version.split()[0],
                                      packages={n: metadata.version(n) for n in ("numpy", "pandas")}),
                           provenance(git_dir, HEAD, FILES[3], "BASE_IMPORTS + BASE_LEETCODE_IMPORTS",
                                      note="release_names: the names a call-based program gets, described")],
            "release_names": names, "cases": cases}


def _firejail_version() -> str:
    out = subprocess.run(["firejail", "--version"], capture_output=True, text=True, check=False).stdout
    return out.split("\n", 1)[0].removeprefix("firejail version ").strip() or "?"
