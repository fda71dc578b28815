"""The skeleton every training stage (sft, gppo) runs on; a stage supplies only what differs.

A stage module builds one `TrainingStage`: its name, config class, error type, three hooks (tokenizer,
dataset, trainer) and its report renderers. `TrainingStage.run` does the rest the same way for all:

    scratch folder -> local model -> tokenizer -> dataset (logged counts) -> trainer -> resume point
    -> train_resumable (checkpoints on object storage) -> report -> publish -> scratch cleanup

The launchers (`klear.training.launch`, `klear.training.trainjob`) and the KFP component bodies are
handed the spec, so `klear.training` never imports a stage: stages -> training -> common.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# Everything a training stage reads is local or on S3: no model hub look-ups (TRL's model card asks the hub).
# Set before transformers is imported, which reads it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from klear.common import lineage, storage, tracking  # noqa: E402
from klear.common.chat import END_OF_TURN  # noqa: E402
from klear.common.config import StageConfig  # noqa: E402
from klear.common.tokenizer import load_tokenizer  # noqa: E402
from klear.training import checkpoints, hf_model  # noqa: E402
from klear.training.fingerprint import run_fingerprint  # noqa: E402
from klear.training.hf_model import ModelInputError  # noqa: E402


class TrainingConfig(Protocol):
    """The fields of a stage's config the skeleton reads (SftConfig and GppoConfig have them)."""

    chat_template: str  # "model" | "qwen3"
    deepspeed: str
    resume: bool
    keep_checkpoints: int
    save_minutes: float

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class StageInputs:
    """What the skeleton hands to a stage's dataset and trainer hooks."""

    model: str  # the URI, for messages
    model_dir: Path  # the local copy
    data: list[str]
    config: Any
    tokenizer: Any
    work: Path  # the node's scratch folder
    stack: contextlib.ExitStack  # for what must live as long as training (reward workers)
    output: str = ""  # the URI the stage publishes to (names the tracker run)


@dataclass(frozen=True)
class Prepared:
    """A stage's trainer and how to finish its report once training is done."""

    trainer: Any
    # TrainOutput -> the stage's report parts: "metrics" (required); "training" (keys added to the common
    # training block); any other key is a block of its own (gppo's "history").
    finish: Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class TrainingStage:
    name: str  # the `klear` subcommand, the logger (klear.<name>), scratch folder and checkpoint meta
    config_class: type
    error: type[ModelInputError]  # raised for bad input, named after the stage
    load_tokenizer: Callable[[Path, str, Any], Any]  # (model_dir, model URI, config) -> tokenizer
    dataset: Callable[[StageInputs], tuple[Any, dict[str, Any]]]  # -> (dataset, counts: read, kept, skipped, ...)
    trainer: Callable[[StageInputs, Any], Prepared]  # (inputs, dataset) -> Prepared
    render_markdown: Callable[[dict[str, Any]], str]
    metric_items: Callable[[dict[str, Any]], list[tuple[str, float]]]

    def config(self, preset: str, overrides: list[str]) -> Any:
        """The stage's typed config from a preset name or YAML file plus key=value overrides."""
        from klear.common.config import load_config

        return load_config(self.config_class, preset, overrides)

    def run(self, model: str, data: list[str], output: str, config: Any, work_dir: str | None = None) -> dict[str, Any]:
        """Train `model` on `data`, publish the model and report to `output`; returns the report."""
        return run_stage(self, model, data, output, config, work_dir)


