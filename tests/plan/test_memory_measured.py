"""`klear plan`'s memory formulas (klear/plan/memory.py) against what PyTorch, transformers and TRL hold, measured
on CPU.

Fast: the storages one Qwen3 decoder layer saves for its backward (fp32 and bf16, with and without a mask) against
layer_activation_bytes; the peak of TRL's fused LM head against loss_head_bytes; TRL's padding-free collator and the
masks it leads to against attention_bytes. Slow: SFT and the GPPO actor trained by the project's own trainers in fresh
processes (benchmarks/bench_plan_memory.py: the peak of live tensor bytes) against the plan's estimate for the same
settings, within 25 %, with and without gradient checkpointing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import bench_plan_memory as bench
from klear.plan import memory, shapes

# Every width differs (hidden, query and KV projections, MLP), so each term of the count shows.
WIDTHS = {"hidden_size": 96, "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32}
DTYPES = {"float32": (torch.float32, 4), "bfloat16": (torch.bfloat16, 2)}


def qwen3(dtype: torch.dtype, layers: int = 2) -> Any:
    """A randomly initialised transformers Qwen3 with sdpa attention, in training mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=256, num_hidden_layers=layers, use_cache=False, attn_implementation="sdpa",
                         **WIDTHS)
    return Qwen3ForCausalLM(config).to(dtype).train()


def layer_saves(model: Any, index: int, **inputs: Any) -> dict[str, int]:
    """Bytes of the storages autograd saves while decoder layer `index` runs its forward, less those saved before it
    (the rotary tables every layer shares) and the parameters: {"activations": ..., "masks": 4-D L x L ones}."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    before: set[int] = set()
    inside: dict[int, tuple[int, bool]] = {}
    layer = model.model.layers[index]
    running = [False]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in parameters:
            return tensor
        if not running[0]:
            before.add(key)
        elif key not in before:
            inside[key] = (storage.nbytes(), tensor.dim() == 4 and tensor.shape[-1] == tensor.shape[-2])
        return tensor

    layer.register_forward_pre_hook(lambda *_: running.__setitem__(0, True))
    layer.register_forward_hook(lambda *_: running.__setitem__(0, False))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
        model(**inputs)
    return {"activations": sum(n for n, mask in inside.values() if not mask),
            "masks": sum(n for n, mask in inside.values() if mask)}


def plan_shape(model: Any) -> shapes.Model:
    return bench.plan_model(model.config.to_dict())


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("masked", [True, False], ids=["padded", "unmasked"])
def test_a_qwen3_layer_saves_what_layer_activation_bytes_counts(dtype: str, masked: bool) -> None:
    """Two rows of 64 tokens through a real Qwen3 layer: its saved storages are the formula's count, less only the
    per-token scalars it leaves out (the norms' rsqrt, sdpa's logsumexp: 48 bytes a token here, under 1 %). With a
    mask, transformers repeats K and V to every query head and sdpa keeps the mask in the query's dtype."""
    torch_dtype, size = DTYPES[dtype]
    model = qwen3(torch_dtype)
    rows, length = 2, 64
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[1, 48:] = 0  # a shorter second row: the padding a GPPO batch has
    saved = layer_saves(model, 1, input_ids=torch.randint(0, 256, (rows, length)),
                        attention_mask=mask if masked else None)
    shape = plan_shape(model)
    counted = memory.layer_activation_bytes(shape, rows * length, size, memory.repeats_kv("sdpa", shape, masked))
    assert counted <= saved["activations"] <= counted * 1.02, (saved, counted)
    # The mask's part of attention_bytes without checkpointing: one rows x L x L copy in the dtype per layer.
    assert saved["masks"] == (rows * length * length * size if masked else 0)


