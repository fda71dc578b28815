"""KFP component of the evaluate stage: a thin wrapper around `klear.evaluate.stage.run` (CPU image: scoring only).

Inputs are fixed in KFP, so models come in named slots: the model under evaluation (`samples`, plus its
`code_samples` when math and code were sampled as two outputs, at n=64 and n=8), an optional `baseline` and an
optional `reference` model in the same two slots each (e.g. RL, SFT and base side by side), and `extra_samples`
("LABEL=URI" strings) for outputs already on storage.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from klear.common.config import keys_text
from klear.common.images import CPU_IMAGE
from klear.evaluate.config import EvaluateConfig

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text(EvaluateConfig, "; ")


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def evaluate(
    samples: Input[Dataset],
    benchmark_uris: list,
    preset: str,
    overrides: list,
    run_root: str,
    report: Output[HTML],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    scores: Output[Dataset],
    label: str = "model",
    code_samples: Input[Dataset] = None,
    baseline_samples: Input[Dataset] = None,
    baseline_code_samples: Input[Dataset] = None,
    baseline_label: str = "baseline",
    reference_samples: Input[Dataset] = None,
    reference_code_samples: Input[Dataset] = None,
    reference_label: str = "reference",
    extra_samples: list = [],
    name: str = "evaluate",
    input_digest: str = "",
):
    """Score saved generations on AIME24/AIME25/HMMT25 and LiveCodeBench v5/v6 under the paper's protocol.

    Args:
        samples: the evaluated model's samples (a `klear sample` output); its math samples, or all of them.
        benchmark_uris: math sets and LiveCodeBench code_generation_lite JSONL files (s3:// or paths); [] = the
            shipped AIME24/AIME25/HMMT25 only (the LiveCodeBench benchmarks are then reported as without problems).
        preset: evaluate config preset (a name in klear/evaluate/presets/) or a YAML file path.
        overrides: config overrides, "key=value" strings (e.g. "settings_check=warn", "only=[aime24]").
        run_root: where stage outputs go, `<run_root>/<run id>/evaluate`.
        report: the self-contained HTML report (tables, figures inlined), shown in the KFP UI.
        summary: report.md without figures, shown in the KFP UI.
        metrics: per benchmark pass@1 and its standard error (`<benchmark>_pass1`, `<benchmark>_stderr`; other
            labels prefixed `<label>_`), and the truncated fraction.
        scores: the published output: report.json/.md/.html, problems.parquet, judged.parquet, figures.
        label: the evaluated model's label in the report.
        code_samples: the same model's second sample output (e.g. LiveCodeBench at n=8), or none.
        baseline_samples: a model to compare with (e.g. the SFT checkpoint), or none.
        baseline_code_samples: its second sample output, or none.
        baseline_label: its label.
        reference_samples: a third model (e.g. the base model), or none.
        reference_code_samples: its second sample output, or none.
        reference_label: its label.
        extra_samples: more sample outputs already on storage, "LABEL=URI" (or "URI" for `label`).
        name: the output folder under run_root, distinct per evaluate task of one run (evaluate, evaluate-code).
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
    """
    from klear.common import kfp_io, storage
    from klear.common.config import load_config
    from klear.evaluate.config import EvaluateConfig
    from klear.evaluate.report import render_markdown
    from klear.evaluate.samples import SampleSource, parse_sample_specs
    from klear.evaluate.stage import run

    sources = []
    for source_label, artifact in ((label, samples), (label, code_samples), (baseline_label, baseline_samples),
                                   (baseline_label, baseline_code_samples), (reference_label, reference_samples),
                                   (reference_label, reference_code_samples)):
        if artifact is not None:
            sources.append(SampleSource(source_label, kfp_io.input_location(artifact)))
    sources += parse_sample_specs(list(extra_samples), label)
    target = kfp_io.output_location(run_root, name)
    result = run(sources, target, load_config(EvaluateConfig, preset, list(overrides)), list(benchmark_uris))
    kfp_io.record_output(scores, target, {"labels": ",".join(result["labels"]), "input_digest": input_digest})
    with open(report.path, "wb") as out:
        out.write(storage.read_bytes(storage.Uri.parse(target).join("report.html")))
    values = []
    for model_label, model in result["models"].items():
        prefix = "" if model_label == result["primary"] else f"{model_label}_"
        for benchmark, block in model["benchmarks"].items():
            values.append((f"{prefix}{benchmark}_pass1", round(block["pass@1"], 3)))
            if block["stderr"] is not None:
                values.append((f"{prefix}{benchmark}_stderr", round(block["stderr"], 3)))
            values.append((f"{prefix}{benchmark}_truncated", round(block["truncated"], 4)))
    kfp_io.publish_report(summary, render_markdown(result, with_figures=False), metrics, values)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def evaluation_prompts(
    benchmark_uris: list,
    preset: str,
    overrides: list,
    run_root: str,
    math_prompts: Output[Dataset],
    code_prompts: Output[Dataset],
    sampling_overrides: list = [],
    input_digest: str = "",
    # KFP reads a component's outputs from a functional NamedTuple (a class would not exist in the executor).
) -> NamedTuple("PromptOutputs", [("math_prompts_n", int), ("code_prompts_n", int),  # type: ignore[valid-type]
                                  ("math_sample_overrides", list), ("code_sample_overrides", list)]):
    """The prompts the evaluation protocol samples, for the sample component as its own pipeline step: one
    dataset per kind (each sampled at its own n), and the sample-stage overrides that pin the protocol's settings.

    Args:
        benchmark_uris: math sets and LiveCodeBench code_generation_lite JSONL files; [] = the shipped math sets.
        preset: evaluate config preset (a name in klear/evaluate/presets/) or a YAML file path.
        overrides: config overrides, "key=value" strings.
        run_root: where outputs go, `<run_root>/<run id>/evaluate-prompts-{math,code}`.
        math_prompts: `math-k<k>.jsonl` (id, prompt, benchmark): the math benchmarks' problems, k = their avg@k.
        code_prompts: `code-k<k>.jsonl`: the LiveCodeBench problems in the windows (none without LiveCodeBench files).
        sampling_overrides: sample-stage overrides of the evaluation sampling that the protocol leaves open
            (e.g. "concurrency=64", "engine_kwargs={...}"); the protocol's own settings follow them and win.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
    Returns:
        math_prompts_n, code_prompts_n: prompts in each dataset (0: do not sample that kind).
        math_sample_overrides, code_sample_overrides: "key=value" overrides for the sample component (n = k,
            temperature, top_p, top_k, repetition_penalty, max_tokens, seed, max_model_len, engine_kwargs, ...).
    """
    from collections import namedtuple

    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.evaluate.benchmarks import load_benchmarks
    from klear.evaluate.config import EvaluateConfig
    from klear.evaluate.stage import write_prompts

    config = load_config(EvaluateConfig, preset, list(overrides))
    bench = load_benchmarks(list(benchmark_uris), config)
    counts, sample_overrides = {}, {}
    for kind, artifact in (("math", math_prompts), ("code", code_prompts)):
        target = kfp_io.output_location(run_root, f"evaluate-prompts-{kind}")
        groups = write_prompts(target, config, list(benchmark_uris), kind=kind, loaded=bench)["groups"]
        group = next(iter(groups.values()), None)
        counts[kind] = group["prompts"] if group else 0
        sample_overrides[kind] = [*sampling_overrides, *group["sample_overrides"]] if group else []
        kfp_io.record_output(artifact, target, {"prompts": counts[kind], "n": group["n"] if group else 0,
                                                "input_digest": input_digest})
    PromptOutputs = namedtuple("PromptOutputs", ["math_prompts_n", "code_prompts_n", "math_sample_overrides",
                                                 "code_sample_overrides"])
    return PromptOutputs(counts["math"], counts["code"], sample_overrides["math"], sample_overrides["code"])


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def evaluation_problems(
    benchmark_uris: list,
    preset: str,
    overrides: list,
    run_root: str,
    problems: Output[Dataset],
    input_digest: str = "",
) -> str:
    """What a judge step in front of evaluate needs to judge as evaluate would itself: the problems evaluate judges
    against (its benchmarks, as it reads them) and its judge settings; evaluate then takes every verdict as it is.

    Args:
        benchmark_uris: math sets and LiveCodeBench code_generation_lite JSONL files; [] = the shipped math sets.
        preset: evaluate config preset (a name in klear/evaluate/presets/) or a YAML file path.
        overrides: evaluate config overrides, "key=value" strings (judge.* keys set the judge's).
        run_root: where the problems go, `<run_root>/<run id>/evaluate-problems`.
        problems: the published `problems.jsonl` (id, answer, tests, fn_name), the judge steps' `problems`.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.

    Returns:
        The config's `judge` section as JSON, the `settings` of the judge components.
    """
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.evaluate.config import EvaluateConfig
    from klear.evaluate.stage import write_problems
    from klear.judge.config import settings_json

    config = load_config(EvaluateConfig, preset, list(overrides))
    target = kfp_io.output_location(run_root, "evaluate-problems")
    report = write_problems(target, config, list(benchmark_uris))
    kfp_io.record_output(problems, target, {"problems": report["problems"], "input_digest": input_digest})
    return settings_json(config.judge)
