"""Config of the curate stage."""

from __future__ import annotations

import pydantic

from klear.common.config import StageConfig


class CurateConfig(StageConfig):
    preset_package = "klear.curate"

    ngram_size: int = pydantic.Field(9, ge=1, le=64, description="word n-gram length for decontamination")
    prompt_field: str = pydantic.Field("prompt", description="default prompt field of sources (per source: #prompt=...)")
    id_field: str = pydantic.Field("id", description="default id field; rows without one get <source>:<row>")
    benchmark_field: str = pydantic.Field("problem", description="text field of benchmark items")
    benchmark_id_field: str = pydantic.Field("id", description="id field of benchmark items")
    drop_short_matches: bool = pydantic.Field(
        True, description="drop prompts shorter than n words whose text occurs inside a benchmark item"
    )
    batch_size: int = pydantic.Field(4096, ge=1, description="prompts per worker batch")
    workers: int = pydantic.Field(
        0, ge=0, description="worker processes; 0 = one per core but one (the main process's); 1 = none: all in this "
        "process, on threads (one reads, parses and normalizes the next chunk, the main one matches and decides, one "
        "writes Parquet)",
    )
    rows_per_shard: int = pydantic.Field(500_000, ge=1, description="rows per output Parquet file")
    report_short_limit: int = pydantic.Field(1000, ge=0, description="short prompts listed by id in report.json")
    progress_seconds: float = pydantic.Field(10.0, gt=0, description="interval of progress log lines")
