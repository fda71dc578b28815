"""Tokens and GPU-hours per stage of the recipe for `klear plan`, beside its checks: estimates at stated throughput
assumptions, not measurements. Small pure functions of the loaded stage configs, the models' config.json shapes and
the cluster; no torch, DeepSpeed or vLLM imported, no I/O.

    GPU-hours of sampling  = generated tokens / (output tokens/s per GPU) / 3600    (GPU_FIGURES, per cluster)
    GPU-hours of training  = tokens x FLOPs per token / (peak FLOP/s x MFU) / 3600   (training_flops_per_token)

What the plan cannot know (how many prompts curate keeps, how long responses run, how fast an engine decodes) is an
assumption: GPU_FIGURES per GPU, `Assumptions` for the data, each with its reasoning, carried in the output so that
the plan prints them beside the figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from klear.evaluate.config import EvaluateConfig
from klear.gppo.config import GppoConfig
from klear.gppo.schedule import prompts_drawn_per_round, verl_rounds
from klear.plan import checks
from klear.plan.memory import attention_implementation
from klear.plan.shapes import Cluster, Model
from klear.sample.config import SampleConfig
from klear.sft.config import SftConfig


@dataclass(frozen=True)
class GpuFigures:
    """Per GPU of a cluster shape: its peak dense bf16 FLOP/s (a datasheet fact) and assumed vLLM output tokens/s
    (GPU_FIGURES says how each was reasoned)."""

    gpu: str
    peak_bf16_flops: float
    dense_8b_tokens_s: float  # Qwen3-8B, one engine per GPU, reasoning-length responses at high concurrency
    moe_671b_tokens_s: float  # DeepSeek-R1 (671B MoE, ~37B active), served whole by the chart's vLLM server
    moe_671b_gpus: int  # GPUs one such server takes


# Peak: NVIDIA's H100 SXM datasheet, 989 TFLOP/s dense BF16 (1,979 with sparsity); the H200 is the same GH100 chip
# with 141 GB of HBM3e at 4.8 TB/s (vs 80 GB at 3.35 TB/s): the same compute, more memory and bandwidth.
#
# Decoding is bound by memory bandwidth, not FLOP/s: each step reads the weights and the KV cache of every running
# sequence. Qwen3-8B (the sample presets' engine per GPU, gpu_memory_utilization 0.9): 16.4 GB of bf16 weights,
# 147,456 bytes of KV per token (memory.kv_bytes_per_token); a reasoning response of ~13K tokens after a ~0.5K prompt
# averages ~7K tokens of context. H100: 0.9 x 85.9 GB - weights - ~3 GB (activations, CUDA graphs) = ~58 GB of KV,
# ~55 sequences; a step reads ~74 GB at ~80 % of 3.35 TB/s, 28 ms: ~2,000 tokens/s. H200: ~117 GB of KV, ~110
# sequences; ~133 GB at ~80 % of 4.8 TB/s, 35 ms: ~3,200 tokens/s.
# DeepSeek-R1 (FP8 weights, ~700 GB: charts/klear-reasoner/values.yaml), MLA's latent KV of 70,272 bytes per token
# held whole by every tensor-parallel rank, and at this batch nearly every expert routed to. H200: one node, TP 8
# (the chart's default), ~88 GB of weights and ~46 GB of KV per GPU (gpuMemoryUtilization 0.92): ~94 sequences of ~7K
# tokens; a step reads ~134 GB at ~70 % of 4.8 TB/s plus the all-reduces, ~45 ms: ~2,100 tokens/s per node, ~250 per
# GPU. H100: no node holds it (640 GB), so two (the chart's multiNode: TP 8 x 2 pipeline stages), ~44 GB of weights
# and ~30 GB of KV (half the layers) per GPU: ~120 sequences; a GPU reads its weights once per micro-batch of the
# pipeline and its KV once, ~118 GB at ~70 % of 3.35 TB/s, 50 ms per step: ~2,400 tokens/s per 16 GPUs, ~150 per GPU.
# Prefill is not counted apart: prompts are a few percent of a reasoning sample's tokens.
GPU_FIGURES: dict[str, GpuFigures] = {
    "h100-80gb-x8": GpuFigures("NVIDIA H100 SXM 80GB", 989e12, 2000.0, 150.0, 16),
    "h200-141gb-x8": GpuFigures("NVIDIA H200 SXM 141GB", 989e12, 3200.0, 250.0, 8),
}


def gpu_figures(cluster: Cluster) -> GpuFigures:
    """The cluster's per-GPU figures; a ValueError names a cluster GPU_FIGURES has none for."""
    if cluster.name not in GPU_FIGURES:
        raise ValueError(f"cluster {cluster.name!r}: no throughput figures for its GPU in klear/plan/estimates.py "
                         f"GPU_FIGURES (known: {', '.join(GPU_FIGURES)}); the estimates need its peak FLOP/s and "
                         "decode rates")
    return GPU_FIGURES[cluster.name]


