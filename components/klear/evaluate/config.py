"""Config of the evaluate stage: the protocol (benchmarks, k, date windows), sampling, and the judge's settings."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar, Literal

import pydantic

from klear.common.config import StageConfig
from klear.evaluate.livecodebench import LCB_SYSTEM_MESSAGE
from klear.judge.config import JudgeConfig
from klear.sample.config import SampleConfig

__all__ = ["Benchmark", "EvaluateConfig", "MATH_TEMPLATES", "OfficialExtras", "PROTOCOL_SAMPLING_KEYS"]

# Sampling settings that change the distribution scored: samples taken under other values are another protocol.
PROTOCOL_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens")

# Math prompt templates by name; `math_template` may name one or give its own text with {problem}.
MATH_TEMPLATES = {
    # The released benchmark rows (benchmarks/aime24.qs.jsonl: one user turn, the problem alone) and RL prompts.
    "raw": "{problem}",
    # The common instruction for boxed answers (DeepSeek-R1's and Qwen3's evaluation recipes).
    "instructed": "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
}


class Benchmark(StageConfig):
    """One benchmark of the protocol. Math: the problems of the math sets whose `benchmark` field is its name.
    Code: the LiveCodeBench problems whose contest date lies in [start, end] (days, both ends included)."""

    kind: Literal["math", "code"]
    k: int = pydantic.Field(ge=1, description="samples per problem scored (avg@k); fewer is an error")
    title: str = pydantic.Field("", description="name shown in the report")
    start: dt.date | None = pydantic.Field(None, description="code: first contest day of the window")
    end: dt.date | None = pydantic.Field(None, description="code: last contest day of the window")

    @pydantic.model_validator(mode="after")
    def _window(self) -> Benchmark:
        if self.kind == "code":
            if self.start is None or self.end is None:
                raise ValueError("a code benchmark needs a date window: start and end (YYYY-MM-DD)")
            if self.start > self.end:
                raise ValueError(f"window start {self.start} is after its end {self.end}")
        elif self.start is not None or self.end is not None:
            raise ValueError("a math benchmark has no date window (its problems are the rows naming it)")
        return self

    def contains(self, day: dt.date) -> bool:
        assert self.start is not None and self.end is not None
        return self.start <= day <= self.end


class OfficialExtras(StageConfig):
    """The released inference script's extra sampling settings (benchmarks/inference.py; not in the paper's text):
    applied when enabled. Its 65,536 new tokens and 81,920 positions come with YaRN: the paper-64k preset's."""

    enabled: bool = pydantic.Field(False, description="apply the released inference script's sampling extras")
    top_k: int = pydantic.Field(20, ge=0, description="top_k of the released script")
    repetition_penalty: float = pydantic.Field(1.05, gt=0, description="repetition_penalty of the released script")
    seed: int = pydantic.Field(0, ge=0, description="seed of the released script")
    # 0 keeps sampling.max_model_len: a length past the model's positions needs the rope scaling that goes with it
    # (sampling.engine_kwargs.hf_overrides), which this switch does not add.
    max_model_len: int = pydantic.Field(0, ge=0, description="0 = keep sampling.max_model_len")


