"""Entry point of the sft stage: long-CoT supervised fine-tuning on TRL's SFTTrainer.

    klear sft --model URI --data URI [URI ...] --output URI [--config paper|tiny|FILE] [--set KEY=VALUE]
    accelerate launch --config_file components/klear/training/launch_configs/zero3.yaml -m klear.cli sft ...   (many GPUs/nodes)

Trains on the assistant turns only (reasoning in <think>...</think> and the answer, up to and
including <|im_end|>, the EOS), packs samples padding-free with per-sample position ids, and
publishes to `--output`:

    model.safetensors, config.json, tokenizer files, chat_template.jinja, generation_config.json
    report.json     records read/kept/skipped (with reasons), steps, resume point, final metrics
    metrics.json    final loss, lr, grad norm, tokens/s (the KFP component logs these)
    logs/           TensorBoard event files

Checkpoints go to `<output>/checkpoints/step-N` every `save_steps`; a restarted run resumes from
the newest complete one (see klear/training/checkpoints.py). The run itself is the shared training
skeleton (klear/training/stage.py); this module supplies the tokenizer checks, dataset and trainer.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from klear.common.chat import END_OF_TURN
from klear.sft.config import SftConfig, accumulation_steps
from klear.sft.data import encode_example, iter_conversations
from klear.sft.report import metric_items, render_markdown
from klear.training import hf_model
from klear.training.hf_model import ModelInputError

# First: the skeleton sets HF_HUB_OFFLINE before anything imports transformers.
from klear.training.stage import Prepared, StageInputs, TrainingStage, load_chat_tokenizer


class SftError(ModelInputError):
    """Bad input to the stage (model without tokenizer or template, no trainable records); the message says which."""


# --------------------------------------------------------------------------- inputs


def load_tokenizer(model_dir: Path, model: str, config: SftConfig) -> Any:
    """The training tokenizer (template, EOS = <|im_end|>: the skeleton's rule), plus what assistant-only loss
    needs: {% generation %} markers in the template, and <|im_end|> inside the assistant mask."""
    from trl.chat_template_utils import has_generation_markers, is_chat_template_stop_token_trained

    tokenizer = load_chat_tokenizer(model_dir, model, config.chat_template, SftError)
    if not has_generation_markers(tokenizer.chat_template):
        raise SftError(f"{model}: the chat template has no {{% generation %}} markers, so the assistant's tokens cannot be "
                       "told apart; use --set chat_template=qwen3")
    if not is_chat_template_stop_token_trained(tokenizer):
        raise SftError(f"{model}: the chat template leaves {END_OF_TURN} outside the assistant mask; the model would never stop")
    return tokenizer


def build_dataset(data: list[str], tokenizer: Any, config: SftConfig, cache_dir: Path) -> tuple[Any, dict[str, Any]]:
    """Tokenized, filtered training rows (input_ids, assistant_masks) and the counts for the report."""
    import datasets

    # The generator's cache is keyed on the URIs, not on their content: never reuse one from an earlier run.
    shutil.rmtree(cache_dir, ignore_errors=True)
    # Explicit features: an empty source is then an empty dataset (counted, refused below), not a schema error.
    features = datasets.Features({"where": datasets.Value("string"), "conversation": datasets.Value("string")})
    try:
        rows = datasets.Dataset.from_generator(_conversations, gen_kwargs={"uris": list(data)}, features=features,
                                               cache_dir=str(cache_dir))
    except datasets.exceptions.DatasetGenerationError as exc:
        # The reader's own error names the file and line (or the URI); datasets wraps it in a generic one.
        cause = exc.__cause__
        if isinstance(cause, (ValueError, OSError)):
            raise SftError(str(cause)) from cause
        raise
    except ValueError as exc:  # datasets refuses a generator that yields nothing; look again only on this path
        if next(iter_conversations(list(data)), None) is None:
            raise SftError(f"no records in {', '.join(data)}") from exc
        raise
    encoded = rows.map(encode_example_row, fn_kwargs={"tokenizer": tokenizer, "max_length": config.max_length},
                       num_proc=config.dataset_num_proc if len(rows) > 1000 else None, remove_columns=["conversation"],
                       desc="tokenizing")
    reasons = encoded["skip"]
    skipped = Counter(r for r in reasons if r)
    examples = [w for w, r in zip(encoded["where"], reasons) if r][:20]
    kept = encoded.filter(lambda skip: not skip, input_columns="skip")
    counts = {"read": len(reasons), "kept": len(kept), "skipped": dict(sorted(skipped.items())),
              "skipped_examples": examples, "tokens": int(sum(kept["length"]))}  # lengths only: never all ids in memory
    kept = kept.select_columns(["input_ids", "assistant_masks"])
    if len(kept) == 0:
        raise SftError(f"no trainable records in {', '.join(data)}: read {counts['read']}, skipped {counts['skipped']} "
                       f"(max_length {config.max_length})")
    return kept, counts


def _conversations(uris: list[str]):
    for where, conversation in iter_conversations(uris):
        yield {"where": where, "conversation": conversation}


def encode_example_row(row: dict[str, Any], tokenizer: Any, max_length: int) -> dict[str, Any]:
    return encode_example(tokenizer, row["conversation"], max_length)


# --------------------------------------------------------------------------- training


def training_arguments(config: SftConfig, work: Path) -> Any:
    from trl import SFTConfig

    liger = config.use_liger_kernel == "on" or (
        config.use_liger_kernel == "auto" and importlib.util.find_spec("liger_kernel") is not None)
    return SFTConfig(
        output_dir=str(work / "trainer"),
        num_train_epochs=config.num_epochs,
        per_device_train_batch_size=config.per_device_batch_size,
        gradient_accumulation_steps=accumulation_steps(config, hf_model.launched_processes()),
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine_with_min_lr",
        # As a rate: `min_lr` reads optimizer.defaults, which DeepSpeed's ZeRO optimizer lacks.
        lr_scheduler_kwargs={"min_lr_rate": config.min_learning_rate / config.learning_rate},
        # transformers 5 has no warmup_ratio: a warmup_steps below 1 is read as a fraction of the total steps, and
        # SftConfig keeps warmup_ratio < 1, so this is always the ratio.
        warmup_steps=config.warmup_ratio,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        seed=config.seed,
        bf16=config.bf16,
        gradient_checkpointing=config.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if config.gradient_checkpointing else None,
        # Keys of the model's config set here are saved with it: max_position_embeddings declares the context the
        # trained model's engines may use (RoPE itself does not change).
        model_init_kwargs={"dtype": "bfloat16" if config.bf16 else "float32",
                           "attn_implementation": hf_model.attention(config.attn_implementation, packed=config.packing),
                           "use_cache": False,
                           **({"max_position_embeddings": config.max_position_embeddings}
                              if config.max_position_embeddings else {})},
        use_liger_kernel=liger,
        deepspeed=hf_model.deepspeed_config(config.deepspeed),
        max_length=config.max_length,
        packing=config.packing,
        packing_strategy="bfd",
        padding_free=config.packing,
        # The rows carry TRL's `assistant_masks` already, so labels are built from them: assistant-only loss
        # without a second tokenization (TRL's own flag expects untokenized conversations).
        assistant_only_loss=False,
        eos_token=END_OF_TURN,
        dataset_num_proc=config.dataset_num_proc,
        logging_steps=config.logging_steps,
        # TensorBoard is added by hand, to write into our own logs/ folder; MLflow and W&B by klear.common.tracking
        # (transformers' callbacks with one naming scheme and the run kept across restarts).
        report_to="none",
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,
        disable_tqdm=True,  # a progress line every progress_seconds instead (klear.common.tracking)
        dataloader_num_workers=0,
        # Without an accelerator, several processes must still form one (gloo) process group, not run alone.
        use_cpu=not hf_model.has_accelerator(),
    )


def make_trainer(model_dir: Path, tokenizer: Any, dataset: Any, args: Any) -> Any:
    """TRL's SFTTrainer on the prepared rows; the model is loaded from its folder under `args`
    (so ZeRO-3 partitions it while loading)."""
    from trl import SFTTrainer

    return SFTTrainer(model=str(model_dir), args=args, train_dataset=dataset, processing_class=tokenizer)


def _dataset(inputs: StageInputs) -> tuple[Any, dict[str, Any]]:
    cache = inputs.work / "datasets" / f"rank-{os.environ.get('RANK', '0')}"
    return build_dataset(inputs.data, inputs.tokenizer, inputs.config, cache)


def _trainer(inputs: StageInputs, dataset: Any) -> Prepared:
    from klear.common import tracking
    from klear.sft.metrics import ThroughputLogger, packing_efficiency, summarize

    args = training_arguments(inputs.config, inputs.work)  # before the model: it switches on ZeRO-3's partitioned init
    trainer = make_trainer(inputs.model_dir, inputs.tokenizer, dataset, args)
    throughput = ThroughputLogger(packing_efficiency(trainer.train_dataset, inputs.config.max_length, inputs.config.packing))
    throughput.install(trainer)
    tracking.install(trainer, inputs.config, "sft", inputs.output, inputs.work / "logs")
    return Prepared(trainer, lambda result: {"metrics": summarize(throughput.history, result.metrics)})


STAGE = TrainingStage(name="sft", config_class=SftConfig, error=SftError, load_tokenizer=load_tokenizer,
                      dataset=_dataset, trainer=_trainer, render_markdown=render_markdown, metric_items=metric_items)


def run(model: str, data: list[str], output: str, config: SftConfig, work_dir: str | None = None) -> dict[str, Any]:
    """Fine-tune `model` on `data`, publish the model and report to `output`; returns the report."""
    return STAGE.run(model, data, output, config, work_dir)


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from klear.common.cli import add_training_stage

    add_training_stage(subparsers, STAGE.name, help="long-CoT SFT on TRL (assistant-only loss, packing, resumable)",
                       description=__doc__, model_help="base model: a Hugging Face folder (path, file://, s3://)",
                       data_help="SFT records: JSONL/Parquet or a published output",
                       default_preset="paper", config_class=SftConfig, run=run)
