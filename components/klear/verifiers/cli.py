"""`klear verify-math` and `klear verify-code`: the verifiers on files, for spot checks and scripts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from klear.verifiers.config import VerifierConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from klear.common.cli import add_config_arguments

    p = subparsers.add_parser("verify-math", help="judge math answers: JSONL {response, gold} -> JSONL verdicts")
    p.add_argument("--input", required=True, help="JSONL file, one {\"response\": ..., \"gold\": ...} a line")
    add_config_arguments(p)
    p.set_defaults(func=run_math)

    p = subparsers.add_parser("verify-code", help="run a program against tests in the sandbox")
    p.add_argument("--program", required=True, help="Python file to judge")
    p.add_argument("--tests", required=True,
                   help="JSON: a list of {input, output, testtype}, or {\"tests\": [...], \"fn_name\": ...}")
    p.add_argument("--fn-name", help="method of class Solution, for functional tests")
    p.add_argument("--mode", choices=("all", "first-failure"), help="default: the config's code_mode")
    p.add_argument("--timeout", type=float, help="seconds per test (default: the config's timeout_s)")
    p.add_argument("--problem-id", default="", help="seeds the test subset when there are more than max_tests")
    add_config_arguments(p)
    p.set_defaults(func=run_code)


def _config(args: argparse.Namespace) -> VerifierConfig:
    from klear.common.config import load_config

    return load_config(VerifierConfig, args.config, args.overrides)


def run_math(args: argparse.Namespace) -> int:
    from klear.verifiers.math_verifier import MathVerifier

    items = []
    for n, line in enumerate(Path(args.input).read_text().splitlines(), 1):
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


def run_code(args: argparse.Namespace) -> int:
    from klear.verifiers.code_verifier import CodeVerifier, TestCase

    data = json.loads(Path(args.tests).read_text())
    fn_name = args.fn_name
    if isinstance(data, dict):
        fn_name = fn_name or data.get("fn_name")
        data = data.get("tests")
    if not isinstance(data, list):
        raise ValueError(f"{args.tests}: expected a list of tests or {{\"tests\": [...]}}")
    fn_name = fn_name or next((t.get("fn_name") for t in data if isinstance(t, dict) and t.get("fn_name")), None)
    tests = [TestCase.from_dict(t) for t in data]
    program = Path(args.program).read_text()
    with CodeVerifier(_config(args)) as verifier:
        result = verifier.run_tests(program, tests, fn_name, args.mode, args.problem_id, args.timeout)
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    return 0
