"""Entry point of a reward worker process: `python -m klear.gppo._reward_worker`, started by rewards.RewardPool.

Runs klear.common.workers.serve: the setup payload is (RewardConfig JSON, VerifierConfig JSON); each item is a
task dict, answered with the scorer's RewardOutcome as a dict. Tasks are scored on the main thread, where
SIGALRM-based timeouts (math-verify) work.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable

from klear.common.workers import serve
from klear.gppo.config import RewardConfig
from klear.verifiers.config import VerifierConfig


def load_scorer(spec: str) -> Callable:
    """The function named by "module:function"."""
    module, sep, name = spec.partition(":")
    if not sep:
        raise ValueError(f"scorer {spec!r} is not of the form module:function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:  # the pool's start-up error then names the scorer
        raise ImportError(f"cannot load scorer {spec!r}: {type(exc).__name__}: {exc}") from exc


def make_scorer(setup: tuple[str, str]) -> Callable[[dict], dict]:
    """The handler of this worker: the configured scorer, its outcome as a plain dict."""
    cfg_json, verifier_json = setup
    cfg = RewardConfig.model_validate_json(cfg_json)
    verifier = VerifierConfig.model_validate_json(verifier_json)
    scorer = load_scorer(cfg.scorer)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every parse timeout

    def handle(task: dict) -> dict:
        return dataclasses.asdict(scorer(task, cfg, verifier))

    return handle


if __name__ == "__main__":
    serve(make_scorer)
