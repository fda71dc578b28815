"""`klear reward`: score rollouts under a GPPO reward configuration and say why each scored what it did.

    klear reward --task math --response FILE|- --answer TEXT [--config release-math] [--set KEY=VALUE ...]
    klear reward --task code --response FILE|- --tests FILE [--fn-name NAME] [--config release-code]
    klear reward --rollouts FILE|URI [--config ...]        # a JSONL of rollouts, or a gppo output (its logs/rollouts.jsonl)

One JSON line per rollout on stdout: `reward`, `reason` (why, in words: "missing </think>", "test 3: timeout",
"answer 42 verified against 42"), `outcome` (the training metrics' reason code), `correct` (what accuracy and the
NLL term count) and `timed_out`; a rollout line that carried the reward it got in training also gets
`recorded_reward`. Rollouts are scored as training scores them: in reward worker processes, each within
`reward.budget_s`, through the preset's verifier settings.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from klear.verifiers.cli import load_tests, read_text

ROLLOUT_KEYS = ("task", "response", "answer", "tests", "fn_name", "problem_id")
ROLLOUT_LOG = "logs/rollouts.jsonl"  # where a gppo output holds the rollouts its training logged


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from klear.common.cli import add_config_arguments
    from klear.gppo.config import GppoConfig

    p = subparsers.add_parser("reward", help="score rollouts under a GPPO reward configuration, with the reason",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--response", metavar="FILE", help="the whole response text (think block and fences "
                        "included); - reads standard input")
    source.add_argument("--rollouts", metavar="FILE|URI", help="JSONL, one rollout a line: {task, response, answer | "
                        "tests, fn_name, problem_id}; or a gppo output (local or s3://), whose logs/rollouts.jsonl "
                        "holds the rollouts training logged")
    p.add_argument("--task", choices=("math", "code"), help="with --response: the verifier (default: the config's task)")
    p.add_argument("--answer", help="math: the gold answer")
    p.add_argument("--tests", metavar="FILE", help="code: JSON list of {input, output, testtype} or "
                   "{\"tests\": [...], \"fn_name\": ...}, as `klear verify-code` takes")
    p.add_argument("--fn-name", help="code: method of class Solution, for functional tests")
    p.add_argument("--problem-id", default="", help="code: seeds the tests drawn when there are more than the limit")
    add_config_arguments(p, "math", GppoConfig)
    p.set_defaults(func=run)


def one_rollout(args: argparse.Namespace, default_task: str) -> dict[str, Any]:
    """The rollout of --response and its gold: an error names the missing or contradicting option."""
    task = args.task or default_task
    response = sys.stdin.read() if args.response == "-" else read_text(args.response)
    if task == "math":
        if args.answer is None:
            raise ValueError("--task math needs --answer (the gold answer)")
        if args.tests:
            raise ValueError("--tests is for --task code; math takes --answer")
        return {"task": "math", "response": response, "answer": args.answer}
    if args.tests is None:
        raise ValueError("--task code needs --tests FILE (the tests the code verifier takes)")
    if args.answer is not None:
        raise ValueError("--answer is for --task math; code takes --tests")
    tests, fn_name = load_tests(args.tests, args.fn_name)
    return {"task": "code", "response": response, "fn_name": fn_name, "problem_id": args.problem_id,
            "tests": [{"input": t.input, "output": t.output, "testtype": t.testtype} for t in tests]}


def rollouts_location(location: str) -> str:
    """The JSONL file of --rollouts: the file itself, or a gppo output folder's logs/rollouts.jsonl."""
    from klear.common import storage

    loc = storage.Uri.parse(location)
    return str(loc.join(ROLLOUT_LOG)) if storage.is_dir(loc) else location


def read_rollouts(location: str, default_task: str) -> Iterator[tuple[dict[str, Any], float | None]]:
    """(rollout, the reward it was recorded with) per line of a JSONL file (local or on object storage); errors name
    the file, line and field."""
    from klear.common import storage
    from klear.common.records import jsonl_chunks, parse_chunk
    from klear.verifiers.code_verifier import TestCase

    path = rollouts_location(location)
    with storage.localize(path) as local:
        located = [item for chunk in jsonl_chunks(local, path, 4096) for item in parse_chunk(chunk)]
    for where, _, row in located:  # parse_chunk refused bad JSON and non-objects, naming file and line
        task = row.get("task") or default_task
        if task not in ("math", "code"):
            raise ValueError(f"{where}: field 'task' is {task!r}; expected math or code")
        if not isinstance(row.get("response"), str):
            raise ValueError(f"{where}: field 'response' must be the response text")
        if task == "math" and not isinstance(row.get("answer"), (str, int, float)):
            raise ValueError(f"{where}: a math rollout needs field 'answer' (the gold answer)")
        if task == "code":
            if row.get("tests") is None and row.get("tests_bytes"):
                raise ValueError(f"{where}: the tests of this rollout were not kept ({row['tests_bytes']} bytes of "
                                 "JSON): score it with --response and --tests")
            tests = json.loads(row["tests"]) if isinstance(row.get("tests"), str) else row.get("tests")
            if not isinstance(tests, list) or not tests:
                raise ValueError(f"{where}: a code rollout needs field 'tests', a non-empty list of {{input, output}}")
            for i, test in enumerate(tests):
                try:
                    TestCase.from_dict(test)
                except ValueError as exc:
                    raise ValueError(f"{where}: tests[{i}]: {exc}") from None
            row = {**row, "tests": tests}
        rollout = {k: row[k] for k in ROLLOUT_KEYS if row.get(k) is not None}
        rollout["task"] = task
        if task == "math":
            rollout["answer"] = str(row["answer"])
        recorded = row.get("reward")
        yield rollout, float(recorded) if isinstance(recorded, (int, float)) else None


def outcome_line(outcome: Any, recorded: float | None) -> dict[str, Any]:
    line = {"reward": outcome.reward, "reason": outcome.detail or outcome.reason, "outcome": outcome.reason,
            "correct": outcome.correct, "timed_out": outcome.timed_out}
    if recorded is not None:
        line["recorded_reward"] = recorded
    return line


def run(args: argparse.Namespace) -> int:
    from klear.common.config import load_config
    from klear.gppo.config import GppoConfig
    from klear.gppo.rewards import RewardPool

    config = load_config(GppoConfig, args.config, args.overrides)
    if args.rollouts:
        if args.answer is not None or args.tests:
            raise ValueError("--rollouts lines carry their own answer or tests: drop --answer / --tests")
        items = list(read_rollouts(args.rollouts, args.task or config.task))
    else:
        items = [(one_rollout(args, config.task), None)]
    with RewardPool(config.reward, config.verifier) as pool:
        outcomes = pool.score([rollout for rollout, _ in items])
    for outcome, (_, recorded) in zip(outcomes, items):
        sys.stdout.write(json.dumps(outcome_line(outcome, recorded)) + "\n")
    return 0
