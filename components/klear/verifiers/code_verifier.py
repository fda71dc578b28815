"""Code answer checking as LiveCodeBench defines it: stdin/stdout and functional (LeetCode-style) tests.

Pure parts (program extraction, output comparison, test subset choice, verdicts) are plain functions;
running the programs is the sandbox pool's job.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import random
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from klear.common.chat import THINK_CLOSE, answer_section
from klear.verifiers._zygote import decode_value
from klear.verifiers.config import LCB_RULES, VALUE_RULES, VerifierConfig
from klear.verifiers.sandbox import RunResult, SandboxPool

__all__ = ["CodeResult", "CodeVerifier", "TestCase", "compare_stdout", "compare_stdout_exact", "compare_stdout_lcb",
           "extract_program", "extract_program_lcb", "extract_program_release", "program_of", "lcb_call_verdict", "select_tests",
           "shared_call_verdicts"]

Verdict = Literal["passed", "wrong_answer", "runtime_error", "timeout", "memory_limit", "output_limit",
                  "sandbox_error", "not_run"]

_FENCE_MARK = re.compile(r"```([^\n`]*)")
PYTHON_FENCES = ("python", "python3", "py")
# The released reward's CODE_EXTRACTION_PATTERN, r"</think>.*```python\n(.*?)\n```" (DOTALL, search), in parts.
RELEASE_FENCE_OPEN = "```python\n"
RELEASE_FENCE_CLOSE = "\n```"


# --- pure functions --------------------------------------------------------------------------------
def extract_program(response: str, think_end: str = THINK_CLOSE, require_think_end: bool = True) -> str | None:
    """The last ```python block after the end of thinking (klear.common.chat.answer_section; else the last fenced
    block without a language); None when `think_end` is required and absent, or there is no such block."""
    section = answer_section(response, think_end, require_think_end)
    if section is None:
        return None  # cut off while thinking: drafts in the reasoning are not the answer
    blocks = fenced_blocks(section)
    # A block marked as another language is no Python answer; an unmarked one is taken when none is marked Python
    # (LiveCodeBench's own extraction takes the last fenced block whatever its language).
    chosen = [body for lang, body in blocks if lang in PYTHON_FENCES] or [body for lang, body in blocks if not lang]
    return chosen[-1] if chosen else None


def extract_program_release(response: str) -> str | None:
    """The released reward's extraction (code_r1_compute.extract_code), as its regex matches: after the first
    </think>, the last "```python" + newline that some later newline + "```" closes (the greedy `.*`), its body up
    to the first such close (the lazy `.*?`). So ```py, ```Python, a bare ``` or "```python " (a trailing space) hold
    no program, nor does a block before </think>. None also for an empty body, which the release scores as no
    program (`if not solution_code`). The one reading of a response that keeps its own end of thinking (the first
    </think>, not klear.common.chat.answer_start's last): the released code reward's, kept for parity. It finds the
    program the rule finds whenever the answer after the last </think> holds one (the greedy `.*` takes the last
    block); only a block between two </think> with none after the last is a program here and reasoning there."""
    think_end = response.find(THINK_CLOSE)
    if think_end < 0:
        return None
    last_close = response.rfind(RELEASE_FENCE_CLOSE)
    body_start, at = -1, think_end + len(THINK_CLOSE)
    while (at := response.find(RELEASE_FENCE_OPEN, at)) >= 0 and at + len(RELEASE_FENCE_OPEN) <= last_close:
        at += len(RELEASE_FENCE_OPEN)  # an opening some close follows: the last one wins
        body_start = at
    if body_start < 0:
        return None
    return response[body_start:response.find(RELEASE_FENCE_CLOSE, body_start)] or None


def program_of(response: str, config: VerifierConfig) -> str | None:
    """The program a response holds under the config's code rules: lcb_runner's last fenced block (official,
    runner), the released reward's regex (release), or the last ```python block after the end of thought (strict)."""
    if config.lcb_rules:
        return extract_program_lcb(response)
    if config.code_rules == "release":
        return extract_program_release(response)
    return extract_program(response, config.think_end, config.require_think_end)


def extract_program_lcb(response: str) -> str | None:
    """lcb_runner's extract_code (chat models): the lines between the last two lines holding a ``` anywhere, of the
    raw output (the thought included); None where it finds fewer than two (its "": nothing to run)."""
    lines = response.split("\n")
    marks = [i for i, line in enumerate(lines) if "```" in line]
    if len(marks) < 2:
        return None
    return "\n".join(lines[marks[-2] + 1 : marks[-1]])


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each Markdown code fence in `text`, in order: fences pair up as they come, the
    opening one's info string (lower-cased first word) is the language, the body starts on the next line."""
    blocks: list[tuple[str, str]] = []
    opening: re.Match[str] | None = None
    for mark in _FENCE_MARK.finditer(text):
        if opening is None:
            opening = mark
            continue
        body = text[opening.end():mark.start()]
        if body.startswith(("\n", "\r\n")):  # "```py print(1)```" on one line is not a block
            words = opening.group(1).split()
            blocks.append((words[0].lower() if words else "", body.split("\n", 1)[1]))
        opening = None
    return blocks


def _as_number(token: str) -> Decimal | None:
    try:
        value = Decimal(token)
    except (InvalidOperation, ValueError):
        return None
    return value if value.is_finite() else None


def _tokens_equal(a: str, b: str, rel_tol: float, abs_tol: float) -> bool:
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    if x is None or y is None:
        return False
    if x == y:  # "1.0" vs "1", "1e2" vs "100": the same number
        return True
    return (rel_tol > 0 or abs_tol > 0) and math.isclose(float(x), float(y), rel_tol=rel_tol, abs_tol=abs_tol)


def _differing_lines(actual: str, expected: str) -> list[tuple[str, str]] | None:
    """The line pairs that differ after stripping the text and each line; None when the line counts differ."""
    got = [line.strip() for line in actual.strip().split("\n")]
    want = [line.strip() for line in expected.strip().split("\n")]
    if len(got) != len(want):
        return None
    return [(g, w) for g, w in zip(got, want) if g != w]


def compare_stdout(actual: str, expected: str, rel_tol: float = 0.0, abs_tol: float = 0.0) -> bool:
    """LiveCodeBench's comparison: line by line after stripping; else token by token, numbers as numbers."""
    differing = _differing_lines(actual, expected)
    if differing is None:
        return False
    for g, w in differing:
        gt, wt = g.split(), w.split()
        if len(gt) != len(wt) or not all(_tokens_equal(a, b, rel_tol, abs_tol) for a, b in zip(gt, wt)):
            return False
    return True


def _decimal_line(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except (InvalidOperation, ValueError):
        return None


def compare_stdout_exact(actual: str, expected: str) -> bool:
    """The released reward's comparison (code_r1_compute): the whole output equal to the expected one after strip(),
    no line, token or number tolerance."""
    return actual.strip() == expected.strip()


def compare_stdout_lcb(actual: str, expected: str) -> bool:
    """lcb_runner's grade_stdio comparison: the same number of lines (after stripping the whole text), each line
    equal after stripping, or both lines wholly numbers with equal Decimal lists ("10.0" = "10", but "Yes 10.0"
    != "Yes 10" and "a  b" != "a b": a line with any word is compared as text)."""
    differing = _differing_lines(actual, expected)
    if differing is None:
        return False
    for g, w in differing:
        gd, wd = _decimal_line(g), _decimal_line(w)
        try:
            if gd is None or wd is None or gd != wd:
                return False
        except InvalidOperation:  # a signalling NaN refuses comparison: lcb_runner's error is a wrong answer too
            return False
    return True


def compare_functional(result_json: bytes, expected: str) -> bool:
    """Functional problems: the returned value (tuples made lists) must equal the expected JSON value."""
    try:
        got = json.loads(result_json)
        want = json.loads(expected)
    except (ValueError, RecursionError):
        return False
    if isinstance(want, tuple):
        want = list(want)
    return got == want


def select_tests(n_tests: int, cap: int | None, problem_id: str) -> list[int]:
    """Indices of the tests to run: all, or `cap` of them chosen by a generator seeded from the problem id.

    Seeding from the id (not a global RNG) keeps the reward of a problem the same in every step and run.
    """
    if cap is None or n_tests <= cap:
        return list(range(n_tests))
    seed = int.from_bytes(hashlib.sha256(problem_id.encode()).digest()[:8], "big")
    return sorted(random.Random(seed).sample(range(n_tests), cap))


@dataclass(frozen=True)
class TestCase:
    __test__ = False  # not a pytest class, despite the name

    input: str
    output: str
    testtype: Literal["stdin", "functional"] = "stdin"

    @classmethod
    def from_dict(cls, d: dict) -> TestCase:
        """A test from its JSON form; a malformed one is a ValueError saying what is missing and what is expected."""
        expected = "expected keys input, output (and optionally testtype: stdin or functional)"
        if not isinstance(d, dict):
            raise ValueError(f"a test must be an object, got {type(d).__name__}; {expected}")
        missing = [key for key in ("input", "output") if key not in d]
        if missing:
            raise ValueError(f"no {', '.join(map(repr, missing))} (keys present: {sorted(map(str, d))[:10]}); {expected}")
        testtype = d.get("testtype", "stdin")
        if testtype not in ("stdin", "functional"):
            raise ValueError(f"unknown testtype {testtype!r} (expected stdin or functional)")
        return cls(str(d["input"]), str(d["output"]), testtype)


def _whole_number(digits: str) -> int:
    """A JSON integer of any length (int() refuses more than 4,300 digits at once; lcb_runner raised its limit)."""
    sign, body = (-1, digits[1:]) if digits.startswith("-") else (1, digits)
    value = 0
    for i in range(0, len(body), 4000):
        value = value * 10 ** len(body[i:i + 4000]) + int(body[i:i + 4000])
    return sign * value


def lcb_call_verdict(result: bytes, expected: str) -> Verdict:
    """lcb_runner's call-based check, made here and not in the program's process (which can write anything on any
    channel it holds): the returned value as _zygote.encode_value wrote it, `==` the expected JSON value. A result
    that is not one such value (bytes the program wrote itself, alone or around the harness's) is a runtime error;
    an expected output that is no JSON too, as the runner's json.loads raising there."""
    try:
        got = decode_value(result)
        return "passed" if got == json.loads(expected, parse_int=_whole_number) else "wrong_answer"
    except (ValueError, TypeError, RecursionError):
        return "runtime_error"


def verdict_of(run: RunResult, test: TestCase, rules: str = "strict") -> Verdict:
    """Verdict of one run against its test, under the strict, lcb_runner's (official, runner) or the released
    reward's comparison (release). A run that did not end cleanly with exit code 0 (`run.status` other than ok:
    an exception, a timeout, a limit) fails its test under every rule."""
    if run.status != "ok":
        return run.status  # type: ignore[return-value]
    if test.testtype == "functional":
        if rules in VALUE_RULES:
            return lcb_call_verdict(run.result, test.output)
        ok = compare_functional(run.result, test.output)
    elif rules == "release":
        ok = compare_stdout_exact(run.stdout.decode("utf-8", "replace"), test.output)
    elif rules in LCB_RULES:
        ok = compare_stdout_lcb(run.stdout.decode("utf-8", "replace"), test.output)
    else:
        ok = compare_stdout(run.stdout.decode("utf-8", "replace"), test.output)
    return "passed" if ok else "wrong_answer"


def shared_line_verdict(line: str, expected: str) -> tuple[Verdict, float]:
    """(verdict, seconds) of one test's line of a shared-module run: "ok SECONDS VALUE" judged here, "error SECONDS"
    a runtime error; any other line (the program's own) a runtime error too."""
    word, _, rest = line.partition(" ")
    seconds_text, _, value = rest.partition(" ")
    try:
        seconds = float(seconds_text)
    except ValueError:
        return "runtime_error", 0.0
    if not math.isfinite(seconds) or seconds < 0:
        return "runtime_error", 0.0
    if word == "ok" and value:
        return lcb_call_verdict(value.encode("ascii", "replace"), expected), seconds
    return "runtime_error", seconds


def shared_call_verdicts(run: RunResult, expected: list[str], stop_at_failure: bool = True
                         ) -> list[tuple[Verdict, float]]:
    """(verdict, seconds) of the tests a shared-module run (code_rules runner, call-based) got to, in order, from its
    result lines: "ready" after the module's setup, then one line per test (`shared_line_verdict`) judged against
    `expected`, stopping after the first failure when the run was to stop there. Lines the harness did not write
    fail the test they land on: one before "ready" the first, one after the last test's line the last. A run that
    ended before a failure names the test it was on by its status (timeout, memory_limit, ...; a clean early end,
    as a SystemExit, is a runtime error); the tests after the last one listed were not run."""
    *lines, rest = run.result.decode("ascii", "replace").split("\n")  # rest: after the last newline
    out: list[tuple[Verdict, float]] = []
    if lines[:1] == ["ready"]:
        out = [shared_line_verdict(line, want) for line, want in zip(lines[1:], expected)]
        if out and len(out) == len(expected) and (len(lines) - 1 > len(expected) or rest):
            out[-1] = ("runtime_error", out[-1][1])
    if stop_at_failure:
        failed = next((i for i, (verdict, _) in enumerate(out) if verdict != "passed"), None)
        out = out if failed is None else out[:failed + 1]
    if len(out) < len(expected) and (not out or out[-1][0] == "passed" or not stop_at_failure):
        status = run.status if run.status != "ok" else "runtime_error"
        out.append((status, max(run.wall_s - sum(t for _, t in out), 0.0)))  # type: ignore[arg-type]
    return out


def first_failure_watch(expected: list[str]) -> Callable[[bytes], bool]:
    """A shared-module run's `stop_when` in first-failure mode: judges each result line as it comes and says stop
    at the first failing test (or a line the harness did not write), as lcb_runner stops there."""
    seen = 0  # lines judged so far, "ready" included

    def stop_when(chunk: bytes) -> bool:
        nonlocal seen
        for line in chunk.decode("ascii", "replace").split("\n")[:-1]:
            if seen == 0:
                failed = line != "ready"
            else:
                failed = seen > len(expected) or shared_line_verdict(line, expected[seen - 1])[0] != "passed"
            seen += 1
            if failed:
                return True
        return False

    return stop_when


def _entry(verdict: Verdict, seconds: float, run: RunResult) -> dict[str, Any]:
    """One test's entry of a CodeResult; an error keeps the tail of what the run wrote to stderr."""
    entry: dict[str, Any] = {"verdict": verdict, "time_s": round(seconds, 4)}
    if verdict in ("runtime_error", "sandbox_error"):
        entry["stderr"] = (run.stderr[-500:].decode("utf-8", "replace") or run.detail)[-500:]
    return entry


# --- running -----------------------------------------------------------------------------------------
@dataclass
class CodeResult:
    passed: int
    total: int
    pass_fraction: float
    all_passed: bool
    program_found: bool
    tests: list[dict] = field(default_factory=list)  # index, verdict, time_s (, stderr tail)

    def to_dict(self) -> dict:
        return asdict(self)


class CodeVerifier:
    """Judge programs against test cases in the sandbox pool (started on first use, or passed in)."""

    def __init__(self, config: VerifierConfig | None = None, pool: SandboxPool | None = None):
        self.config = config or VerifierConfig()
        self._pool = pool
        self._own_pool = pool is None

    @property
    def pool(self) -> SandboxPool:
        if self._pool is None:
            self._pool = SandboxPool(self.config)
        return self._pool

    def _run_one(self, program: str, test: TestCase, fn_name: str | None, timeout_s: float | None) -> dict:
        if test.testtype == "functional":
            if not fn_name:
                raise ValueError("functional test without fn_name")
            run = self.pool.run(program, fn_name=fn_name, args=test.input, timeout_s=timeout_s)
        else:
            run = self.pool.run(program, test.input, timeout_s=timeout_s)
        return _entry(verdict_of(run, test, self.config.code_rules), run.wall_s, run)

    def _run_shared(self, program: str, tests: list[tuple[int, TestCase]], fn_name: str,
                    mode: Literal["all", "first-failure"], timeout_s: float | None) -> list[dict]:
        """Call-based tests under runner rules, as lcb_runner runs them: in order, in one process sharing one module
        and one Solution. first-failure stops at the first failing test (as the runner); all goes on in the same
        process after a wrong answer or an exception, and in a fresh one after a test that ended it (timeout,
        memory)."""
        entries: list[dict] = []
        todo = tests
        while todo:
            expected = [t.output for _, t in todo]  # never sent to the program's process: judged here
            run = self.pool.run(program, fn_name=fn_name, calls=[t.input for _, t in todo], timeout_s=timeout_s,
                                stop_when=first_failure_watch(expected) if mode == "first-failure" else None)
            got = shared_call_verdicts(run, expected, mode == "first-failure")
            entries += [{"index": i, **_entry(verdict, seconds, run)} for (i, _), (verdict, seconds) in zip(todo, got)]
            todo = todo[len(got):]
            if mode == "first-failure" and got[-1][0] != "passed":
                entries += [{"index": i, "verdict": "not_run", "time_s": 0.0} for i, _ in todo]
                break
        return entries

    def run_tests(self, program: str | None, tests: list[TestCase], fn_name: str | None = None,
                  mode: Literal["all", "first-failure"] | None = None, problem_id: str = "",
                  timeout_s: float | None = None) -> CodeResult:
        """All tests (per-test verdicts, pass fraction) or stop at the first failure (LiveCodeBench)."""
        mode = mode or self.config.code_mode
        chosen = select_tests(len(tests), self.config.max_tests, problem_id)
        entries: list[dict] = []
        if program is None:
            entries = [{"index": i, "verdict": "not_run", "time_s": 0.0} for i in chosen]
            return CodeResult(0, len(chosen), 0.0, False, False, entries)
        if self.config.code_rules == "runner" and fn_name and chosen and all(
                tests[i].testtype == "functional" for i in chosen):
            entries = self._run_shared(program, [(i, tests[i]) for i in chosen], fn_name, mode, timeout_s)
        elif mode == "first-failure":
            for n, i in enumerate(chosen):
                entries.append({"index": i, **self._run_one(program, tests[i], fn_name, timeout_s)})
                if entries[-1]["verdict"] != "passed":
                    entries += [{"index": j, "verdict": "not_run", "time_s": 0.0} for j in chosen[n + 1 :]]
                    break
        else:
            with ThreadPoolExecutor(max(1, self.pool.workers)) as ex:
                runs = list(ex.map(lambda i: self._run_one(program, tests[i], fn_name, timeout_s), chosen))
            entries = [{"index": i, **e} for i, e in zip(chosen, runs)]
        passed = sum(e["verdict"] == "passed" for e in entries)
        total = len(chosen)
        return CodeResult(passed, total, passed / total if total else 0.0, total > 0 and passed == total, True,
                          entries)

    def verify_response(self, response: str, tests: list[TestCase], fn_name: str | None = None,
                        mode: Literal["all", "first-failure"] | None = None, problem_id: str = "") -> CodeResult:
        return self.run_tests(program_of(response, self.config), tests, fn_name, mode, problem_id)

    def verify_batch(self, jobs: list[dict]) -> list[CodeResult]:
        """Many responses at once: dicts with response, tests, fn_name?, problem_id?, mode?."""
        def one(job: dict) -> CodeResult:
            tests = [t if isinstance(t, TestCase) else TestCase.from_dict(t) for t in job["tests"]]
            return self.verify_response(job["response"], tests, job.get("fn_name"), job.get("mode"),
                                        job.get("problem_id", ""))

        with ThreadPoolExecutor(max(1, self.pool.workers)) as ex:
            return list(ex.map(one, jobs))

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> CodeVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_process_verifier: CodeVerifier | None = None


def process_verifier(config: VerifierConfig) -> CodeVerifier:
    """This process's code verifier (a scoring worker's): its sandbox zygotes start once, on the first program,
    and are replaced only when the settings change."""
    global _process_verifier
    if _process_verifier is None or _process_verifier.config != config:
        if _process_verifier is not None:
            _process_verifier.close()
        _process_verifier = CodeVerifier(config)
        atexit.register(_process_verifier.close)  # a worker told to stop removes its sandbox folders
    return _process_verifier
