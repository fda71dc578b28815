"""Real TRL training on the tiny model: labels, packing, the paper schedule, loss, EOS, published output."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler

from klear.common import lineage, storage
from klear.common.config import ConfigError, load_config
from klear.demo.generate import math_items
from klear.sft.config import SftConfig, accumulation_steps
from klear.sft.stage import build_dataset, load_tokenizer, make_trainer, training_arguments
from klear.training import checkpoints


@pytest.fixture(scope="module")
def packed_batch(tiny_model: str, demo_files: list[str], tiny_config: SftConfig,
                 tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("trainer")
    tok = load_tokenizer(Path(tiny_model), tiny_model, tiny_config)
    dataset, _ = build_dataset(demo_files, tok, tiny_config, work / "cache")
    trainer = make_trainer(Path(tiny_model), tok, dataset, training_arguments(tiny_config, work))
    batch = next(iter(trainer.get_train_dataloader()))
    rows = {tuple(ids): mask for ids, mask in zip(dataset["input_ids"], dataset["assistant_masks"])}
    return {"batch": batch, "rows": rows, "tokenizer": tok, "model": trainer.model}


def _segments(position_ids: torch.Tensor) -> list[slice]:
    starts = (position_ids == 0).nonzero().flatten().tolist() + [position_ids.numel()]
    return [slice(a, b) for a, b in zip(starts, starts[1:])]


def test_only_assistant_tokens_carry_labels(packed_batch: dict[str, Any]) -> None:
    batch, rows, tok = packed_batch["batch"], packed_batch["rows"], packed_batch["tokenizer"]
    ids, labels, pos = batch["input_ids"][0], batch["labels"][0], batch["position_ids"][0]
    segments = _segments(pos)
    assert len(segments) >= 2, "packing put several samples in one row"
    assert "attention_mask" not in batch, "padding-free: no padding, no attention mask"
    for seg in segments:
        mask = rows[tuple(ids[seg].tolist())]  # every packed sample is a whole training row, never cut
        expected = [t if m else -100 for t, m in zip(ids[seg].tolist(), mask)]
        assert labels[seg].tolist() == expected
        trained = tok.decode([t for t in labels[seg].tolist() if t != -100])
        assert trained.startswith("<think>") and trained.endswith("<|im_end|>")
        assert "<|im_start|>" not in trained and tok.decode(ids[seg]).startswith("<|im_start|>user\n")


def test_packed_and_unpacked_logits_match(packed_batch: dict[str, Any]) -> None:
    model, batch = packed_batch["model"].eval(), packed_batch["batch"]
    ids, pos = batch["input_ids"], batch["position_ids"]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        for seg in _segments(pos[0]):
            alone = model(input_ids=ids[:, seg], use_cache=False).logits[0]
            torch.testing.assert_close(packed[seg], alone, atol=1e-4, rtol=1e-4)
        # Without the per-sample position ids the samples would see each other: the check above can fail.
        segs = _segments(pos[0])
        leaky = model(input_ids=ids, use_cache=False).logits[0]
        assert not torch.allclose(leaky[segs[1]], packed[segs[1]], atol=1e-4)


def test_paper_preset_schedule(tmp_path: Path) -> None:
    config = load_config(SftConfig, "paper")
    args = training_arguments(config, tmp_path)
    assert (args.learning_rate, args.num_train_epochs, args.bf16, args.gradient_checkpointing) == (8e-5, 4, True, True)
    assert args.max_length == 32768 and args.packing and args.padding_free
    assert Path(args.deepspeed).name == "zero3.json"
    assert json.loads(Path(args.deepspeed).read_text())["zero_optimization"]["stage"] == 3
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=args.learning_rate)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=0, num_training_steps=100,
                              scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    lrs = []
    for _ in range(100):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(8e-5)
    assert lrs[50] == pytest.approx(6e-5, rel=0.02)  # cosine: half-way between peak and floor
    assert scheduler.get_last_lr()[0] == pytest.approx(4e-5)
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_the_paper_batch_is_the_same_at_every_node_count(tmp_path: Path) -> None:
    config = load_config(SftConfig, "paper")
    for processes, steps in ((8, 8), (16, 4), (64, 1)):  # 1, 2 and 8 nodes of 8 GPUs
        assert config.per_device_batch_size * processes * accumulation_steps(config, processes) == 64
        assert accumulation_steps(config, processes) == steps
    with pytest.raises(ValueError, match="global_batch_size 64 does not split over 48 processes"):
        accumulation_steps(config, 48)
    # The trainer takes it from the launched processes (WORLD_SIZE; one here).
    assert training_arguments(config, tmp_path).gradient_accumulation_steps == 64
    with pytest.raises(ConfigError, match="both set"):
        load_config(SftConfig, "paper", ["gradient_accumulation_steps=2"])


def test_the_trained_model_declares_the_context_the_config_gives_it(tiny_model: str, tmp_path: Path) -> None:
    """max_position_embeddings goes to the model through model_init_kwargs, and from there into the config.json it
    is saved with: what a vLLM engine derives its length from."""
    config = load_config(SftConfig, "tiny", ["max_position_embeddings=6144"])
    kwargs = training_arguments(config, tmp_path).model_init_kwargs
    model = AutoModelForCausalLM.from_pretrained(tiny_model, **kwargs)
    model.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["max_position_embeddings"] == 6144
    plain = training_arguments(load_config(SftConfig, "tiny"), tmp_path).model_init_kwargs
    assert "max_position_embeddings" not in plain  # 0: the base model's own


def test_loss_decreases_and_the_model_learns_to_stop(reference_run: dict[str, Any]) -> None:
    report, output = reference_run["report"], reference_run["output"]
    metrics = report["metrics"]
    assert metrics["final_loss"] < 0.5 * metrics["first_loss"]
    assert report["training"]["global_step"] == report["training"]["max_steps"] > 20
    model = AutoModelForCausalLM.from_pretrained(output).eval()
    tok = AutoTokenizer.from_pretrained(output)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == eos and model.generation_config.eos_token_id == eos
    torch.manual_seed(0)
    for item in math_items(5, random.Random(123)):  # unseen problems, sampled as evaluation samples (T 0.6, top-p 0.95)
        prompt = tok.apply_chat_template([{"role": "user", "content": item["problem"]}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)
        out = model.generate(**prompt, max_new_tokens=256, do_sample=True, temperature=0.6,
                             top_p=0.95)[0, prompt["input_ids"].shape[1]:]
        assert out[-1].item() == eos and len(out) < 256, tok.decode(out)
        assert tok.decode(out).startswith("<think>")


def test_published_output(reference_run: dict[str, Any]) -> None:
    output = reference_run["output"]
    manifest = storage.read_manifest(output)
    names = set(manifest.files)
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja",
            "report.json", "metrics.json"} <= names
    assert not any(name.startswith("checkpoints/") for name in names)
    report = json.loads((output / "report.json").read_text())
    assert report["data"]["read"] == 120 + 12 + 8 and report["data"]["skipped"] == {"no_assistant": 8}
    metrics = json.loads((output / "metrics.json").read_text())
    assert {"final_loss", "final_learning_rate", "final_grad_norm", "tokens_per_second"} <= set(metrics)
    assert metrics["tokens_per_second"] > 0
    # TensorBoard: loss, lr, grad norm and tokens/s as scalars.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [name for name in names if name.startswith("logs/") and "tfevents" in name]
    assert events
    acc = EventAccumulator(str(output / "logs")).Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "train/grad_norm", "train/tokens_per_second"} <= tags


def test_the_model_and_its_checkpoints_record_the_inputs_and_config_the_run_was_handed(
        reference_run: dict[str, Any], tiny_model: str, demo_files: list[str]) -> None:
    output = str(reference_run["output"])
    record = storage.read_manifest(output).meta["lineage"]
    assert [entry["uri"] for entry in record["inputs"]] == [lineage.location(uri) for uri in [tiny_model, *demo_files]]
    assert record["inputs"][0]["stage"] == "tiny-model" and all(entry["digest"] for entry in record["inputs"])
    assert record["config"] == reference_run["report"]["config"]
    assert record["preset"] == {"preset": "tiny", "bases": [], "overrides": []}
    steps = checkpoints.published_steps(output)
    assert steps, "the tiny preset saves every 10 steps: a checkpoint is published"
    checkpoint = storage.read_manifest(str(checkpoints.checkpoint_uri(output, steps[-1]))).meta["lineage"]
    assert checkpoint["inputs"] == record["inputs"] and checkpoint["config"] is None  # digested once, at the first
