"""`klear verify-math` and `klear verify-code`: the verifiers on files, for spot checks and scripts.

Bad input is refused with exit code 2 and a message naming the file, the line or test, and what was expected.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from klear.verifiers.config import VerifierConfig


def _positive_seconds(text: str) -> float:
    """argparse type of --timeout: a finite number of seconds above 0 (0 would silently mean the default)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from klear.common.cli import add_config_arguments
    p = subparsers.add_parser("verify-math", help="judge math answers: JSONL {response, gold} -> JSONL verdicts")
    p.add_argument("--input", required=True, help="JSONL file, one {\"response\": ..., \"gold\": ...} a line")
    add_config_arguments(p, "paper", VerifierConfig)
    p.set_defaults(func=run_math)

    p = subparsers.add_parser("verify-code", help="run a program against tests in the sandbox")
    p.add_argument("--program", required=True, help="Python file to judge")
    p.add_argument("--tests", required=True,
                   help="JSON: a list of {input, output, testtype}, or {\"tests\": [...], \"fn_name\": ...}")
    p.add_argument("--fn-name", help="method of class Solution, for functional tests")
    p.add_argument("--mode", choices=("all", "first-failure"), help="default: the config's code_mode")
    p.add_argument("--timeout", type=_positive_seconds, help="seconds per test (default: the config's timeout_s)")
    p.add_argument("--problem-id", default="", help="seeds the test subset when there are more than max_tests")
    add_config_arguments(p, "paper", VerifierConfig)
    p.set_defaults(func=run_code)


def _config(args: argparse.Namespace) -> VerifierConfig:
    from klear.common.config import load_config

    return load_config(VerifierConfig, args.config, args.overrides)


def read_text(path: str) -> str:
    """A file's text; one that is not UTF-8 is an error naming it and the line of the first bad byte."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def run_math(args: argparse.Namespace) -> int:
    from klear.verifiers.math_verifier import MathVerifier

    items = []
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other characters splitlines breaks at.
    for n, line in enumerate(read_text(args.input).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            items.append((str(row["response"]), str(row["gold"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{args.input}:{n}: expected {{\"response\": ..., \"gold\": ...}}: {exc}") from None
    with MathVerifier(_config(args)) as verifier:
        for result in verifier.verify_batch(items):
            sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    return 0


def load_tests(path: str, fn_name: str | None) -> tuple[list[Any], str | None]:
    """The tests of a --tests file and the fn_name it names (unless given): errors name the file and line or test."""
    from klear.verifiers.code_verifier import TestCase

    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
    if isinstance(data, dict):
        fn_name = fn_name or data.get("fn_name")
        data = data.get("tests")
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of tests or {{\"tests\": [...]}}")
    fn_name = fn_name or next((t.get("fn_name") for t in data if isinstance(t, dict) and t.get("fn_name")), None)
    tests = []
    for i, test in enumerate(data):
        try:
            tests.append(TestCase.from_dict(test))
        except ValueError as exc:
            raise ValueError(f"{path}: test {i}: {exc}") from None
    return tests, fn_name


def run_code(args: argparse.Namespace) -> int:
    from klear.verifiers.code_verifier import CodeVerifier

    tests, fn_name = load_tests(args.tests, args.fn_name)
    program = read_text(args.program)
    with CodeVerifier(_config(args)) as verifier:
        result = verifier.run_tests(program, tests, fn_name, args.mode, args.problem_id, args.timeout)
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    return 0
