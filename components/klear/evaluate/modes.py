"""Math benchmark scores under the other judging modes of `judge.report_modes` (pure): the same chosen samples,
another verdict each, pass@1 ± stderr per benchmark, shown beside the run's own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from klear.evaluate.benchmarks import BenchmarkSet
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.metrics import benchmark_scores
from klear.evaluate.scoring import Selection

__all__ = ["mode_scores"]


def mode_scores(selection: Selection, bench: BenchmarkSet, config: EvaluateConfig,
                correct: Mapping[tuple[str, int], bool]) -> dict[str, dict[str, Any]]:
    """Per sampled math benchmark: pass@1 and its stderr when each chosen sample's correctness is `correct`."""
    out = {}
    for name in selection.sampled:
        protocol = config.benchmarks[name]
        if protocol.kind != "math":
            continue
        counts = [sum(correct.get((pid, i), False) for i in selection.chosen[pid][: protocol.k])
                  for pid in bench.members[name]]
        block = benchmark_scores(counts, protocol.k)
        out[name] = {"pass@1": block["pass@1"], "stderr": block["stderr"]}
    return out
