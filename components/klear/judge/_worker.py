"""Entry point of a judge worker process: `python -m klear.judge._worker`, started by klear.judge.pool.Judge.

Runs klear.common.workers.serve: the setup payload is (VerifierConfig JSON, scorer "module:function"); each item
is a task prepared by klear.judge.scoring.prepare, answered with the scorer's Judgement fields as a dict. Tasks
run on the main thread, where math-verify's SIGALRM timeouts work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from klear.common.workers import load_function, serve
from klear.verifiers.config import VerifierConfig


def make_handler(setup: tuple[str, str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    verifier_json, scorer_spec = setup
    verifier = VerifierConfig.model_validate_json(verifier_json)
    scorer = load_function(scorer_spec)
    logging.disable(logging.WARNING)  # math-verify logs every parse timeout: costly at hundreds of samples/s
    if scorer_spec == "klear.judge.scoring:score_task":
        import math_verify  # noqa: F401 - imported before "ready", so the first item's budget is all judging

    def handle(task: dict[str, Any]) -> dict[str, Any]:
        return scorer(task, verifier)

    return handle


if __name__ == "__main__":
    serve(make_handler)
