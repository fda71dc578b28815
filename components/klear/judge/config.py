"""Config of the judge stage (and of the judge library that sft-data, rl-filter and evaluate use)."""

from __future__ import annotations

from typing import ClassVar, Literal

import pydantic

from klear.common.config import StageConfig
from klear.verifiers.config import VerifierConfig

Task = Literal["auto", "math", "code"]


class JudgeConfig(StageConfig):
    preset_package: ClassVar[str] = "klear.judge"

    # auto: a problem with `tests` is code, one with an `answer` is math, one with neither is not judged (counted).
    task: Task = pydantic.Field("auto", description="auto (per problem), math or code")
    # Worker processes with hard wall-clock budgets: a stuck judgement is killed, counted, and the rest goes on.
    workers: int = pydantic.Field(0, ge=0, description="judge processes per task kind; 0 = one per core")
    math_budget_s: float = pydantic.Field(20.0, gt=0, description="wall clock for judging one math sample")
    code_budget_s: float = pydantic.Field(600.0, gt=0, description="wall clock for running one program on all its tests")
    scorer: str = pydantic.Field("klear.judge.scoring:score_task",
                                 description="module:function scoring one task in a worker (tests plug in others)")
    # Resume: scores are saved under the output every chunk, keyed by (id, sample) and a fingerprint of the
    # response, the reference and these settings; a restart judges only what is missing.
    chunk_size: int = pydantic.Field(2048, ge=1, description="samples judged (and saved for resume) at a time")
    resume: bool = pydantic.Field(True, description="reuse the scores a crashed run saved under the output")
    rows_per_shard: int = pydantic.Field(100_000, ge=1, description="rows per output Parquet file")
    progress_seconds: float = pydantic.Field(30.0, gt=0, description="interval of progress log lines")
    # Math accuracy under each of these modes, side by side in the report (the verdicts are verifier.math_mode's):
    # [strict, official] shows how much of a gap to the paper's Table 1 is the judging rule.
    report_modes: list[Literal["strict", "official"]] = pydantic.Field(
        default_factory=list, description="math modes whose accuracy the report shows side by side ([] = only verifier.math_mode)")
    verifier: VerifierConfig = VerifierConfig()


def work_area(run_root: str, name: str, samples: str, problems: str | None, benchmark_uris: list, config_of: str,
              task: str, input_digest: str) -> str:
    """The work area every slice and the merge of one judging use share, keyed by what it judges (the samples,
    the problems, their content digest) and as which stage; not by the run, so a new run judging the same
    samples finds every score an earlier one saved (the scores inside are kept per judge settings)."""
    from klear.common import kfp_io

    return kfp_io.work_location(run_root, f"judge-{name}" if name else "judge", {
        "samples": samples, "problems": problems, "benchmarks": list(benchmark_uris), "config_of": config_of,
        "task": task, "inputs": input_digest})
