"""Entry point of a reward worker process: `python -m klear.gppo._reward_worker`, started by rewards.RewardPool.

Runs klear.common.workers.serve: the setup payload is (RewardConfig JSON, VerifierConfig JSON); each item is a
task dict, answered with the scorer's RewardOutcome as a dict. Tasks are scored on the main thread, where
SIGALRM-based timeouts (math-verify) work.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from klear.common.workers import load_function, serve
from klear.gppo.config import RewardConfig
from klear.verifiers.config import VerifierConfig


def make_scorer(setup: tuple[str, str]) -> Callable[[dict], dict]:
    """The handler of this worker: the configured scorer, its outcome as a plain dict."""
    cfg_json, verifier_json = setup
    cfg = RewardConfig.model_validate_json(cfg_json)
    verifier = VerifierConfig.model_validate_json(verifier_json)
    scorer = load_function(cfg.scorer)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every parse timeout

    def handle(task: dict) -> dict:
        return dataclasses.asdict(scorer(task, cfg, verifier))

    return handle


if __name__ == "__main__":
    serve(make_scorer)
