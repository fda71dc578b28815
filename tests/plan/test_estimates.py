"""Tokens and GPU-hours per stage for `klear plan` (klear/plan/estimates.py): the training FLOPs against a hand
computation, the figures scaling with the settings that drive them (samples, epochs, steps, the cluster), totals that
are the rows' sums, the assumptions carried beside the figures, and a clear error for a cluster without figures."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from klear.common.config import load_config
from klear.evaluate.config import EvaluateConfig
from klear.gppo.config import GppoConfig
from klear.plan import estimates, shapes
from klear.plan.estimates import Assumptions
from klear.sample.config import SampleConfig
from klear.sft.config import SftConfig
from tests.plan.conftest import ROOT

CLUSTERS = ("h100-80gb-x8", "h200-141gb-x8")


def run(cluster: str = "h100-80gb-x8", teacher: list[str] | None = None, reference: list[str] | None = None,
        sft: list[str] | None = None, gppo_math: list[str] | None = None, gppo_code: list[str] | None = None,
        evaluation: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
    """The estimates of the recipe at its shipped presets (the pipeline's reference_overrides default n=8), each
    stage's overrides applied as the pipeline applies them."""
    return estimates.estimate(
        policy=shapes.model("qwen3-8b-base"), reference_model=shapes.model("qwen3-8b"),
        teacher_model=shapes.model("deepseek-r1-0528"), cluster=shapes.cluster(cluster),
        teacher=load_config(SampleConfig, "paper", teacher or []),
        reference=load_config(SampleConfig, "paper", reference or ["n=8"]),
        filter_math=load_config(SampleConfig, "paper", []), filter_code=load_config(SampleConfig, "paper", []),
        sft=load_config(SftConfig, "paper", sft or []), gppo_math=load_config(GppoConfig, "math", gppo_math or []),
        gppo_code=load_config(GppoConfig, "code", gppo_code or []),
        evaluation=load_config(EvaluateConfig, "paper", evaluation or []), **kwargs)


def row(result: dict[str, Any], use: str) -> dict[str, Any]:
    return next(r for r in result["rows"] if r["use"] == use)


# --------------------------------------------------------------------------- FLOPs


def test_training_flops_equal_a_hand_computation() -> None:
    """Qwen3-8B-Base (config.json: hidden 4096, 36 layers, 32 heads and 8 KV heads of 128, MLP 12288, vocabulary
    151936, untied) over a packed 32K row: 6 x the parameters that multiply + 12 x layers x heads x head_dim x span."""
    attention = 2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128  # q and o; k and v
    mlp = 3 * 4096 * 12288  # gate, up, down
    matmul = 36 * (attention + mlp) + 151936 * 4096  # the output head multiplies; the input embedding is a lookup
    assert matmul == 7_568_097_280
    model = shapes.model("qwen3-8b-base")
    assert estimates.matmul_parameter_count(model) == matmul
    expected = 6 * 7_568_097_280 + 12 * 36 * 32 * 128 * 32768
    assert expected == 103_390_642_176
    assert estimates.training_flops_per_token(model, 32768) == expected
    assert estimates.forward_flops_per_token(model, 32768) == expected // 3


def test_deepseek_r1_passes_a_token_through_about_37b_parameters() -> None:
    """DeepSeek-V3 technical report: 671B parameters, 37B activated per token (8 of 256 routed experts + 1 shared)."""
    active = estimates.active_parameter_count(shapes.model("deepseek-r1-0528"))
    assert 37e9 <= active <= 38e9
    dense = shapes.model("qwen3-8b")
    assert estimates.active_parameter_count(dense) == estimates.checks.parameter_count(dense)


def test_sft_training_is_its_tokens_times_the_flops_at_the_mfu() -> None:
    result = run()
    sft, model = row(result, "sft"), shapes.model("qwen3-8b-base")
    # the paper's teacher sampling: 100K prompts x 16 responses of 512 + 0.4 x 32768 tokens, 4 epochs
    assert sft["tokens"] == round(4 * 100_000 * 16 * (512 + 0.4 * 32768))
    # flex attention ("auto" for packed rows in the GPU image) computes only the blocks of each token's own sample
    flops = sft["tokens"] * estimates.training_flops_per_token(model, 13620)
    assert sft["gpu_hours"] == pytest.approx(flops / (989e12 * 0.35) / 3600, rel=1e-9)


def test_a_sample_spans_its_own_tokens_where_the_kernel_skips_the_other_documents() -> None:
    """sdpa takes a packed row's mask whole: attention over all 32768 positions; flash-attention's varlen kernels
    and flex attention's block mask, over the token's own sample."""
    sdpa = load_config(SftConfig, "paper", ["attn_implementation=sdpa"])
    for kernel in ("flash_attention_2", "flex_attention", "auto"):
        sparse = load_config(SftConfig, "paper", [f"attn_implementation={kernel}"])
        assert estimates.sft_span(sparse, 13619.2) == 13620, kernel
    assert estimates.sft_span(sdpa, 13619.2) == 32768
    assert row(run(sft=["attn_implementation=sdpa"]), "sft")["gpu_hours"] > row(run(), "sft")["gpu_hours"]


# --------------------------------------------------------------------------- scaling


def test_doubling_n_doubles_the_teachers_tokens_and_gpu_hours() -> None:
    paper, double, half = run(), run(teacher=["n=32"]), run(teacher=["n=8"])
    for scaled, factor in ((double, 2), (half, 0.5)):
        for use in ("teacher", "sft"):  # SFT trains on every teacher response
            assert row(scaled, use)["tokens"] == pytest.approx(factor * row(paper, use)["tokens"], abs=1)
            assert row(scaled, use)["gpu_hours"] == pytest.approx(factor * row(paper, use)["gpu_hours"])
    reference = run(reference=["n=16"])
    assert row(reference, "reference")["tokens"] == 2 * row(paper, "reference")["tokens"]
    assert row(reference, "reference")["gpu_hours"] == pytest.approx(2 * row(paper, "reference")["gpu_hours"])


def test_max_prompts_caps_the_prompts_sampled() -> None:
    capped = run(teacher=["max_prompts=25000"])
    assert row(capped, "teacher")["tokens"] == pytest.approx(row(run(), "teacher")["tokens"] / 4, abs=1)


def test_two_epochs_halve_sft() -> None:
    paper, two = row(run(), "sft"), row(run(sft=["num_epochs=2"]), "sft")
    assert two["tokens"] == paper["tokens"] / 2
    assert two["gpu_hours"] == pytest.approx(paper["gpu_hours"] / 2)


def test_rl_runs_scale_with_epochs_or_steps() -> None:
    paper = run()
    double = run(gppo_math=["num_epochs=10"])
    for use in ("math rollouts", "math training"):
        assert row(double, use)["gpu_hours"] == pytest.approx(2 * row(paper, use)["gpu_hours"])
    assert row(double, "code rollouts") == row(paper, "code rollouts")
    # 100 optimizer steps of 16 prompts = 12.5 rounds of 128 prompts
    config = load_config(GppoConfig, "math", ["max_steps=100"])
    assert estimates.rl_rounds(config, 88_000) == 12.5
    steps = row(run(gppo_math=["max_steps=100"]), "math training")
    assert steps["tokens"] == round(12.5 * 128 * 8 * (512 + 0.4 * 32768))


def test_release_presets_count_verls_rounds() -> None:
    """verl's epochs: 88,000 problems // 256 drawn per round = 343 rounds, 1,715 in 5 epochs (TRL's: 3,437.5)."""
    assert estimates.rl_rounds(load_config(GppoConfig, "release-math"), 88_000) == 343 * 5
    assert estimates.rl_rounds(load_config(GppoConfig, "math"), 88_000) == 5 * 88_000 / 128
    rounds = row(run(gppo_math=["schedule_unit=round", "oversample=2.0"]), "math rollouts")
    assert "(88K problems // 256 drawn per round) = 1,715 rounds" in rounds["detail"]


def test_a_round_generates_for_its_refills() -> None:
    """prompts_per_step 128 x oversample 1.5 = 192 drawn, 60 % informative = 115.2 < 128: a refill of
    12.8 x 1.5 = 19.2 (11.52 informative), then 1.28 x 1.5 = 1.92 (max_refill_rounds 2)."""
    math_rl = load_config(GppoConfig, "math", [])
    assert estimates.generated_prompts_per_round(math_rl, 0.4) == pytest.approx(192 + 19.2 + 1.92)
    assert estimates.generated_prompts_per_round(math_rl, 0.0) == 192  # enough at once: no refill
    unfiltered = load_config(GppoConfig, "math", ["filter_zero_advantage=false"])
    assert estimates.generated_prompts_per_round(unfiltered, 0.4) == 128


def test_h200_decodes_faster_and_trains_alike() -> None:
    """Sampling divides by the GPU's decode rate (GPU_FIGURES); training by its peak FLOP/s, the same GH100 chip."""
    h100, h200 = run("h100-80gb-x8"), run("h200-141gb-x8")
    fast, slow = estimates.GPU_FIGURES["h200-141gb-x8"], estimates.GPU_FIGURES["h100-80gb-x8"]
    assert fast.peak_bf16_flops == slow.peak_bf16_flops
    for ours, theirs in zip(h100["rows"], h200["rows"]):
        assert ours["tokens"] == theirs["tokens"]
    for use, ratio in (("teacher", slow.moe_671b_tokens_s / fast.moe_671b_tokens_s),
                       ("filter math", slow.moe_671b_tokens_s / fast.moe_671b_tokens_s),
                       ("reference", slow.dense_8b_tokens_s / fast.dense_8b_tokens_s),
                       ("math rollouts", slow.dense_8b_tokens_s / fast.dense_8b_tokens_s),
                       ("rl model: math", slow.dense_8b_tokens_s / fast.dense_8b_tokens_s),
                       ("sft", 1.0), ("math training", 1.0)):
        assert row(h200, use)["gpu_hours"] == pytest.approx(ratio * row(h100, use)["gpu_hours"])
    assert h200["total"]["gpu_hours"] < h100["total"]["gpu_hours"]


def test_an_unknown_cluster_is_named() -> None:
    cluster = dataclasses.replace(shapes.cluster("h100-80gb-x8"), name="a100-40gb-x8")
    with pytest.raises(ValueError, match=r"cluster 'a100-40gb-x8': no throughput figures .* GPU_FIGURES \(known: "
                                         r"h100-80gb-x8, h200-141gb-x8\)"):
        estimates.gpu_figures(cluster)
    with pytest.raises(ValueError, match="a100-40gb-x8"):
        estimates.estimate(policy=shapes.model("qwen3-8b-base"), reference_model=shapes.model("qwen3-8b"),
                           teacher_model=shapes.model("deepseek-r1-0528"), cluster=cluster)
    # figures given for it: estimated
    given = estimates.estimate(policy=shapes.model("qwen3-8b-base"), reference_model=shapes.model("qwen3-8b"),
                               teacher_model=shapes.model("deepseek-r1-0528"), cluster=cluster,
                               sft=load_config(SftConfig, "paper", []),
                               figures=estimates.GpuFigures("A100 40GB", 312e12, 800.0, 50.0, 32))
    assert given["rows"][0]["use"] == "sft" and given["gpu"]["peak_bf16_flops"] == 312e12


# --------------------------------------------------------------------------- output


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_totals_are_the_rows_sums(cluster: str) -> None:
    result = run(cluster, evaluate_code=True)
    assert result["total"]["tokens"] == sum(r["tokens"] for r in result["rows"])
    assert result["total"]["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in result["rows"]))
    assert [(r["stage"], r["use"]) for r in result["rows"]][:5] == [
        ("sample", "teacher"), ("sample", "reference"), ("sample", "filter math"), ("sample", "filter code"),
        ("sft", "sft")]
    assert all(r["tokens"] > 0 and r["gpu_hours"] > 0 for r in result["rows"])
    json.dumps(result)  # JSON-able as it is


def test_only_the_stages_given_are_estimated() -> None:
    result = estimates.estimate(policy=shapes.model("qwen3-8b-base"), reference_model=shapes.model("qwen3-8b"),
                                teacher_model=shapes.model("deepseek-r1-0528"), cluster=shapes.cluster(CLUSTERS[0]),
                                evaluation=load_config(EvaluateConfig, "paper", []), evaluated_models=("model",))
    assert [r["use"] for r in result["rows"]] == ["model model: math"]


def test_evaluation_counts_its_benchmarks_samples() -> None:
    result = run(evaluate_code=True)
    math_rows = [r for r in result["rows"] if r["use"].endswith(": math")]
    code_rows = [r for r in result["rows"] if r["use"].endswith(": code")]
    assert [r["use"] for r in math_rows] == ["base model: math", "sft model: math", "rl model: math"]
    assert len(code_rows) == 3
    assert math_rows[0]["tokens"] == round(90 * 64 * (512 + 0.5 * 32768))
    assert code_rows[0]["tokens"] == round((279 + 175) * 8 * (512 + 0.5 * 32768))
    only = run(evaluation=["only=[aime24]"])
    assert row(only, "rl model: math")["tokens"] == round(30 * 64 * (512 + 0.5 * 32768))
    longer = run(evaluation=["sampling.max_tokens=65536"])
    assert row(longer, "rl model: math")["gpu_hours"] == pytest.approx(2 * row(run(), "rl model: math")["gpu_hours"])


def test_a_benchmark_without_a_count_is_named_not_counted() -> None:
    result = run(evaluation=["benchmarks.amc23={kind: math, k: 16, title: AMC 2023}"])
    assert "not counted (no assumed problem count): amc23" in row(result, "rl model: math")["detail"]
    assert row(result, "rl model: math")["tokens"] == row(run(), "rl model: math")["tokens"]


def test_the_assumed_math_benchmark_sizes_are_the_shipped_testsets() -> None:
    problems = Assumptions().benchmark_problems
    for name in ("aime24", "aime25", "hmmt_feb_2025"):
        rows = (ROOT / "components" / "klear" / "testsets" / f"{name}.jsonl").read_text().splitlines()
        assert problems[name] == len([line for line in rows if line.strip()]), name


def test_imported_traces_take_no_gpu() -> None:
    teacher = row(run(teacher=["backend=records"]), "teacher")
    assert teacher["gpu_hours"] == 0 and "imported traces" in teacher["detail"]


def test_assumptions_are_carried_and_can_be_replaced() -> None:
    paper = run()
    assumed = paper["assumptions"]
    assert {f.name for f in dataclasses.fields(Assumptions)} == set(assumed)
    assert all(entry["why"] for entry in assumed.values())
    assert assumed["rl_math_problems"]["value"] == 88_000 and assumed["rl_code_problems"]["value"] == 18_000
    fewer = run(assumptions=Assumptions(sft_prompts=50_000))
    assert fewer["assumptions"]["sft_prompts"]["value"] == 50_000
    for use in ("teacher", "reference", "sft"):
        assert row(fewer, use)["gpu_hours"] == pytest.approx(row(paper, use)["gpu_hours"] / 2)
    assert row(fewer, "math rollouts") == row(paper, "math rollouts")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Assumptions().sft_prompts = 1  # type: ignore[misc]


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_the_table_names_every_stage_and_assumption(cluster: str) -> None:
    result = run(cluster)
    text = estimates.render_estimates(result)
    lines = text.splitlines()
    header, body = lines[0], lines[1:len(result["rows"]) + 2]
    assert header.split()[:5] == ["STAGE", "USE", "MODEL", "TOKENS", "GPU-HOURS"]
    hours_end = header.index("GPU-HOURS") + len("GPU-HOURS")
    for line, entry in zip(body, result["rows"]):
        assert line.startswith(entry["stage"]) and entry["use"] in line and entry["detail"] in line
        assert line[:hours_end].rstrip().endswith(f"{entry['gpu_hours']:,.0f}")  # right-aligned under the header
    assert body[-1].startswith("total") and body[-1][:hours_end].rstrip().endswith(
        f"{result['total']['gpu_hours']:,.0f}")
    assert f"estimates on {cluster}" in text and "not measurements" in text
    for name in result["assumptions"]:
        assert f"assumption {name} = " in text
