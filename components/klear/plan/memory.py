"""GPU memory per process for `klear plan`: SFT under ZeRO-3, the GPPO actor beside its colocated vLLM engine, and
the sampling engines (reference, evaluation). Small pure functions of a model's config.json shape and the stage's
settings, in bytes; each docstring names its formula's source. No torch, DeepSpeed or vLLM imported.

The figures are per GPU at the fewest nodes planned (ZeRO-3 shards the model states over the processes, so more
nodes only lower them), held against MARGIN of the GPU's memory: the CUDA context, NCCL buffers and the caching
allocator's fragmentation take the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from klear.evaluate.config import EvaluateConfig
from klear.gppo.config import GppoConfig
from klear.plan import checks
from klear.plan.checks import Check
from klear.plan.shapes import Cluster, Model
from klear.sft.config import SftConfig
from klear.training.hf_model import resolve_attention

GIB = 1024 ** 3
MARGIN = 0.9  # of the GPU's memory, for what the estimate leaves out
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# The GPU image's lock (docker/locks/gpu.txt) has no flash-attn: attn_implementation "auto" resolves to flex_attention
# for packed rows there, else sdpa (klear.training.hf_model.resolve_attention). tests/plan/test_memory.py holds this
# against the lock.
GPU_IMAGE_HAS_FLASH_ATTN = False
# TRL's fused LM head (trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE; trl/trainer/utils.py
# _CHUNKED_LOGPROB_CHUNK_SIZE), used by both SFTTrainer and GRPOTrainer at the lock's trl 1.16: logits live one tile
# of tokens x vocabulary columns at a time, never as a whole.
HEAD_TILE_TOKENS, HEAD_TILE_VOCAB = 4096, 32768
# FlexAttention's block of query and key tokens (torch/nn/attention/flex_attention.py _DEFAULT_SPARSE_BLOCK_SIZE),
# the BlockMask's unit: transformers builds its masks at the default.
FLEX_BLOCK = 128


def gib(size: float) -> float:
    return round(size / GIB, 1)


# --------------------------------------------------------------------------- model states


def largest_layer_params(model: Model) -> int:
    """The parameters of the largest single module, as DeepSpeed's model_to_params counts them
    (deepspeed/runtime/zero/stage3.py: a module's own parameters, not its children's): the embedding or output head
    (vocab x hidden) for every decoder planned here, else the largest attention or MLP matrix."""
    h = model.hidden_size
    return max(model.vocab_size * h, h * model.intermediate_size, h * model.num_attention_heads * model.head_dim,
               h * model.moe_intermediate_size)


def zero3_model_states_bytes(total_params: int, largest_params: int, gpus: int) -> int:
    """Per GPU under ZeRO-3 without offload: DeepSpeed's estimate_zero3_model_states_mem_needs
    (deepspeed/runtime/zero/stage3.py, cpu_offload=False): 18 bytes per parameter sharded over the GPUs (16-bit
    weights and gradients, fp32 master weights and Adam's two moments, and a buffer) plus 4 bytes per parameter of
    the largest layer, gathered whole for its forward and backward."""
    return 4 * largest_params + int(18 * total_params / gpus)


def ddp_model_states_bytes(total_params: int) -> int:
    """Per GPU without DeepSpeed (plain DDP): every process holds fp32 weights, gradients and Adam's two moments,
    16 bytes per parameter (Rajbhandari et al. 2020, ZeRO §3.1, unsharded)."""
    return 16 * total_params


# --------------------------------------------------------------------------- activations


def layer_activation_bytes(model: Model, tokens: int, dtype_bytes: int, repeated_kv: bool = False) -> int:
    """One decoder layer's saved activations for `tokens` tokens: Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", §4.1: 34·s·b·h bytes for GPT) counted tensor by tensor as
    transformers' Qwen3 decoder layer keeps them for its backward (transformers/models/qwen3/modeling_qwen3.py; the
    GPU image has no fused norm or MLP kernels), no dropout. Each RMSNorm (the layer's two, and Qwen3's per-head
    q_norm and k_norm: widths h, h, heads x head_dim, kv_heads x head_dim) keeps its input upcast to fp32 and its
    normalized input in the training dtype (Qwen3RMSNorm.forward: the fp32 copy feeds pow and the product with rsqrt,
    the weight multiplies the normalized copy); the projections keep their inputs (QKV and gate/up: h each); the
    attention kernel keeps the rotated Q, K and V and its output (Q and the output heads x head_dim, K and V
    kv_heads x head_dim, or heads x head_dim where they reach the kernel repeated: repeats_kv); the MLP keeps gate,
    up, act(gate) and the product fed to down_proj (intermediate each). Per-token scalars (the norms' rsqrt, the
    kernel's logsumexp) are left out, and the attention scores are not here (attention_bytes).
    tests/plan/test_memory_measured.py holds this against the storages a real forward saves."""
    h = model.hidden_size
    q = model.num_attention_heads * model.head_dim
    kv = model.num_key_value_heads * model.head_dim
    kernel_kv = q if repeated_kv else kv
    norms = (4 + dtype_bytes) * (2 * h + q + kv)
    kept = dtype_bytes * (2 * h + 2 * q + 2 * kernel_kv + 4 * model.intermediate_size)
    return tokens * (norms + kept)


def repeats_kv(implementation: str, model: Model, masked: bool) -> bool:
    """Whether K and V reach the attention kernel repeated to every query head, and are kept so for its backward:
    transformers' eager path always (models/qwen3/modeling_qwen3.py eager_attention_forward, repeat_kv); its sdpa
    path whenever a mask is passed (integrations/sdpa_attention.py use_gqa_in_sdpa: PyTorch's own grouped-query
    attention only without one); its flex path when the query heads are not a power of two
    (integrations/flex_attention.py); flash-attn takes grouped-query attention as it is."""
    heads = model.num_attention_heads
    if implementation == "eager":
        return True
    if implementation == "sdpa":
        return masked
    return implementation == "flex_attention" and heads & (heads - 1) != 0


def activation_bytes(model: Model, tokens: int, dtype_bytes: int, checkpointing: bool,
                     repeated_kv: bool = False) -> dict[str, int]:
    """Saved activations of a forward and backward. With full activation checkpointing (Korthikanti et al. 2022
    §4.2, "full recomputation"): each layer's input (tokens x hidden) kept, plus one layer's activations while it is
    recomputed for its backward; without: every layer's activations."""
    layer = layer_activation_bytes(model, tokens, dtype_bytes, repeated_kv)
    if checkpointing:
        return {"checkpoints": model.num_hidden_layers * tokens * model.hidden_size * dtype_bytes,
                "recomputed layer": layer}
    return {"layers": model.num_hidden_layers * layer}


def attention_implementation(choice: str, packed: bool = False) -> str:
    """What "auto" becomes in the GPU image, on its CUDA devices (klear.training.hf_model.resolve_attention:
    flash_attention_2 where flash-attn is installed, else flex_attention for packed rows, else sdpa)."""
    return resolve_attention(choice, packed, GPU_IMAGE_HAS_FLASH_ATTN, cuda=True)


def flex_block_mask_bytes(length: int) -> int:
    """One row's BlockMask (torch/nn/attention/flex_attention.py BlockMask): int32 block indices of n = ceil(L /
    FLEX_BLOCK) query blocks by n key blocks, four of them (partial and full blocks, and their transposes for the
    backward), and four per-block counts of n."""
    blocks = -(-length // FLEX_BLOCK)
    return 4 * 4 * blocks * (blocks + 1)


def attention_bytes(implementation: str, model: Model, rows: int, length: int, dtype_bytes: int, masked: bool,
                    checkpointing: bool) -> int:
    """The L x L memory of attention for `rows` sequences of `length` tokens. flash_attention_2: none (varlen
    kernels take packed rows by position ids). flex_attention: one BlockMask per row, built once per forward from the
    position ids or the padding and shared by every layer (transformers/masking_utils.py flex_attention_mask, the
    mask built compiled, never whole; flex_block_mask_bytes), its kernels computing only the blocks it lists
    (torch/nn/attention/flex_attention.py BlockMask). sdpa with a mask (packed rows, or padded ones): transformers
    builds a dense boolean mask rows x L x L (transformers/masking_utils.py sdpa_mask: no is_causal shortcut once rows
    are packed or padded), and PyTorch converts it to the query's dtype for the memory-efficient kernel
    (aten/src/ATen/native/transformers/attention.cpp, convert_boolean_attn_mask), kept for the backward of each
    layer whose activations are live. sdpa without a mask: none (is_causal). eager: the scores and their softmax
    per head (Korthikanti et al. 2022 §4.1: the 5·a·s²·b term, without dropout), per live layer."""
    square = rows * length * length
    live_layers = 1 if checkpointing else model.num_hidden_layers
    if implementation == "flash_attention_2":
        return 0
    if implementation == "flex_attention":
        return rows * flex_block_mask_bytes(length)
    if implementation == "sdpa":
        return square + live_layers * square * dtype_bytes if masked else 0
    return square + live_layers * 2 * model.num_attention_heads * square * dtype_bytes


def loss_head_bytes(model: Model, tokens: int, dtype_bytes: int) -> int:
    """TRL's fused LM head (trl/kernels/chunked_logprob.py ChunkedLogProbFunction: one tile of HEAD_TILE_TOKENS
    tokens x HEAD_TILE_VOCAB vocabulary columns at a time, the backward turning it into the logits gradient in place
    and accumulating the hidden-state and weight gradients in fp32): the tile, allocated HEAD_TILE_VOCAB wide
    whatever the vocabulary and in the compute dtype (mm_buf = torch.empty((min(N, TOKEN_CHUNK_SIZE), chunk_size),
    dtype=compute_dtype): the training dtype), plus tokens x hidden and vocab x hidden fp32 gradients. Not tokens x
    vocab: the whole logits are never materialized."""
    tile = min(tokens, HEAD_TILE_TOKENS) * HEAD_TILE_VOCAB * dtype_bytes
    return tile + tokens * model.hidden_size * 4 + model.vocab_size * model.hidden_size * 4


# --------------------------------------------------------------------------- engines


def kv_bytes_per_token(model: Model, dtype_bytes: int) -> int:
    """vLLM's KV cache per token (vllm/v1/kv_cache_interface.py, AttentionSpec.page_size_bytes / block_size):
    K and V, 2 x layers x kv_heads x head_dim x dtype bytes; for MLA (DeepSeek) one latent of kv_lora_rank +
    qk_rope_head_dim per layer (MLAAttentionSpec)."""
    if model.kv_lora_rank:
        return model.num_hidden_layers * (model.kv_lora_rank + model.qk_rope_head_dim) * dtype_bytes
    return 2 * model.num_hidden_layers * model.num_key_value_heads * model.head_dim * dtype_bytes


def weights_bytes(total_params: int, dtype_bytes: int, tensor_parallel: int) -> int:
    """An engine's weights per tensor-parallel rank: parameters x dtype bytes / TP (vLLM shards every layer; the
    embeddings too, by vocabulary)."""
    return total_params * dtype_bytes // tensor_parallel


def engine_need(total_params: int, model: Model, tensor_parallel: int, length: int, sequences: int = 1) -> dict[str, int]:
    """What a vLLM engine must hold within gpu_memory_utilization x GPU memory to start (vLLM refuses to start when
    the KV cache left after the weights cannot hold one max_model_len sequence: vllm/v1/core/kv_cache_utils.py,
    check_enough_kv_cache_memory): the weights per rank and the KV cache of `sequences` full-length sequences, the
    cache split over the ranks by KV head."""
    dtype = DTYPE_BYTES.get(model.torch_dtype, 2)
    kv = kv_bytes_per_token(model, dtype) * length * sequences
    return {"weights": weights_bytes(total_params, dtype, tensor_parallel),
            f"KV cache {sequences} x {length} tokens": kv // (1 if model.kv_lora_rank else tensor_parallel)}


# --------------------------------------------------------------------------- the stages


def _breakdown(parts: Mapping[str, int]) -> str:
    return " + ".join(f"{name} {gib(size)}" for name, size in parts.items())


def _estimate(parts: Mapping[str, int], limit: float, gpus: int) -> dict[str, Any]:
    return {"gib_per_gpu": gib(sum(parts.values())), "limit_gib": round(limit / GIB, 1), "gpus": gpus,
            "breakdown_gib": {name: gib(size) for name, size in parts.items()}}


def _model_states(total: int, model: Model, deepspeed: str, gpus: int) -> dict[str, int]:
    if deepspeed:
        return {f"ZeRO-3 model states over {gpus} GPUs": zero3_model_states_bytes(total, largest_layer_params(model),
                                                                                 gpus)}
    return {"model states (no DeepSpeed: unsharded)": ddp_model_states_bytes(total)}


def sft_memory(param: str, config: SftConfig, model: Model, total: int, cluster: Cluster,
               nodes: int) -> tuple[Check, dict[str, Any]]:
    """SFT per GPU: model states (ZeRO-3), activations of per_device_batch_size packed rows of max_length tokens,
    the attention's L x L memory and the fused LM head, against MARGIN of the GPU."""
    gpus = nodes * cluster.gpus_per_node
    dtype = 2 if config.bf16 else 4
    tokens = config.per_device_batch_size * config.max_length
    implementation = attention_implementation(config.attn_implementation, config.packing)
    parts = _model_states(total, model, config.deepspeed, gpus)
    # Packing is padding-free (klear.sft.stage: padding_free=packing): TRL's collator concatenates the micro-batch's
    # rows into one sequence of per_device_batch_size x max_length tokens (trl/trainer/sft_trainer.py,
    # DataCollatorForLanguageModeling: "flatten everything into a single sequence"), so one mask of that length.
    rows, length = (1, tokens) if config.packing else (config.per_device_batch_size, config.max_length)
    repeated = repeats_kv(implementation, model, config.packing)
    parts |= {f"activations ({k})": v for k, v in activation_bytes(model, tokens, dtype, config.gradient_checkpointing,
                                                                     repeated).items()}
    parts[f"attention ({implementation}, {'packed' if config.packing else 'unpacked'})"] = attention_bytes(
        implementation, model, rows, length, dtype, config.packing, config.gradient_checkpointing)
    parts["fused LM head"] = loss_head_bytes(model, tokens, dtype)
    limit = MARGIN * cluster.gpu_memory_gib * GIB
    need = sum(parts.values())
    settings = (f"{param}: per_device_batch_size {config.per_device_batch_size} x max_length {config.max_length} "
                f"tokens, gradient_checkpointing {config.gradient_checkpointing}, attn_implementation "
                f"{config.attn_implementation} -> {implementation}, at {nodes} x {cluster.gpus_per_node} GPUs")
    verdict = "<=" if need <= limit else ">"
    detail = (f"{settings}: {gib(need)} GiB per GPU ({_breakdown(parts)}) {verdict} {MARGIN:.0%} of "
              f"{cluster.gpu_memory_gib} GiB = {round(limit / GIB, 1)}")
    return Check("sft", f"memory: {param}", need <= limit, detail), _estimate(parts, limit, gpus)


def gppo_memory(param: str, config: GppoConfig, model: Model, total: int, cluster: Cluster,
                nodes: int) -> tuple[list[Check], dict[str, Any]]:
    """GPPO per GPU: the actor (model states under ZeRO-3, activations of per_device_batch_size rollouts of
    prompt + completion tokens, padded, so with sdpa a dense mask; the fused LM head) and the colocated vLLM engine
    (vllm_gpu_memory_utilization of the GPU, which must hold the weights per rank and one full-length sequence's
    KV cache). The actor gets MARGIN of the GPU less vLLM's share, or all of it with vllm_enable_sleep_mode (vLLM
    releases its weights and KV cache during the update: LLM.sleep(level=2))."""
    gpus = nodes * cluster.gpus_per_node
    dtype = 2 if config.bf16 else 4
    length = config.engine_length
    tokens = config.per_device_batch_size * length
    implementation = attention_implementation(config.attn_implementation)
    colocated = config.use_vllm and config.vllm_mode == "colocate"
    share = config.vllm_gpu_memory_utilization * cluster.gpu_memory_gib * GIB if colocated else 0.0
    parts = _model_states(total, model, config.deepspeed, gpus)
    parts |= {f"activations ({k})": v for k, v in activation_bytes(model, tokens, dtype, config.gradient_checkpointing,
                                                                     repeats_kv(implementation, model, True)).items()}
    parts[f"attention ({implementation}, padded)"] = attention_bytes(
        implementation, model, config.per_device_batch_size, length, dtype, True, config.gradient_checkpointing)
    parts["fused LM head"] = loss_head_bytes(model, config.per_device_batch_size * config.max_completion_length, dtype)
    asleep = colocated and config.vllm_enable_sleep_mode
    limit = MARGIN * cluster.gpu_memory_gib * GIB - (0.0 if asleep else share)
    need = sum(parts.values())
    where = f"at {nodes} x {cluster.gpus_per_node} GPUs"
    beside = ("vLLM asleep during the update (vllm_enable_sleep_mode)" if asleep else
              f"less vllm_gpu_memory_utilization {config.vllm_gpu_memory_utilization} x {cluster.gpu_memory_gib} GiB"
              if colocated else "no colocated vLLM")
    actor = Check("gppo", f"memory: {param} actor", need <= limit,
                  f"{param}: per_device_batch_size {config.per_device_batch_size} x (max_prompt_length "
                  f"{config.max_prompt_length} + max_completion_length {config.max_completion_length}) tokens, "
                  f"gradient_checkpointing {config.gradient_checkpointing}, attn_implementation "
                  f"{config.attn_implementation} -> {implementation}, {where}: {gib(need)} GiB per GPU "
                  f"({_breakdown(parts)}) {'<=' if need <= limit else '>'} {MARGIN:.0%} of "
                  f"{cluster.gpu_memory_gib} GiB {beside} = {round(limit / GIB, 1)}")
    found = [actor]
    estimate: dict[str, Any] = {"actor": _estimate(parts, limit, gpus)}
    if colocated:
        engine = engine_need(total, model, config.vllm_tensor_parallel_size, length)
        engine_size = sum(engine.values())
        found.append(Check("gppo", f"memory: {param} vLLM", engine_size <= share,
                           f"{param}: vllm_gpu_memory_utilization {config.vllm_gpu_memory_utilization} x "
                           f"{cluster.gpu_memory_gib} GiB = {round(share / GIB, 1)} GiB "
                           f"{'>=' if engine_size <= share else '<'} {gib(engine_size)} GiB ({_breakdown(engine)}) at "
                           f"vllm_tensor_parallel_size {config.vllm_tensor_parallel_size}, engine length "
                           f"{length}"))
        estimate["vLLM"] = _estimate(engine, share, gpus)
    return found, estimate


def engine_memory(stage: str, param: str, model: Model, total: int, cluster: Cluster, tensor_parallel: int,
                  utilization: float, length: int, length_from: str) -> tuple[Check, dict[str, Any]]:
    """A sampling engine (reference, evaluation): weights per tensor-parallel rank plus one full-length sequence's
    KV cache within gpu_memory_utilization x the GPU's memory (engine_need)."""
    need = engine_need(total, model, tensor_parallel, length)
    size = sum(need.values())
    share = utilization * cluster.gpu_memory_gib * GIB
    return (Check(stage, f"memory: {param} engine", size <= share,
                  f"{param}: gpu_memory_utilization {utilization} x {cluster.gpu_memory_gib} GiB = "
                  f"{round(share / GIB, 1)} GiB {'>=' if size <= share else '<'} {gib(size)} GiB ({_breakdown(need)}) "
                  f"for {model.name} at tensor_parallel_size {tensor_parallel}, {length_from} {length}"),
            _estimate(need, share, tensor_parallel))


def engine_tensor_parallel(sampling: Any, pod_gpus: int) -> int:
    """SampleConfig's GPUs per engine: tensor_parallel_size, or 0 = the pod's GPUs divided among
    data_parallel_size engines (klear.sample.config)."""
    if sampling.tensor_parallel_size:
        return int(sampling.tensor_parallel_size)
    return max(1, pod_gpus // max(int(sampling.data_parallel_size), 1))


def _pod_gpus(value: Any, default: int) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def memory_checks(configs: Mapping[str, Any], params: Mapping[str, Any], cluster: Cluster, nodes: Sequence[int],
                  policy: Model, reference: Model, policy_total: int,
                  reference_total: int) -> tuple[list[Check], dict[str, Any]]:
    """Every memory check of the loaded configs (by overrides parameter), at the fewest of `nodes`, and the GiB per
    GPU of each stage with its breakdown."""
    fewest = min(nodes) if nodes else 1
    found: list[Check] = []
    estimates: dict[str, Any] = {}
    for param, config in configs.items():
        if isinstance(config, SftConfig):
            check, estimate = sft_memory(param, config, policy, policy_total, cluster, fewest)
            found.append(check)
            estimates[f"sft {param}"] = estimate
        elif isinstance(config, GppoConfig):
            gppo, estimate = gppo_memory(param, config, policy, policy_total, cluster, fewest)
            found.extend(gppo)
            estimates[f"gppo {param}"] = estimate
    engines = []
    if configs.get("reference_overrides") is not None:
        engines.append(("sample", "reference_overrides", configs["reference_overrides"], reference, reference_total,
                        reference.max_position_embeddings, "reference_gpus"))
    for param, config in configs.items():
        if isinstance(config, EvaluateConfig):  # evaluate_overrides, or a single-stage pipeline's overrides
            sampling = config.sampling_for(1)
            positions = checks.model_positions(policy, sampling.engine_kwargs.get("hf_overrides"))
            engines.append(("evaluate", param, sampling, policy, policy_total, positions,
                            "eval_gpus" if param == "evaluate_overrides" else "gpus"))
    for stage, param, sampling, model, total, positions, pod_param in engines:
        length = sampling.max_model_len or positions
        pod = _pod_gpus(params.get(pod_param), cluster.gpus_per_node)
        check, estimate = engine_memory(stage, param, model, total, cluster, engine_tensor_parallel(sampling, pod),
                                        sampling.gpu_memory_utilization, length,
                                        "max_model_len" if sampling.max_model_len else f"{model.name}'s positions")
        found.append(check)
        estimates[f"{stage} {param}"] = estimate
    return found, estimates