class EvaluateConfig(StageConfig):
    preset_package: ClassVar[str] = "klear.evaluate"

    benchmarks: dict[str, Benchmark] = pydantic.Field(min_length=1, description="the protocol, by benchmark name")
    only: list[str] = pydantic.Field(default_factory=list, description="score only these benchmarks ([] = all)")
    # Prompts sent when this stage samples (or prepares prompts for the sample stage). Code prompts follow
    # LiveCodeBench's generic template (klear.evaluate.livecodebench.lcb_prompt).
    math_template: str = pydantic.Field(
        MATH_TEMPLATES["instructed"],
        description="math prompt: raw (the problem alone, as the release's benchmark rows and RL prompts), instructed "
        "(+ 'Please reason step by step ... \\boxed{}'), or a template with {problem}")
    code_prompt: Literal["lcb", "lcb-2024"] = pydantic.Field(
        "lcb", description="code prompt: lcb (lcb_runner today, whose stdin instruction gained 'Ensure that when the "
        "python program runs, ... STDOUT.' on 2024-12-26) or lcb-2024 (the instruction before that)")
    code_system_prompt: str = pydantic.Field(
        LCB_SYSTEM_MESSAGE, description="system turn of code prompts: lcb_runner's generic one for chat models; '' = none")
    # n is ignored: each benchmark's k decides how many samples its problems get.
    sampling: SampleConfig = SampleConfig()
    official_extras: OfficialExtras = OfficialExtras()
    # Saved samples whose recorded sampling settings differ from the protocol: refuse (error) or report (warn).
    settings_check: Literal["error", "warn"] = pydantic.Field(
        "error", description="saved samples whose sampling settings differ from the protocol: refused (error) or "
        "reported (warn)")
    judge: JudgeConfig = JudgeConfig()
    plot_dpi: int = pydantic.Field(100, ge=50, le=300, description="resolution of the report's plots")
    max_listed: int = pydantic.Field(20, ge=1, description="problem ids quoted in an error or note")

    @pydantic.field_validator("math_template", mode="before")
    @classmethod
    def _named_template(cls, value: Any) -> Any:
        return MATH_TEMPLATES.get(value, value) if isinstance(value, str) else value

    @property
    def math_prompt(self) -> str:
        """The math template's name (raw, instructed), or "custom"."""
        return next((name for name, text in MATH_TEMPLATES.items() if text == self.math_template), "custom")

    @property
    def sampling_extras(self) -> str:
        """Which sampling settings: the paper's text only, or with the released inference script's extras."""
        return "release" if self.official_extras.enabled else "paper"

    @pydantic.model_validator(mode="after")
    def _extras_fit_the_model(self) -> EvaluateConfig:
        extras = self.official_extras
        overrides = self.sampling.engine_kwargs.get("hf_overrides") or {}
        scaled = any(key in overrides for key in ("rope_scaling", "rope_parameters"))
        if extras.enabled and extras.max_model_len > max(self.sampling.max_model_len, 0) and not scaled:
            raise ValueError(f"official_extras.max_model_len {extras.max_model_len} without rope scaling in "
                             "sampling.engine_kwargs.hf_overrides: vLLM refuses a length past the model's positions; "
                             "use the paper-64k preset (YaRN) or official_extras.max_model_len=0")
        return self

    @pydantic.model_validator(mode="after")
    def _known_names(self) -> EvaluateConfig:
        unknown = [name for name in self.only if name not in self.benchmarks]
        if unknown:
            raise ValueError(f"only: unknown benchmarks {unknown}; configured: {sorted(self.benchmarks)}")
        try:
            self.math_template.format(problem="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"math_template must use only {{problem}} (braces doubled): {exc}") from None
        return self

    def selected(self) -> dict[str, Benchmark]:
        """The benchmarks scored, in config order."""
        return {name: b for name, b in self.benchmarks.items() if not self.only or name in self.only}

    def sampling_for(self, k: int) -> SampleConfig:
        """The sample stage's config for a group of problems sampled k times: the protocol's settings, with the
        official extras when enabled."""
        update: dict[str, Any] = {"n": k}
        extras = self.official_extras
        if extras.enabled:
            update.update(top_k=extras.top_k, repetition_penalty=extras.repetition_penalty, seed=extras.seed)
            if extras.max_model_len:
                update["max_model_len"] = extras.max_model_len
        return SampleConfig.model_validate({**self.sampling.model_dump(), **update})

    def protocol_sampling(self) -> dict[str, Any]:
        """The settings saved samples must have been taken with (PROTOCOL_SAMPLING_KEYS)."""
        effective = self.sampling_for(1)
        return {key: getattr(effective, key) for key in PROTOCOL_SAMPLING_KEYS}
