"""Entry point of a reward worker process: `python -m klear.gppo._reward_worker`, started by rewards.RewardPool.

Protocol over stdin/stdout (multiprocessing Connection framing): in, (RewardConfig JSON, VerifierConfig JSON);
out, ("ready", None) or ("error", why). Then per rollout: in, the task dict; out, ("ok", RewardOutcome fields)
or ("error", why). Tasks are scored on the main thread, where SIGALRM-based timeouts (math-verify) work.
"""

import dataclasses
import importlib
import logging
import os
from collections.abc import Callable
from multiprocessing.connection import Connection

from klear.gppo.config import RewardConfig
from klear.verifiers.config import VerifierConfig


def load_scorer(spec: str) -> Callable:
    """The function named by "module:function"."""
    module, sep, name = spec.partition(":")
    if not sep:
        raise ValueError(f"scorer {spec!r} is not of the form module:function")
    return getattr(importlib.import_module(module), name)


def main() -> None:
    reader, writer = Connection(os.dup(0), writable=False), Connection(os.dup(1), readable=False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a scorer's children must not hold the task pipe open
    os.close(devnull)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every parse timeout
    try:
        cfg_json, verifier_json = reader.recv()
        cfg = RewardConfig.model_validate_json(cfg_json)
        verifier = VerifierConfig.model_validate_json(verifier_json)
        scorer = load_scorer(cfg.scorer)
    except Exception as exc:  # noqa: BLE001 - reported to the pool, which raises it as a start-up failure
        writer.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    writer.send(("ready", None))
    while True:
        try:
            task = reader.recv()
        except EOFError:
            return
        try:
            writer.send(("ok", dataclasses.asdict(scorer(task, cfg, verifier))))
        except Exception as exc:  # noqa: BLE001 - a scorer bug scores this rollout as an error, the worker goes on
            writer.send(("error", f"{type(exc).__name__}: {exc}"[:500]))


if __name__ == "__main__":
    main()
