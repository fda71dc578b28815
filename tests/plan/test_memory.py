"""GPU memory per process in `klear plan` (klear/plan/memory.py): the formulas against DeepSpeed's own estimator and
vLLM's published KV-cache arithmetic, and through the real command one planted violation per memory check, named
by stage, pipeline parameter and setting."""

from __future__ import annotations

import json
import re

import pytest

from klear.plan import checks, memory, shapes
from tests.commands import klear
from tests.plan.conftest import CHART, COMPILED, ROOT


def memory_report(*args: str) -> tuple[int, dict[str, dict]]:
    """The real command's exit code and its memory checks by name."""
    done = klear("plan", str(COMPILED), "--values", str(CHART), "--format", "json", *args, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    return done.returncode, {c["check"]: c for c in report["checks"] if c["check"].startswith("memory")}


@pytest.mark.parametrize("gpus", [8, 16, 32, 64])
def test_zero3_model_states_equal_deepspeeds_estimator(gpus: int) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    model = shapes.model("qwen3-8b")
    total, largest = checks.parameter_count(model), memory.largest_layer_params(model)
    _, theirs, _ = estimate_zero3_model_states_mem_needs(total, largest, num_gpus_per_node=8, num_nodes=gpus // 8,
                                                         cpu_offload=False, cpu_offload_params=False)
    assert memory.zero3_model_states_bytes(total, largest, gpus) == theirs
    assert largest == 151936 * 4096  # the embedding / output head, DeepSpeed's largest module of Qwen3-8B


def test_qwen3_8b_kv_cache_per_token_is_the_published_arithmetic() -> None:
    """36 layers x 8 KV heads x 128 head_dim x 2 (K and V) x 2 bytes (bf16) = 147,456 bytes per token."""
    model = shapes.model("qwen3-8b")
    assert (model.num_hidden_layers, model.num_key_value_heads, model.head_dim, model.torch_dtype) == (
        36, 8, 128, "bfloat16")
    assert memory.kv_bytes_per_token(model, memory.DTYPE_BYTES[model.torch_dtype]) == 147_456


def test_deepseek_mla_caches_one_latent_per_layer() -> None:
    model = shapes.model("deepseek-r1-0528")
    assert memory.kv_bytes_per_token(model, 2) == 61 * (512 + 64) * 2


def test_the_gpu_image_flash_attn_assumption_matches_its_lock() -> None:
    """"auto" resolves to flex_attention for packed rows in the plan because the GPU image has no flash-attn and its
    torch has FlexAttention: fails when the lock adds flash-attn or drops to a torch without flex."""
    lock = (ROOT / "docker" / "locks" / "gpu.txt").read_text()
    assert bool(re.search(r"^flash[-_]attn==", lock, re.MULTILINE)) == memory.GPU_IMAGE_HAS_FLASH_ATTN
    locked_torch = re.search(r"^torch==(\d+)\.(\d+)", lock, re.MULTILINE)
    assert locked_torch and (int(locked_torch[1]), int(locked_torch[2])) >= (2, 6), "transformers compiles flex masks from torch 2.6"
    flash = memory.GPU_IMAGE_HAS_FLASH_ATTN
    assert memory.attention_implementation("auto", packed=True) == ("flash_attention_2" if flash else "flex_attention")
    assert memory.attention_implementation("auto") == ("flash_attention_2" if flash else "sdpa")
    assert memory.attention_implementation("sdpa", packed=True) == "sdpa"


def test_checkpointing_keeps_one_layer_and_the_layer_inputs() -> None:
    model = shapes.model("qwen3-8b-base")
    full = memory.activation_bytes(model, 32768, 2, checkpointing=False)
    kept = memory.activation_bytes(model, 32768, 2, checkpointing=True)
    assert kept["checkpoints"] == 36 * 32768 * 4096 * 2
    assert kept["recomputed layer"] * 36 == full["layers"]
    assert memory.attention_bytes("flash_attention_2", model, 1, 32768, 2, True, True) == 0
    assert memory.attention_bytes("sdpa", model, 1, 32768, 2, False, True) == 0
    assert memory.attention_bytes("sdpa", model, 1, 32768, 2, True, True) == 32768 ** 2 * 3  # bool + bf16 copy


def test_flex_attention_keeps_a_block_mask_not_a_square() -> None:
    """A packed 32K row under flex_attention: 256 x 256 int32 block indices, four times, and four counts of 256
    (1 MiB), whatever the checkpointing; sdpa's dense mask is 3 GiB (tests/sft/test_attention.py holds the formula
    against a real BlockMask)."""
    model = shapes.model("qwen3-8b-base")
    assert memory.flex_block_mask_bytes(32768) == 4 * 4 * 256 * 257
    assert memory.flex_block_mask_bytes(32769) == 4 * 4 * 257 * 258  # a partial block counts whole
    for checkpointing in (True, False):
        assert memory.attention_bytes("flex_attention", model, 2, 32768, 2, True, checkpointing) == 2 * 4 * 4 * 256 * 257


@pytest.mark.parametrize("cluster", ["h100-80gb-x8", "h200-141gb-x8"])
def test_the_recipe_defaults_memory(cluster: str) -> None:
    """Everything fits both shapes: the GPPO actor at per_device_batch_size 2 x (4096 + 32768) tokens needs ~66.5
    GiB, which an H100 has only while vLLM sleeps (the presets' vllm_enable_sleep_mode)."""
    _, found = memory_report("--cluster", cluster)
    assert {"memory: sft_overrides", "memory: gppo_math_overrides actor", "memory: gppo_math_overrides vLLM",
            "memory: gppo_code_overrides actor", "memory: gppo_code_overrides vLLM",
            "memory: reference_overrides engine", "memory: evaluate_overrides engine"} <= set(found)
    failing = sorted(name for name, c in found.items() if not c["ok"])
    assert failing == [], failing


def test_sleep_mode_gives_the_actor_the_whole_gpu() -> None:
    _, found = memory_report()
    actor = found["memory: gppo_math_overrides actor"]
    assert actor["ok"] and "vllm_enable_sleep_mode" in actor["detail"]
    code, found = memory_report("--arg", 'gppo_math_overrides=["vllm_enable_sleep_mode=false"]')
    actor = found["memory: gppo_math_overrides actor"]
    assert code == 1 and not actor["ok"] and "vllm_gpu_memory_utilization 0.4" in actor["detail"], actor


def test_a_gppo_batch_too_large_for_the_gpu_is_named() -> None:
    code, found = memory_report("--arg", 'gppo_math_overrides=["per_device_batch_size=16"]', "--cluster",
                                "h200-141gb-x8")
    bad = found["memory: gppo_math_overrides actor"]
    assert code == 1 and not bad["ok"] and bad["stage"] == "gppo"
    assert bad["detail"].startswith("gppo_math_overrides: per_device_batch_size 16 x")
    assert found["memory: gppo_code_overrides actor"]["ok"]


def test_a_vllm_share_too_small_for_the_weights_is_named() -> None:
    code, found = memory_report("--arg", 'gppo_code_overrides=["vllm_gpu_memory_utilization=0.1"]', "--cluster",
                                "h200-141gb-x8")
    bad = found["memory: gppo_code_overrides vLLM"]
    assert code == 1 and not bad["ok"] and "vllm_gpu_memory_utilization 0.1" in bad["detail"]


def test_an_sft_length_too_long_for_the_gpu_is_named() -> None:
    code, found = memory_report("--arg", 'sft_overrides=["max_length=262144"]', "--cluster", "h200-141gb-x8")
    bad = found["memory: sft_overrides"]
    assert code == 1 and not bad["ok"] and bad["stage"] == "sft" and "max_length 262144" in bad["detail"]


@pytest.mark.parametrize(("argument", "name", "setting"), [
    ('reference_overrides=["n=8", "gpu_memory_utilization=0.1"]', "memory: reference_overrides engine",
     "gpu_memory_utilization 0.1"),
    ('evaluate_overrides=["sampling.gpu_memory_utilization=0.1"]', "memory: evaluate_overrides engine",
     "gpu_memory_utilization 0.1"),
])
def test_an_engine_too_small_for_weights_and_one_sequence_is_named(argument: str, name: str, setting: str) -> None:
    code, found = memory_report("--arg", argument, "--cluster", "h200-141gb-x8")
    bad = found[name]
    assert code == 1 and not bad["ok"] and bad["detail"].startswith(argument.split("=")[0]) and setting in bad["detail"]
    assert [n for n, c in found.items() if not c["ok"]] == [name]
