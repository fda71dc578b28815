"""Math accuracy under several judging modes side by side (judge config `report_modes`).

The verdicts a run publishes are those of `verifier.math_mode`; each other mode listed judges the same math
samples again on its own workers, and only its counts reach the report. A gap between the modes is the part of a
gap to the paper's Table 1 that the judging rule explains.
"""

from __future__ import annotations

import atexit
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from klear.judge.config import JudgeConfig
from klear.judge.pool import Judge
from klear.judge.problems import Problem
from klear.judge.scoring import Judgement

__all__ = ["ModeComparison", "mode_config"]


def mode_config(config: JudgeConfig, mode: str) -> JudgeConfig:
    """`config` judging math in `mode`."""
    return config.model_copy(update={"verifier": config.verifier.model_copy(update={"math_mode": mode})})


class ModeComparison:
    """Counts of math samples per mode; the modes other than the run's own are judged here, on judges that start
    on the first batch and close in summary(), on close() or at exit."""

    def __init__(self, config: JudgeConfig):
        self.primary = config.verifier.math_mode
        modes = list(dict.fromkeys([self.primary, *config.report_modes])) if config.report_modes else [self.primary]
        self.judges = {m: Judge(mode_config(config, m)) for m in modes if m != self.primary}
        self.verdicts: dict[str, Counter[str]] = {m: Counter() for m in modes}
        if self.judges:
            atexit.register(self.close)

    def add(self, rows: Sequence[Mapping[str, Any]], problems: Sequence[Problem | None],
            judgements: Sequence[Judgement]) -> dict[str, dict[int, Judgement]]:
        """One batch: `judgements` are the run's own (primary mode). Returns the other modes' judgements of its
        math samples, by index in the batch."""
        math = [i for i, j in enumerate(judgements) if j.kind == "math"]
        self.verdicts[self.primary].update(judgements[i].verdict for i in math)
        out: dict[str, dict[int, Judgement]] = {}
        if not math or not self.judges:
            return out
        for mode, judge in self.judges.items():
            again = judge.judge([rows[i] for i in math], [problems[i] for i in math])
            self.verdicts[mode].update(j.verdict for j in again)
            out[mode] = dict(zip(math, again))
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per mode: samples, correct, accuracy, verdicts (the run's own mode first). Closes the judges."""
        self.close()
        out = {}
        for mode, verdicts in self.verdicts.items():
            n = sum(verdicts.values())
            out[mode] = {"samples": n, "correct": verdicts["correct"], "accuracy": verdicts["correct"] / n if n else None,
                         "verdicts": dict(verdicts.most_common())}
        return out

    def close(self) -> None:
        for judge in self.judges.values():
            judge.close()  # a closed Judge starts its workers again if used

    def __enter__(self) -> ModeComparison:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
