"""Config of the judge stage (and of the judge library that sft-data, rl-filter and evaluate use).

JudgeConfig is also the `judge` section each of those stages' configs embeds. A judge step in front of such a
stage judges with that section, which the stage hands over (settings_json: its own component resolves its preset
and overrides); the judge never reads another stage's config.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar, Literal

import pydantic

from klear.common.config import ConfigError, Provenance, StageConfig, load_config, with_provenance
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


def settings_json(config: JudgeConfig) -> str:
    """The judge settings a stage hands to a judge step: its config's `judge` section, as JSON (judge_config), with
    where the stage loaded it from (its preset, overrides and section), which the judge output's lineage records."""
    provenance = config.provenance.to_json() if config.provenance is not None else None
    return json.dumps({"judge": config.model_dump(mode="json"), "provenance": provenance}, sort_keys=True)


def judge_config(settings: str = "", preset: str = "", overrides: Sequence[str] = ()) -> JudgeConfig:
    """The settings a judge step judges with: those a stage handed over (`settings`: settings_json of its config's
    `judge` section; a bare section is taken too), else a judge preset (name or YAML path; "" = the defaults) with
    `key=value` overrides."""
    if not settings:
        return load_config(JudgeConfig, preset or None, list(overrides))
    if preset or overrides:
        # Overrides on top of handed settings would judge otherwise than the stage that reads the rows.
        raise ConfigError(f"judge settings: handed settings and a preset ({preset!r}) or overrides ({list(overrides)}) "
                          "exclude each other; set them in the handing stage's config (its judge.* keys)")
    try:
        handed = json.loads(settings)
    except ValueError:
        raise ConfigError(f"judge settings handed over are not a judge config: not JSON: {settings[:80]!r}") from None
    wrapped = isinstance(handed, dict) and set(handed) == {"judge", "provenance"}
    try:
        config = JudgeConfig.model_validate(handed["judge"] if wrapped else handed)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"judge settings handed over are not a judge config: {problems}") from None
    if wrapped and isinstance(handed["provenance"], dict):
        return with_provenance(config, Provenance.from_json(handed["provenance"]))
    return config


def work_area(run_root: str, name: str, samples: str, problems: str | None, input_digest: str) -> str:
    """The work area every slice and the merge of one judging use share, keyed by what it judges (the samples,
    the problems, their content digest); not by the run, so a new run judging the same samples finds every score
    an earlier one saved (the scores inside are kept per judge settings)."""
    from klear.common import kfp_io

    return kfp_io.work_location(run_root, f"judge-{name}" if name else "judge", {
        "samples": samples, "problems": problems, "inputs": input_digest})
