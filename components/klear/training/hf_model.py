"""Model folders and Trainer plumbing the training stages share: fetching a model, attention and
DeepSpeed choices, and finishing the published folder so it generates and stops like it trained."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from klear.common import lineage, model_card, storage
from klear.training.launch import LAUNCH_CONFIGS


class ModelInputError(ValueError):
    """A model input that cannot be trained from; the message names the URI and what is missing."""


def scratch_folder(stage: str, output: str, work_dir: str | None) -> Path:
    """The node's local working folder: `work_dir`, or one under $TMPDIR named after the output, so a retried
    pod finds what it left. One folder for all ranks of a node: a checkpoint is the union of what they write."""
    path = Path(work_dir) if work_dir else Path(tempfile.gettempdir()) / f"klear-{stage}-{hashlib.sha256(output.encode()).hexdigest()[:12]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def local_model(model: str, stack: contextlib.ExitStack) -> Path:
    """A local folder with the model: a published output (checksums verified) or a plain Hugging Face folder."""
    if storage.exists(storage.Uri.parse(model).join(storage.MANIFEST_NAME)):
        path, _ = stack.enter_context(storage.fetch_published(model))
    else:
        path = stack.enter_context(storage.localize(model))
    if not (path / "config.json").is_file():
        raise ModelInputError(f"{model}: no config.json; expected a Hugging Face model folder")
    check_weights(path, model)
    return path


def check_weights(path: Path, model: str) -> None:
    """Every safetensors file opens (header and sizes agree) and there are weights at all, so a corrupt or
    truncated download fails here naming the file, not deep inside model loading."""
    from safetensors import safe_open

    weights = sorted(path.glob("*.safetensors"))
    if not weights and not any(path.glob("*.bin")):
        raise ModelInputError(f"{model}: no weights (*.safetensors or *.bin) beside config.json")
    for file in weights:
        try:
            with safe_open(str(file), framework="numpy"):
                pass
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for every defect
            raise ModelInputError(f"{model}: {file.name} is not a readable safetensors file ({exc})") from exc


def resolve_attention(choice: str, packed: bool, flash_attn: bool, cuda: bool) -> str:
    """What attn_implementation 'auto' becomes: flash_attention_2 where flash-attn is installed (its varlen kernels
    take packed rows by their position ids); else flex_attention for packed rows on a CUDA device (transformers turns
    the position ids into a BlockMask of the document boundaries, masking_utils.flex_attention_mask, where sdpa gets
    a dense rows x L x L mask); else sdpa. Not flex on CPU: PyTorch has no flex_attention backward there. Padded
    rows (GPPO) keep sdpa: flex is only checked here for packed ones (tests/sft/test_attention.py)."""
    if choice != "auto":
        return choice
    if flash_attn:
        return "flash_attention_2"
    return "flex_attention" if packed and cuda else "sdpa"


def attention(choice: str, packed: bool = False) -> str:
    """attn_implementation on this machine (resolve_attention); `packed`: rows hold several samples told apart by
    their position ids (SFT's padding-free packing)."""
    if choice != "auto":
        return choice
    return resolve_attention(choice, packed, importlib.util.find_spec("flash_attn") is not None, has_accelerator())


def deepspeed_config(choice: str) -> str | None:
    """'' -> None, 'zero3' -> the shipped ZeRO-3 JSON, else a path that must exist."""
    if not choice:
        return None
    path = str(LAUNCH_CONFIGS / "zero3.json") if choice == "zero3" else choice
    if not Path(path).is_file():
        raise ModelInputError(f"DeepSpeed config not found: {choice}")
    return path


def has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available()


def launched_processes() -> int:
    """How many training processes the launcher started (WORLD_SIZE, set by torchrun, `accelerate launch` and
    Kubeflow's PyTorchJob; 1 when not launched): the one count the checkpoint checks and the batch layout use, before
    and after the Trainer sets up the process group (before it, accelerate's PartialState reports 1 under DeepSpeed
    on CPU, whatever the launch)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def finish_model_folder(final: Path, tokenizer: Any) -> None:
    """Tokenizer with the training template, and a config that generates with a cache and stops at the EOS."""
    tokenizer.save_pretrained(final)
    model_config = json.loads((final / "config.json").read_text())
    model_config["use_cache"] = True
    model_config["eos_token_id"] = tokenizer.eos_token_id
    (final / "config.json").write_text(json.dumps(model_config, indent=2))
    gen_path = final / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    gen.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    gen_path.write_text(json.dumps(gen, indent=2))


def remove_when_all_done(work: Path) -> None:
    """Delete the node's scratch folder once every rank is done with it."""
    from accelerate import PartialState

    state = PartialState()
    state.wait_for_everyone()
    if state.is_local_main_process:
        shutil.rmtree(work, ignore_errors=True)


def publish_trained(trainer: Any, tokenizer: Any, work: Path, output: str, report: dict[str, Any], stage: str,
                    markdown: str = "", inputs: dict[str, list[str]] | None = None, *,
                    made_from: lineage.RunLineage) -> None:
    """Gather the weights (ZeRO-3 shards too), finish the folder, add report.json, metrics.json, report.md and
    the TensorBoard logs, and publish it to `output` (manifest last) from rank 0, then its model card (README.md,
    outside the manifest: see klear.common.model_card). `inputs`: role ("model", "data") -> URIs; `made_from`: the
    run's inputs and config, the manifest's lineage."""
    final = work / "final"
    if trainer.is_world_process_zero():
        shutil.rmtree(final, ignore_errors=True)
    trainer.save_model(str(final))  # every rank takes part; rank 0 writes
    if not trainer.is_world_process_zero():
        return
    finish_model_folder(final, tokenizer)
    (final / "report.json").write_text(json.dumps(report, indent=2))
    (final / "metrics.json").write_text(json.dumps(report["metrics"], indent=2))
    if markdown:
        (final / "report.md").write_text(markdown)
    if (work / "logs").is_dir():
        shutil.copytree(work / "logs", final / "logs", dirs_exist_ok=True)
    (final / model_card.CARD_NAME).unlink(missing_ok=True)  # the trainer's own card: ours is written after
    storage.publish_dir(final, output, meta={"stage": stage, "global_step": trainer.state.global_step,
                                             "inputs": inputs or {}, "lineage": made_from.record()})
    model_card.write_after_publish(output)  # a card that cannot be written is a warning: the model is published