def run_stage(stage: TrainingStage, model: str, data: list[str], output: str, config: TrainingConfig,
              work_dir: str | None = None) -> dict[str, Any]:
    log = logging.getLogger(f"klear.{stage.name}")
    # What every manifest of the run records as its lineage: its inputs and its config (with the presets it was
    # loaded from), handed on to the checkpoints and the model's publish.
    made_from = lineage.RunLineage([model, *data], config if isinstance(config, StageConfig) else None)
    provenance = made_from.config.provenance if made_from.config is not None else None
    # Refused in the first seconds, before the model loads: a bad or unreachable output, one that is an input
    # (`--output` = `--model` would overwrite the base model) or a config file, a second run writing the same output.
    storage.check_writes([storage.Write("--output", output, stage.name),
                          *([storage.Write("--work-dir", work_dir, stage.name, published=False)] if work_dir else [])],
                         made_from.inputs, provenance.files if provenance is not None else ())
    if isinstance(config, tracking.TrackingSettings) and os.environ.get("RANK", "0") == "0":  # the rank that reports
        tracking.check_trackers(config)  # reachable, authorised, the experiment there
    with contextlib.ExitStack() as stack:
        if os.environ.get("RANK", "0") == "0":  # the rank that publishes holds the output for the whole run
            stack.enter_context(storage.claim_output(output, task=f"{stage.name} training"))
        work = hf_model.scratch_folder(stage.name, output, work_dir)
        fingerprint = run_fingerprint(model, data, config.model_dump(mode="json"))
        checkpoints.refuse_other_world_size(output, config.resume, bool(config.deepspeed))  # before the model loads
        model_dir = hf_model.local_model(model, stack)
        tokenizer = stage.load_tokenizer(model_dir, model, config)
        inputs = StageInputs(model, model_dir, list(data), config, tokenizer, work, stack, output)
        dataset, counts = stage.dataset(inputs)
        log.info("data: %d records, %d kept, skipped %s", counts["read"], counts["kept"], counts["skipped"])
        prepared = stage.trainer(inputs, dataset)
        trainer = prepared.trainer
        resume = checkpoints.resume_point(output, Path(trainer.args.output_dir), work, config.resume,
                                          bool(config.deepspeed), fingerprint)
        result, published = checkpoints.train_resumable(trainer, output, work, resume, config.keep_checkpoints,
                                                        stage.name, fingerprint, config.save_minutes, made_from=made_from)
        report = assemble_report(counts, trainer.state, step_of(resume), published, prepared.finish(result), config)
        hf_model.publish_trained(trainer, tokenizer, work, output, report, stage.name, stage.render_markdown(report),
                                 {"model": [model], "data": list(data)}, made_from=made_from)
        log.info("published the model to %s", output)
        if not work_dir:  # everything is on storage now; a failed run keeps its folder for a retry in the same pod
            hf_model.remove_when_all_done(work)
    return report


# --------------------------------------------------------------------------- tokenizer


def load_chat_tokenizer(model_dir: Path, model: str, chat_template: str, error: type[ModelInputError]) -> Any:
    """The model's tokenizer with the training chat template and the one EOS rule of all training stages:
    EOS = <|im_end|>, the end of turn SFT teaches and RL rollouts stop at; the pad token must differ from it.
    `chat_template`: 'qwen3' (the shipped template) or 'model' (the tokenizer's own, which must exist)."""
    tokenizer = load_tokenizer(model_dir, model, chat_template, error)
    if END_OF_TURN not in tokenizer.get_vocab():
        raise error(f"{model}: the vocabulary has no {END_OF_TURN} token, the end of turn the model must learn to emit "
                    "and rollouts stop at")
    # The pitfall: a base model's EOS (<|endoftext|>) never follows an assistant turn, so it never stops.
    tokenizer.eos_token = END_OF_TURN
    if tokenizer.pad_token is None or tokenizer.pad_token == END_OF_TURN:
        raise error(f"{model}: the tokenizer needs a pad token distinct from {END_OF_TURN}")
    return tokenizer


# --------------------------------------------------------------------------- report


def step_of(checkpoint: Path | None) -> int:
    """The optimizer step of a local Trainer checkpoint folder (`checkpoint-N`); 0 for none."""
    return int(checkpoint.name.split("-")[-1]) if checkpoint else 0


def assemble_report(counts: dict[str, Any], state: Any, resumed_from_step: int, published: list[int],
                    parts: dict[str, Any], config: TrainingConfig) -> dict[str, Any]:
    """data, training (common keys plus the stage's), the stage's own blocks, metrics, config."""
    parts = dict(parts)
    training = {"global_step": state.global_step, "max_steps": state.max_steps, "epochs": state.epoch,
                "resumed_from_step": resumed_from_step, "checkpoints_published": published, **parts.pop("training", {})}
    metrics = parts.pop("metrics")
    return {"data": counts, "training": training, **parts, "metrics": metrics, "config": config.model_dump(mode="json")}
