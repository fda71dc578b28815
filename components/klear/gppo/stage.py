"""Entry point of the gppo stage: RL with GPPO (or PPO-clip / clip-higher / CISPO for ablations).

    klear gppo --model URI --data URI [URI ...] --output URI [--config math|code|tiny-math|tiny-code|FILE] [--set KEY=VALUE]
    accelerate launch --config_file components/common/launch_configs/zero3.yaml -m klear.cli gppo ...   (many GPUs/nodes)

The paper runs it twice: math RL from the SFT model (`--config math`), then code RL from the math
RL model (`--config code`). Rollouts are scored by the shared verifiers in worker processes with
hard time budgets. Publishes to `--output`:

    model.safetensors, config.json, tokenizer files, generation_config.json
    report.json     records read/kept/skipped, steps, resume point, fill ratios, reward timeouts, final metrics
    metrics.json    the final figures (the KFP component logs these)
    logs/           TensorBoard event files (reward, accuracy, clip fractions, entropy, lengths, grad norm, ...)

Checkpoints go to `<output>/checkpoints/step-N` every `save_steps`, with the refill-stream position;
a restarted run resumes from the newest complete one.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

# Everything this stage reads is local or on S3: no model hub look-ups.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from klear.training import checkpoints, hf_model  # noqa: E402
from klear.gppo.config import GppoConfig  # noqa: E402
from klear.gppo.data import load_rows  # noqa: E402
from klear.gppo.metrics import HistoryLogger, summarize  # noqa: E402
from klear.gppo.report import render_markdown  # noqa: E402

log = logging.getLogger("klear.gppo")


class GppoError(hf_model.ModelInputError):
    """Bad input to the stage (tokenizer without a chat template, no usable prompts); the message says which."""


def load_tokenizer(model_dir: Path, model: str, config: GppoConfig) -> Any:
    """The model's tokenizer; rollouts end at <|im_end|> (what SFT taught the model to emit)."""
    from transformers import AutoTokenizer

    from klear.common.chat import END_OF_TURN, QWEN3_CHAT_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if config.chat_template == "qwen3":
        tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    elif not tokenizer.chat_template:
        raise GppoError(f"{model}: the tokenizer has no chat template; ship one or use --set chat_template=qwen3")
    if END_OF_TURN in tokenizer.get_vocab():
        tokenizer.eos_token = END_OF_TURN
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        raise GppoError(f"{model}: the tokenizer needs a pad token distinct from its EOS {tokenizer.eos_token}")
    return tokenizer


def build_dataset(data: list[str], tokenizer: Any, config: GppoConfig) -> tuple[Any, dict[str, Any]]:
    import datasets

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    rows, counts = load_rows(data, config.task, prompt_tokens, config.max_prompt_length)
    if len(rows) < config.prompts_per_step:
        raise GppoError(f"{len(rows)} usable {config.task} prompts in {', '.join(data)} (read {counts['read']}, skipped "
                        f"{counts['skipped']}, e.g. {counts['skipped_examples'][:3]}); one step needs prompts_per_step="
                        f"{config.prompts_per_step}")
    return datasets.Dataset.from_list(rows), counts


def make_trainer(model_dir: Path, tokenizer: Any, dataset: Any, config: GppoConfig, work: Path, pool: Any) -> Any:
    from accelerate import PartialState

    from klear.gppo.trainer import GppoTrainer, VerifierReward, grpo_arguments

    args = grpo_arguments(config, work / "trainer", PartialState().num_processes, use_cpu=not hf_model.has_accelerator(),
                          deepspeed=hf_model.deepspeed_config(config.deepspeed),
                          attn_implementation=hf_model.attention(config.attn_implementation))
    return GppoTrainer(model=str(model_dir), args=args, train_dataset=dataset, processing_class=tokenizer,
                       gppo=config, reward=VerifierReward(pool, config.task))


def run(model: str, data: list[str], output: str, config: GppoConfig, work_dir: str | None = None) -> dict[str, Any]:
    """Train `model` with RL on `data`, publish the model and report to `output`; returns the report."""
    from klear.gppo.rewards import RewardPool

    with contextlib.ExitStack() as stack:
        work = hf_model.scratch_folder("gppo", output, work_dir)
        model_dir = hf_model.local_model(model, stack)
        tokenizer = load_tokenizer(model_dir, model, config)
        dataset, counts = build_dataset(data, tokenizer, config)
        log.info("data: %d records, %d kept, skipped %s", counts["read"], counts["kept"], counts["skipped"])
        pool = stack.enter_context(RewardPool(config.reward, config.verifier))
        trainer = make_trainer(model_dir, tokenizer, dataset, config, work, pool)
        resume = checkpoints.resume_point(output, Path(trainer.args.output_dir), work, config.resume, bool(config.deepspeed))
        history = HistoryLogger()
        trainer.add_callback(history)
        result, published = checkpoints.train_resumable(trainer, output, work, resume, config.keep_checkpoints, "gppo")
        report = {
            "data": counts,
            "training": {"global_step": trainer.state.global_step, "max_steps": trainer.state.max_steps,
                         "resumed_from_step": int(resume.name.split("-")[-1]) if resume else 0,
                         "checkpoints_published": published, "reward_timeouts": trainer.reward_timeouts,
                         "fill_ratio_min": trainer.fill_ratio_min},
            "history": history.rows,
            "metrics": {**summarize(history.rows, result.metrics), "reward_timeouts": float(trainer.reward_timeouts)},
            "config": config.model_dump(mode="json"),
        }
        hf_model.publish_trained(trainer, tokenizer, work, output, report, "gppo", render_markdown(report))
        if not work_dir:  # everything is on storage now; a failed run keeps its folder for a retry in the same pod
            hf_model.remove_when_all_done(work)
    return report


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from klear.common.cli import add_training_stage

    add_training_stage(subparsers, "gppo", help="RL with GPPO (math or code; ablation losses), resumable", description=__doc__,
                       model_help="policy to start from: the SFT (or math RL) output",
                       data_help="RL prompts: JSONL/Parquet or a published output",
                       default_preset="math", config_class=GppoConfig, run=run)