def _why(default: Any, why: str) -> Any:
    return field(default=default, metadata={"why": why})


def _default_problems() -> dict[str, int]:
    return {"aime24": 30, "aime25": 30, "hmmt_feb_2025": 30, "livecodebench_v5": 279, "livecodebench_v6": 175}


@dataclass(frozen=True)
class Assumptions:
    """What the plan cannot know about the data and the engines, with why each default; a caller may replace any
    (dataclasses.replace). Response lengths are fractions of the use's max_tokens."""

    sft_prompts: int = _why(100_000, "curated prompts the teacher and the reference model sample: the paper gives "
                                     "no count; set it to curate's output")
    prompt_tokens: int = _why(512, "tokens of a prompt with its chat template: a competition problem is a few "
                                   "hundred, a code problem with examples more")
    teacher_response_fraction: float = _why(0.4, "of max_tokens: DeepSeek-R1-0528 averages ~23K tokens on AIME "
                                                  "(DeepSeek's release note); most curated prompts are easier")
    reference_response_fraction: float = _why(0.4, "of max_tokens: Qwen3-8B thinking, on the same prompts")
    filter_response_fraction: float = _why(0.25, "of max_tokens: DeepSeek-R1-0120 averaged ~12K tokens on AIME "
                                                 "(the 0528 note: 12K -> 23K); RL candidates are easier")
    rollout_response_fraction: float = _why(0.4, "of max_completion_length: the SFT policy's rollouts at T 1.0")
    eval_response_fraction: float = _why(0.5, "of max_tokens: AIME / HMMT / LiveCodeBench, the run's hardest prompts")
    rl_math_problems: int = _why(88_000, "math RL problems after the filter (paper; DESIGN.md)")
    rl_code_problems: int = _why(18_000, "code RL problems after the filter (paper; DESIGN.md)")
    math_filter_keep: float = _why(0.8, "of math candidates kept (a majority of 16 R1-0120 samples verify: a "
                                        "label-noise filter, most pass)")
    code_filter_keep: float = _why(0.5, "of code candidates kept (>= 16 tests, and > 0.5 of 16 R1-0120 samples pass)")
    uninformative_groups: float = _why(0.4, "of a round's groups whose rollouts all score alike (all right or all "
                                            "wrong): refilled by oversample and max_refill_rounds")
    sft_mfu: float = _why(0.35, "model FLOPs utilization of SFT: ZeRO-3, 32K packed rows, gradient checkpointing "
                                "(its recomputation is not model FLOPs)")
    rl_mfu: float = _why(0.25, "model FLOPs utilization of RL's training passes: micro-batches of 2 padded rollouts, "
                               "ZeRO-3 gathers per micro-step")
    rl_generation_efficiency: float = _why(0.5, "of a dedicated engine's decode rate for RL rollouts: the colocated "
                                                "engine keeps vllm_gpu_memory_utilization (0.4) for weights and KV, so "
                                                "fewer sequences per step, and a round waits for its longest rollout")
    benchmark_problems: dict[str, int] = field(default_factory=_default_problems, metadata={
        "why": "problems per benchmark: AIME I + II 15 + 15, HMMT February 30 (the shipped testsets); LiveCodeBench "
               "v5 and v6 in the paper's windows"})

    def to_json(self) -> dict[str, dict[str, Any]]:
        """Each assumption's value and why."""
        return {f.name: {"value": getattr(self, f.name), "why": f.metadata["why"]} for f in fields(self)}