def test_the_fused_lm_head_holds_a_tile_as_wide_as_trl_allocates_it() -> None:
    """TRL's chunked log-probabilities over a 300-token vocabulary: the peak is the tile of HEAD_TILE_VOCAB columns
    TRL allocates whatever the vocabulary, plus the fp32 gradients; the CPU path's torch temporaries of tokens x
    vocabulary add a few percent."""
    from torch.profiler import ProfilerActivity, profile
    from trl.kernels import ChunkedLogProbFunction

    tokens, width, vocab = 1024, 64, 300
    hidden = torch.randn(tokens, width, requires_grad=True)
    weight = torch.randn(vocab, width, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        logprobs = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, memory.HEAD_TILE_VOCAB, None, 1.0,
                                                ("log_probs",))[0]
        logprobs.sum().backward()
    shape = dataclasses.replace(shapes.model("qwen3-8b"), hidden_size=width, vocab_size=vocab)
    counted = memory.loss_head_bytes(shape, tokens, 4)
    assert counted <= bench.peak_allocated(profiler) <= counted * 1.1, (bench.peak_allocated(profiler), counted)


def test_packed_rows_reach_the_model_as_one_sequence_with_one_mask() -> None:
    """SFT packs padding-free: TRL's collator concatenates a micro-batch's rows into one sequence, and sdpa keeps a
    mask of (rows x L) squared per layer, not rows x L squared. sft_memory plans it so: at per_device_batch_size 2 x
    max_length 8,192 the plan's mask is that of one 16,384-token row (2.25 GiB for this 2-layer shape, where two rows
    of 8,192 would be 1.1)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from klear.common.config import load_config
    from klear.sft.config import SftConfig

    rows, length = 2, 64
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    batch = collator([{"input_ids": list(range(1, length + 1)), "seq_lengths": [length // 2, length // 2]}] * rows)
    assert batch["input_ids"].shape == (1, rows * length)
    model = qwen3(torch.float32)
    saved = layer_saves(model, 1, input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    assert saved["masks"] == (rows * length) ** 2 * 4
    shape = plan_shape(model)
    config = load_config(SftConfig, "tiny", ["per_device_batch_size=2", "max_length=8192",
                                             "gradient_checkpointing=false"])
    cluster = shapes.Cluster("large", gpus_per_node=1, gpu_memory_gib=1024, cpus=1, memory_gib=1024, local_disk_gib=1)
    _, plan = memory.sft_memory("sft_overrides", config, shape, 1, cluster, 1)
    one_row = 2 * 8192
    assert plan["breakdown_gib"]["attention (sdpa, packed)"] == memory.gib(
        one_row ** 2 + shape.num_hidden_layers * one_row ** 2 * 4) == 2.2


# --------------------------------------------------------------------------- the trainers, measured


@pytest.fixture(scope="module")
def measured_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("measured-model")
    bench.build_model(directory)
    return directory, json.loads((directory / "config.json").read_text())


@pytest.mark.slow
# One SFT and one GPPO run, one with checkpointing and one without (both branches of the activation formula; ~40 s
# each on 2 cores): the benchmark runs all four settings.
@pytest.mark.parametrize("name", ["sft", "gppo-checkpointing"])
def test_the_plan_estimates_the_measured_peak(name: str, measured_model: tuple[Path, dict[str, Any]]) -> None:
    """The project's trainer on the 25.6M-parameter Qwen3 (fp32, sdpa, no DeepSpeed): the plan's estimate within 25 %
    of the peak of live tensor bytes; without checkpointing, the saved activations and masks within 10 % of their
    terms (the rest of the forward, outside the layers, is ~2 %)."""
    setting = bench.SETTINGS[name]
    model_dir, config_json = measured_model
    parts = bench.estimate(setting, config_json)
    run = bench.run_child(setting, model_dir)
    summary = bench.report(setting, parts, [run])
    assert run["steps"] == bench.STEPS, summary
    assert abs(sum(parts.values()) / run["peak_bytes"] - 1) <= bench.TOLERANCE, summary
    if not run["checkpointing"]:
        (activations,) = (v for k, v in parts.items() if k.startswith("activations"))
        (attention,) = (v for k, v in parts.items() if k.startswith("attention"))
        assert abs(run["saved_bytes"]["activations"] / activations - 1) <= 0.1, summary
        assert abs(run["saved_bytes"]["attention L x L"] / attention - 1) <= 0.1, summary
