"""Config of the rl-filter stage. Defaults are the paper's filter (§3.2 data): a label-noise filter, not a
difficulty filter (difficulty is handled online by GPPO's zero-advantage filtering)."""

from __future__ import annotations

from typing import ClassVar, Literal

import pydantic

from klear.common.config import StageConfig
from klear.judge.config import JudgeConfig


class RlFilterConfig(StageConfig):
    preset_package: ClassVar[str] = "klear.rl_filter"

    task: Literal["auto", "math", "code"] = pydantic.Field(
        "auto", description="math: problems need an answer; code: tests; auto: tests make a problem code")
    # Paper, code: problems with fewer than 16 test cases are dropped (too few tests pass wrong programs).
    min_tests: int = pydantic.Field(16, ge=0, description="code problems with fewer test cases are dropped (few_tests)")
    # Paper: keep a code problem when more than half of the filter model's (DeepSeek-R1-0120) 16 samples pass
    # every test; keep a math problem when a majority of its samples verify. Strictly above: exactly 8 of 16 is out.
    keep_above: float = pydantic.Field(0.5, ge=0, lt=1, description="keep when the pass rate is strictly above this")
    samples_per_problem: int | None = pydantic.Field(
        16, ge=1, description="the first k filter-model samples (by index) count; null = all there are")
    min_samples: int = pydantic.Field(1, ge=1, description="fewer judged samples than this: dropped (no_samples / few_samples)")
    # Optional difficulty band, off by default (not in the paper): drop what is too easy or too hard.
    min_pass_rate: float | None = pydantic.Field(None, ge=0, le=1, description="drop below this pass rate (too_hard)")
    max_pass_rate: float | None = pydantic.Field(None, ge=0, le=1, description="drop above this pass rate (too_easy)")

    # Exact dedup and n-gram decontamination with curate's matching (klear.curate.matching).
    dedup: bool = pydantic.Field(True, description="drop exact duplicates (after normalization) of an earlier problem")
    decontaminate: bool = pydantic.Field(True, description="drop problems sharing an n-gram with a test set")
    ngram_size: int = pydantic.Field(9, ge=1, le=64, description="word n-gram length for decontamination")
    benchmark_field: str = pydantic.Field("problem", description="text field of benchmark items")

    batch_size: int = pydantic.Field(2048, ge=1, description="samples judged at a time")
    rows_per_shard: int = pydantic.Field(100_000, ge=1, description="rows per output Parquet file")
    judge: JudgeConfig = JudgeConfig()