@dataclass(frozen=True)
class Row:
    stage: str
    use: str
    model: str
    tokens: int
    gpu_hours: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- FLOPs


def active_parameter_count(model: Model) -> int:
    """Parameters one token passes through: checks.parameter_count less the routed experts it is not routed to
    (n_routed_experts - num_experts_per_tok per MoE layer). DeepSeek-V3/R1: ~37B of 671B."""
    moe_layers = model.num_hidden_layers - model.first_k_dense_replace if model.n_routed_experts else 0
    idle = (model.n_routed_experts - model.num_experts_per_tok) * 3 * model.hidden_size * model.moe_intermediate_size
    return checks.parameter_count(model) - moe_layers * idle


def matmul_parameter_count(model: Model) -> int:
    """Active parameters that multiply: less the input embedding, a lookup (an untied output head multiplies)."""
    lookup = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    return active_parameter_count(model) - lookup


def training_flops_per_token(model: Model, span: int) -> int:
    """Model FLOPs of a forward and backward per token (Chowdhery et al. 2022, PaLM, Appendix B): 6 x N (2 for the
    forward's multiply-adds, 4 for the backward's) with N the parameters that multiply, plus 12 x layers x
    (heads x head_dim) x span for attention's scores and weighted sum (the forward's 4 x layers x d x span, tripled),
    `span` the positions a token's attention computes over. Recomputation under gradient checkpointing is not model
    FLOPs: the MFU assumption absorbs it."""
    attention = model.num_hidden_layers * model.num_attention_heads * model.head_dim * span
    return 6 * matmul_parameter_count(model) + 12 * attention


def forward_flops_per_token(model: Model, span: int) -> int:
    """A forward alone: a third of training_flops_per_token (2 x N + 4 x layers x d x span)."""
    return training_flops_per_token(model, span) // 3


def _training_hours(flops: float, figures: GpuFigures, mfu: float) -> float:
    return flops / (figures.peak_bf16_flops * mfu) / 3600


# --------------------------------------------------------------------------- stages


