"""Config of the sft-data stage. The paper's reasoning (§5.1.1) behind each default is next to it."""

from __future__ import annotations

from typing import ClassVar, Literal

import pydantic

from klear.common.config import StageConfig
from klear.judge.config import JudgeConfig

Policy = Literal["keep_all", "drop_incorrect_on_easy", "drop_incorrect"]


class SftDataConfig(StageConfig):
    preset_package: ClassVar[str] = "klear.sft_data"

    # Paper: incorrect teacher responses hurt on easy prompts but help on hard ones (they still show long,
    # exploratory reasoning), and most prompts of its sources are hard; it keeps every response. The other
    # two policies are the ablations: drop incorrect responses on easy prompts only, or everywhere.
    policy: Policy = pydantic.Field("keep_all", description="which teacher responses to keep, by correctness and difficulty")
    # Difficulty = the reference model's (paper: Qwen3-8B) pass rate on the prompt. The paper does not print
    # its cut-off; we call a prompt easy when the reference solves at least half of its k samples, i.e. when
    # a wrong teacher response is likelier to be noise than a hard problem's honest attempt.
    easy_threshold: float = pydantic.Field(0.5, ge=0, le=1, description="reference pass rate at or above which a prompt is easy")
    reference_samples: int = pydantic.Field(8, ge=1, description="k: the first k reference samples (by index) per prompt")
    # A prompt the reference model never answered (or that has no answer/tests) has no difficulty: "unknown",
    # which the policies treat as `unknown_as` (hard: keep its responses, as the paper does for most prompts).
    unknown_as: Literal["hard", "easy"] = pydantic.Field("hard", description="how the policy treats prompts of unknown difficulty")
    # Problems with neither an answer nor tests cannot be judged: their responses are kept unlabelled (and
    # counted) unless this is off.
    keep_unlabelled: bool = pydantic.Field(True, description="keep responses whose problem has no answer or tests")

    # Length filter at SFT's max_length, in tokens of the target tokenizer, on the conversation as SFT renders
    # it (chat template included). Without a tokenizer no length filter runs, and the report says so.
    max_length: int = pydantic.Field(32768, ge=16, description="SFT max_length: longer records are dropped")
    tokenizer: str = pydantic.Field("", description="URI of the target model/tokenizer folder; '' = no length filter")
    chat_template: Literal["model", "qwen3"] = pydantic.Field(
        "model", description="as SftConfig.chat_template: the tokenizer's own template, or the shipped Qwen3 one")

    batch_size: int = pydantic.Field(1024, ge=1, description="samples judged and tokenized at a time")
    rows_per_shard: int = pydantic.Field(100_000, ge=1, description="records per output Parquet file")
    judge: JudgeConfig = JudgeConfig()
