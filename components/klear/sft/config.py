"""Config of the sft stage. Paper values in presets/paper.yaml; CPU values in presets/tiny.yaml."""

from __future__ import annotations

from typing import Literal

import pydantic

from klear.common.config import StageConfig
from klear.common.tracking import TrackingSettings


class SftConfig(StageConfig, TrackingSettings):
    """SFT settings; the tracking keys (report_to, tracking_uri, experiment, run_name, progress_seconds) are
    TrackingSettings' (klear/common/tracking.py)."""

    preset_package = "klear.sft"

    # Data
    max_length: int = pydantic.Field(32768, ge=16, description="tokens per packed row; longer samples are skipped")
    chat_template: Literal["model", "qwen3"] = pydantic.Field(
        "model", description="'model': the model's own template (must have {% generation %} markers); "
        "'qwen3': the shipped Qwen3 template with markers (base models ship a template without them)")
    packing: bool = pydantic.Field(True, description="best-fit-decreasing packing, padding-free, per-sample position ids")
    dataset_num_proc: int = pydantic.Field(1, ge=1, description="processes tokenizing the data")

    # Schedule (paper: peak 8e-5, cosine decay to a floor of 4e-5, 4 epochs)
    learning_rate: float = pydantic.Field(8e-5, gt=0, description="peak learning rate (paper: 8e-5)")
    min_learning_rate: float = pydantic.Field(4e-5, ge=0, description="floor of the cosine decay")
    warmup_ratio: float = pydantic.Field(0.0, ge=0, lt=1, description="share of the optimizer steps spent warming up")
    num_epochs: float = pydantic.Field(4, gt=0, description="passes over the data")
    per_device_batch_size: int = pydantic.Field(1, ge=1, description="packed rows per device per micro-step")
    gradient_accumulation_steps: int = pydantic.Field(
        1, ge=1, description="micro-steps per optimizer step when global_batch_size is 0")
    global_batch_size: int = pydantic.Field(
        0, ge=0, description="packed rows per optimizer step whatever the number of processes (gradient "
        "accumulation = global / (per_device_batch_size x processes)); 0: per_device x accumulation x processes")
    max_position_embeddings: int = pydantic.Field(
        0, ge=0, description="the trained model's declared context (config.json), what vLLM engines derive their "
        "length from; 0 keeps the base model's")
    weight_decay: float = pydantic.Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = pydantic.Field(1.0, gt=0, description="gradient clipping norm")
    seed: int = pydantic.Field(42, description="seed of initialisation and data order")

    # Numerics and kernels
    bf16: bool = pydantic.Field(True, description="bf16 training (GPU)")
    gradient_checkpointing: bool = pydantic.Field(True, description="recompute activations in the backward pass")
    attn_implementation: Literal["auto", "flash_attention_2", "flex_attention", "sdpa", "eager"] = pydantic.Field(
        "auto", description="'auto': flash_attention_2 when flash-attn is installed, else flex_attention for packed "
        "rows on a GPU (a block mask, no L x L one), else sdpa")
    use_liger_kernel: Literal["auto", "on", "off"] = pydantic.Field("auto", description="'auto': on when liger-kernel is installed")
    deepspeed: str = pydantic.Field(
        "", description="DeepSpeed config: 'zero3' (shipped), a JSON path, or '' for none (plain DDP / one process)")

    # Checkpoints on object storage
    save_steps: int = pydantic.Field(500, ge=1, description="checkpoint every N optimizer steps")
    save_minutes: float = pydantic.Field(30.0, ge=0, description="also checkpoint once this many minutes have passed "
                                         "since the last checkpoint (0: by save_steps only): a fault costs minutes")
    keep_checkpoints: int = pydantic.Field(2, ge=1, description="newest published checkpoints kept on storage")
    resume: bool = pydantic.Field(True, description="resume from the newest complete checkpoint under <output>/checkpoints")

    # Logging
    logging_steps: int = pydantic.Field(10, ge=1, description="log every N optimizer steps")

    @pydantic.model_validator(mode="after")
    def _floor_below_peak(self) -> SftConfig:
        if self.min_learning_rate > self.learning_rate:
            raise ValueError(f"min_learning_rate {self.min_learning_rate} exceeds learning_rate {self.learning_rate}")
        return self

    @pydantic.model_validator(mode="after")
    def _one_batch_rule(self) -> SftConfig:
        if self.global_batch_size and self.gradient_accumulation_steps != 1:
            raise ValueError(f"global_batch_size {self.global_batch_size} and gradient_accumulation_steps "
                             f"{self.gradient_accumulation_steps} both set: the accumulation follows from the global "
                             "batch; set one")
        return self


def accumulation_steps(config: SftConfig, processes: int) -> int:
    """Micro-steps per optimizer step on `processes` processes: global_batch_size / (per_device_batch_size x
    processes), so the optimizer sees the same batch at every node count (Hugging Face Trainer: a step is
    per_device_train_batch_size x processes x gradient_accumulation_steps rows); gradient_accumulation_steps when
    no global batch is set. ValueError when the global batch does not split evenly."""
    if not config.global_batch_size:
        return config.gradient_accumulation_steps
    per_micro_step = config.per_device_batch_size * processes
    if config.global_batch_size % per_micro_step:
        raise ValueError(f"global_batch_size {config.global_batch_size} does not split over {processes} processes x "
                         f"per_device_batch_size {config.per_device_batch_size}")
    return config.global_batch_size // per_micro_step
