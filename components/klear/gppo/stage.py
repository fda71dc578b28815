"""Entry point of the gppo stage: RL with GPPO (or PPO-clip / clip-higher / CISPO for ablations).

    klear gppo --model URI --data URI [URI ...] --output URI [--config math|code|tiny-math|tiny-code|FILE] [--set KEY=VALUE]
    accelerate launch --config_file components/klear/training/launch_configs/zero3.yaml -m klear.cli gppo ...   (many GPUs/nodes)

The paper runs it twice: math RL from the SFT model (`--config math`), then code RL from the math
RL model (`--config code`). Rollouts are scored by the shared verifiers in worker processes with
hard time budgets. Publishes to `--output`:

    model.safetensors, config.json, tokenizer files, generation_config.json
    report.json     records read/kept/skipped, steps, resume point, fill ratios, reward timeouts, final metrics
    metrics.json    the final figures (the KFP component logs these)
    logs/           TensorBoard event files (reward, accuracy, clip fractions, entropy, lengths, grad norm, ...)

Checkpoints go to `<output>/checkpoints/step-N` every `save_steps`, with the refill-stream position;
a restarted run resumes from the newest complete one. The run itself is the shared training skeleton
(klear/training/stage.py); this module supplies the dataset, the reward workers and the trainer.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from klear.gppo.config import GppoConfig
from klear.gppo.data import load_rows
from klear.gppo.report import metric_items, render_markdown
from klear.training import hf_model

# First: the skeleton sets HF_HUB_OFFLINE before anything imports transformers.
from klear.training.stage import Prepared, StageInputs, TrainingStage, load_chat_tokenizer


class GppoError(hf_model.ModelInputError):
    """Bad input to the stage (tokenizer without a chat template, no usable prompts); the message says which."""


def load_tokenizer(model_dir: Path, model: str, config: GppoConfig) -> Any:
    """The training tokenizer: chat template and EOS = <|im_end|> (what SFT taught the model to emit, where
    rollouts stop), by the skeleton's one rule."""
    return load_chat_tokenizer(model_dir, model, config.chat_template, GppoError)


def build_dataset(data: list[str], tokenizer: Any, config: GppoConfig) -> tuple[Any, dict[str, Any]]:
    """The usable prompts of the task (with answer or tests) and the counts for the report."""
    import datasets

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    rows, counts = load_rows(data, config.task, prompt_tokens, config.max_prompt_length, config.prompt_truncation)
    if len(rows) < config.prompts_per_step:
        raise GppoError(f"{len(rows)} usable {config.task} prompts in {', '.join(data)} (read {counts['read']}, skipped "
                        f"{counts['skipped']}, e.g. {counts['skipped_examples'][:3]}); one step needs prompts_per_step="
                        f"{config.prompts_per_step}")
    return datasets.Dataset.from_list(rows), counts


def make_trainer(model_dir: Path, tokenizer: Any, dataset: Any, config: GppoConfig, work: Path, pool: Any) -> Any:
    from klear.gppo.trainer import GppoTrainer, VerifierReward, grpo_arguments

    args = grpo_arguments(config, work / "trainer", hf_model.launched_processes(), use_cpu=not hf_model.has_accelerator(),
                          deepspeed=hf_model.deepspeed_config(config.deepspeed),
                          attn_implementation=hf_model.attention(config.attn_implementation), prompts=len(dataset))
    return GppoTrainer(model=str(model_dir), args=args, train_dataset=dataset, processing_class=tokenizer,
                       gppo=config, reward=VerifierReward(pool, config.task))


def _dataset(inputs: StageInputs) -> tuple[Any, dict[str, Any]]:
    return build_dataset(inputs.data, inputs.tokenizer, inputs.config)


def _trainer(inputs: StageInputs, dataset: Any) -> Prepared:
    from klear.common import tracking
    from klear.gppo.metrics import HistoryLogger, summarize
    from klear.gppo.reward_command import ROLLOUT_LOG
    from klear.gppo.rewards import RewardPool
    from klear.gppo.validation import Validation

    config = inputs.config
    pool = inputs.stack.enter_context(RewardPool(config.reward, config.verifier))
    trainer = make_trainer(inputs.model_dir, inputs.tokenizer, dataset, config, inputs.work, pool)
    if trainer.is_world_process_zero():  # published with the TensorBoard logs, kept in every checkpoint with them
        trainer.verifier_reward.log_to(inputs.work / ROLLOUT_LOG, config.rollout_log)
    history = HistoryLogger()
    trainer.add_callback(history)
    tracking.install(trainer, config, "gppo", inputs.output, inputs.work / "logs")
    validation = None
    if config.val_data:  # after the trackers: its step-0 figures go to the run they open
        validation = Validation(trainer, config.val_data, config.val_config, config.val_every, inputs.work, inputs.tokenizer,
                                config.val_overrides)
        trainer.add_callback(validation)

    def finish(result: Any) -> dict[str, Any]:
        return {"training": {"reward_timeouts": trainer.reward_timeouts, "fill_ratio_min": trainer.fill_ratio_min},
                "history": history.rows, **({"validation": validation.history} if validation else {}),
                "metrics": {**summarize(history.rows, result.metrics), "reward_timeouts": float(trainer.reward_timeouts)}}

    return Prepared(trainer, finish)


STAGE = TrainingStage(name="gppo", config_class=GppoConfig, error=GppoError, load_tokenizer=load_tokenizer,
                      dataset=_dataset, trainer=_trainer, render_markdown=render_markdown, metric_items=metric_items)


def run(model: str, data: list[str], output: str, config: GppoConfig, work_dir: str | None = None) -> dict[str, Any]:
    """Train `model` with RL on `data`, publish the model and report to `output`; returns the report."""
    return STAGE.run(model, data, output, config, work_dir)


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from klear.common.cli import add_training_stage

    add_training_stage(subparsers, STAGE.name, help="RL with GPPO (math or code; ablation losses), resumable", description=__doc__,
                       model_help="policy to start from: the SFT (or math RL) output",
                       data_help="RL prompts: JSONL/Parquet or a published output",
                       default_preset="math", config_class=GppoConfig, run=run)
