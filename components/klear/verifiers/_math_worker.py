"""Entry point of a math verification worker process: `python -m klear.verifiers._math_worker`.

Started by MathVerifier's WorkerPool (klear.common.workers): the setup payload is math-verify's timeout in whole
seconds; each item is (gold, answer, boxed), answered with math-verify's verdict, or (gold, whole response, None)
(math_mode official), answered with (verdict, the answer math-verify extracted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from klear.common.workers import serve
from klear.verifiers.math_verifier import judge, judge_official


def make_judge(timeout: int) -> Callable[[tuple[str, str, bool | None]], bool | tuple[bool, str | None]]:
    """The handler of this worker; math-verify is imported here, so the first item is not charged for it."""
    logging.disable(logging.WARNING)  # math-verify logs every parse timeout
    import math_verify  # noqa: F401

    def handle(item: tuple[str, str, bool | None]) -> bool | tuple[bool, str | None]:
        gold, answer, boxed = item
        if boxed is None:
            return judge_official(gold, answer, timeout)
        return judge(gold, answer, boxed, timeout)

    return handle


if __name__ == "__main__":
    serve(make_judge)