def _tokens(value: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def _prompts(assumed: int, config: SampleConfig) -> int:
    """The prompts a sample use sends: the assumed count, or the config's max_prompts where it caps it."""
    return min(assumed, config.max_prompts) if config.max_prompts else assumed


def sampling_row(stage: str, use: str, model: str, config: SampleConfig, prompts: int, fraction: float,
                 tokens_s: float, assumptions: Assumptions, rate_from: str) -> Row:
    """prompts x n samples of prompt_tokens + fraction x max_tokens; GPU-hours = generated tokens / tokens_s / 3600.
    Imported traces (backend records) take no GPU."""
    samples = _prompts(prompts, config) * config.n
    response = fraction * config.max_tokens
    generated = samples * response
    tokens = round(samples * (assumptions.prompt_tokens + response))
    detail = (f"{_tokens(_prompts(prompts, config))} prompts x n {config.n} x (prompt {assumptions.prompt_tokens} + "
              f"{fraction:g} x max_tokens {config.max_tokens})")
    if config.backend == "records":
        return Row(stage, use, model, tokens, 0.0, detail + "; backend records: imported traces, no GPU")
    return Row(stage, use, model, tokens, generated / tokens_s / 3600,
               detail + f"; {_tokens(generated)} generated / {tokens_s:g} tokens/s per GPU ({rate_from})")


def sft_span(config: SftConfig, sample_tokens: float) -> int:
    """The positions a token's attention computes over in SFT: a packed row's max_length where the kernel takes the
    row's block mask whole (sdpa or eager: memory.attention_bytes), else the token's own sample (flash-attention's
    varlen kernels; flex attention skips the blocks of other documents)."""
    packed_whole = config.packing and attention_implementation(config.attn_implementation, config.packing) not in (
        "flash_attention_2", "flex_attention")
    return config.max_length if packed_whole else min(config.max_length, math.ceil(sample_tokens))


def sft_row(config: SftConfig, teacher: SampleConfig, policy: Model, figures: GpuFigures,
            assumptions: Assumptions) -> Row:
    """Every teacher response is a record (the paper keeps them all), trained num_epochs times."""
    records = _prompts(assumptions.sft_prompts, teacher) * teacher.n
    sample = assumptions.prompt_tokens + assumptions.teacher_response_fraction * teacher.max_tokens
    tokens = config.num_epochs * records * sample
    span = sft_span(config, sample)
    per_token = training_flops_per_token(policy, span)
    detail = (f"num_epochs {config.num_epochs:g} x {_tokens(records)} records x {_tokens(sample)} tokens; "
              f"{per_token / 1e9:.1f} GFLOPs per token (6 x {matmul_parameter_count(policy) / 1e9:.2f}B + "
              f"12 x layers x d x span {span}) / ({figures.peak_bf16_flops / 1e12:g} TFLOP/s x MFU "
              f"{assumptions.sft_mfu:g})")
    return Row("sft", "sft", policy.name, round(tokens), _training_hours(tokens * per_token, figures,
                                                                          assumptions.sft_mfu), detail)


def rl_rounds(config: GppoConfig, problems: int) -> float:
    """Generation rounds of an RL run: max_steps optimizer steps at updates_per_step per round, or num_epochs over
    the problems at prompts_per_step per round (schedule_unit round: verl's epochs of prompts drawn per round)."""
    if config.max_steps > 0:
        return config.max_steps / config.updates_per_step
    if config.schedule_unit == "round":
        return verl_rounds(config, problems)
    return config.num_epochs * problems / config.prompts_per_step


def generated_prompts_per_round(config: GppoConfig, uninformative: float) -> float:
    """Prompts a round generates for, as the trainer refills (klear.gppo.trainer _generate_and_score_completions):
    prompts_per_step x oversample, then while informative groups fall short of prompts_per_step and refill rounds
    remain, the shortfall x oversample; `uninformative` of each round's groups all score alike."""
    if not config.filter_zero_advantage:
        return float(config.prompts_per_step)
    drawn = config.prompts_per_step * config.oversample
    found, total = drawn * (1 - uninformative), drawn
    for _ in range(config.max_refill_rounds):
        missing = config.prompts_per_step - found
        if missing <= 0:
            break
        drawn = missing * config.oversample
        found, total = found + drawn * (1 - uninformative), total + drawn
    return total


def gppo_rows(task: str, config: GppoConfig, problems: int, policy: Model, figures: GpuFigures,
              assumptions: Assumptions) -> list[Row]:
    """Rollouts: rounds x prompts generated x num_generations, decoded by the colocated engine. Training: each round's
    prompts_per_step x num_generations rollouts forward and backward (uninformative groups are masked, still
    computed), plus a forward over every generated rollout for the old policy's log-probs where TRL computes them
    (a round feeding several updates, or vLLM importance sampling: GRPOTrainer._generate_and_score_completions)."""
    rounds = rl_rounds(config, problems)
    prompt = min(assumptions.prompt_tokens, config.max_prompt_length)
    response = assumptions.rollout_response_fraction * config.max_completion_length
    rollout = prompt + response
    generated = rounds * generated_prompts_per_round(config, assumptions.uninformative_groups) * config.num_generations
    rate = figures.dense_8b_tokens_s * assumptions.rl_generation_efficiency
    span = math.ceil(rollout)  # a rollout's own sequence (padding to the micro-batch's longest not counted)
    if config.max_steps > 0:
        steps = f"max_steps {config.max_steps}"
    elif config.schedule_unit == "round":  # verl's epochs: whole rounds of the prompts drawn per round
        steps = (f"num_epochs {config.num_epochs:g} x ({_tokens(problems)} problems // "
                 f"{prompts_drawn_per_round(config)} drawn per round)")
    else:
        steps = (f"num_epochs {config.num_epochs:g} x {_tokens(problems)} problems / prompts_per_step "
                 f"{config.prompts_per_step}")
    rollouts = Row("gppo", f"{task} rollouts", policy.name, round(generated * rollout), generated * response / rate / 3600,
                   f"{steps} = {rounds:,.0f} rounds x {generated / rounds / config.num_generations:,.0f} prompts "
                   f"x {config.num_generations} generations x (prompt {prompt} + {assumptions.rollout_response_fraction:g}"
                   f" x {config.max_completion_length}) / ({figures.dense_8b_tokens_s:g} x "
                   f"{assumptions.rl_generation_efficiency:g} tokens/s per GPU)")
    trained = rounds * config.prompts_per_step * config.num_generations * rollout
    old_logps = config.updates_per_step > 1 or (config.use_vllm and config.vllm_is_correction)
    flops = trained * training_flops_per_token(policy, span) + (
        generated * rollout * forward_flops_per_token(policy, span) if old_logps else 0)
    training = Row("gppo", f"{task} training", policy.name, round(trained), _training_hours(flops, figures,
                                                                                           assumptions.rl_mfu),
                   f"{rounds:,.0f} rounds x {config.prompts_per_step} x {config.num_generations} rollouts x "
                   f"{_tokens(rollout)} tokens x training FLOPs (span {span})"
                   + (" + a forward over the generated rollouts (old log-probs)" if old_logps else "")
                   + f" / ({figures.peak_bf16_flops / 1e12:g} TFLOP/s x MFU {assumptions.rl_mfu:g})")
    return [rollouts, training]


def evaluation_rows(config: EvaluateConfig, models: Sequence[str], kinds: Sequence[str], figures: GpuFigures,
                    assumptions: Assumptions, model_name: str) -> list[Row]:
    """Per evaluated model and benchmark kind: problems x k samples of each selected benchmark, at the protocol's
    sampling (EvaluateConfig.sampling_for). A benchmark without an assumed problem count is named, not counted."""
    rows = []
    for kind in kinds:
        chosen = {name: b for name, b in config.selected().items() if b.kind == kind}
        if not chosen:
            continue
        known = {name: b for name, b in chosen.items() if name in assumptions.benchmark_problems}
        unknown = sorted(set(chosen) - set(known))
        samples = sum(assumptions.benchmark_problems[name] * b.k for name, b in known.items())
        max_tokens = config.sampling_for(1).max_tokens
        response = assumptions.eval_response_fraction * max_tokens
        parts = " + ".join(f"{name} {assumptions.benchmark_problems[name]} x {b.k}" for name, b in known.items())
        detail = (f"({parts}) samples x (prompt {assumptions.prompt_tokens} + {assumptions.eval_response_fraction:g} "
                  f"x max_tokens {max_tokens}) / {figures.dense_8b_tokens_s:g} tokens/s per GPU"
                  + (f"; not counted (no assumed problem count): {', '.join(unknown)}" if unknown else ""))
        for label in models:
            rows.append(Row("evaluate", f"{label} model: {kind}", model_name,
                            round(samples * (assumptions.prompt_tokens + response)),
                            samples * response / figures.dense_8b_tokens_s / 3600, detail))
    return rows


# --------------------------------------------------------------------------- the whole run


def estimate(*, policy: Model, reference_model: Model, teacher_model: Model, cluster: Cluster,
             teacher: SampleConfig | None = None, reference: SampleConfig | None = None,
             filter_math: SampleConfig | None = None, filter_code: SampleConfig | None = None,
             sft: SftConfig | None = None, gppo_math: GppoConfig | None = None, gppo_code: GppoConfig | None = None,
             evaluation: EvaluateConfig | None = None, evaluated_models: Sequence[str] = ("base", "sft", "rl"),
             evaluate_code: bool = False, assumptions: Assumptions | None = None,
             figures: GpuFigures | None = None) -> dict[str, Any]:
    """Tokens and GPU-hours of each stage whose config is given (a single-stage pipeline gives one), on `cluster`
    (its GPU_FIGURES, or `figures` for a cluster outside them). The filter model (DeepSeek-R1-0120) has the
    teacher's shape and decode rate. SFT without the teacher's config reads the sample stage's defaults (n,
    max_tokens). Returns JSON-able rows, their total, the GPU figures and the assumptions."""
    assumed = assumptions or Assumptions()
    figures = figures or gpu_figures(cluster)
    moe = (f"{teacher_model.name}, {active_parameter_count(teacher_model) / 1e9:.1f}B active, on "
           f"{figures.moe_671b_gpus} GPUs")
    rows: list[Row] = []
    if teacher is not None:
        rows.append(sampling_row("sample", "teacher", teacher_model.name, teacher, assumed.sft_prompts,
                                 assumed.teacher_response_fraction, figures.moe_671b_tokens_s, assumed, moe))
    if reference is not None:
        rows.append(sampling_row("sample", "reference", reference_model.name, reference, assumed.sft_prompts,
                                 assumed.reference_response_fraction, figures.dense_8b_tokens_s, assumed,
                                 "one engine per GPU"))
    for task, config, kept, keep in (("math", filter_math, assumed.rl_math_problems, assumed.math_filter_keep),
                                     ("code", filter_code, assumed.rl_code_problems, assumed.code_filter_keep)):
        if config is not None:
            # the candidates: the paper's kept problems / the fraction the filter keeps
            rows.append(sampling_row("sample", f"filter {task}", f"{teacher_model.name} shape (R1-0120)", config,
                                     round(kept / keep), assumed.filter_response_fraction, figures.moe_671b_tokens_s,
                                     assumed, moe))
    if sft is not None:
        rows.append(sft_row(sft, teacher or SampleConfig(), policy, figures, assumed))
    for task, gppo, problems in (("math", gppo_math, assumed.rl_math_problems),
                                 ("code", gppo_code, assumed.rl_code_problems)):
        if gppo is not None:
            rows.extend(gppo_rows(task, gppo, problems, policy, figures, assumed))
    if evaluation is not None:
        rows.extend(evaluation_rows(evaluation, evaluated_models, ("math", "code") if evaluate_code else ("math",),
                                    figures, assumed, policy.name))
    return {
        "cluster": cluster.name,
        "gpu": asdict(figures),
        "rows": [row.to_json() for row in rows],
        "total": {"tokens": sum(row.tokens for row in rows), "gpu_hours": sum(row.gpu_hours for row in rows)},
        "assumptions": assumed.to_json(),
    }


def _value(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{key} {item}" for key, item in value.items())
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def render_estimates(estimates: Mapping[str, Any]) -> str:
    """An aligned table for a terminal: stage, use, model, tokens, GPU-hours, detail; the total; then the GPU figures
    and every assumption with why, named as assumptions."""
    gpu = estimates["gpu"]
    header = ("STAGE", "USE", "MODEL", "TOKENS", "GPU-HOURS", "DETAIL")
    rows = [header] + [(r["stage"], r["use"], r["model"], _tokens(r["tokens"]), f"{r['gpu_hours']:,.0f}", r["detail"])
                       for r in estimates["rows"]]
    total = estimates["total"]
    rows.append(("total", "", "", _tokens(total["tokens"]), f"{total['gpu_hours']:,.0f}", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    right = (False, False, False, True, True)
    lines = ["  ".join(cell.rjust(w) if r else cell.ljust(w) for cell, w, r in zip(row[:5], widths, right))
             + "  " + row[5] for row in rows]
    lines.append(f"\nestimates on {estimates['cluster']} ({gpu['gpu']}), not measurements; assumed: peak "
                 f"{gpu['peak_bf16_flops'] / 1e12:g} TFLOP/s dense bf16 per GPU, vLLM output tokens/s per GPU: "
                 f"{gpu['dense_8b_tokens_s']:g} for an 8B dense model, {gpu['moe_671b_tokens_s']:g} for the 671B MoE "
                 f"on {gpu['moe_671b_gpus']} GPUs (klear/plan/estimates.py GPU_FIGURES)")
    lines += [f"assumption {name} = {_value(entry['value'])}: {entry['why']}"
              for name, entry in estimates["assumptions"].items()]
    return "\n".join(lines) + "\n"
