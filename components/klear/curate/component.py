"""KFP component of the curate stage: a thin wrapper around `klear.curate.stage.run`."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from klear.common.config import keys_text
from klear.common.images import CPU_IMAGE
from klear.curate.config import CurateConfig

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text(CurateConfig, "; ")


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def curate(
    source_data: Input[Dataset],
    source_files: list,
    benchmark_uris: list,
    preset: str,
    overrides: list,
    run_root: str,
    curated: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    input_digest: str = "",
):
    """Exact dedup and n-gram decontamination of the prompt sources in `source_data`.

    Args:
        source_data: the folder holding the prompt sources (imported by the pipeline).
        source_files: the source files under `source_data`, each "FILE" or "FILE#field=value&..." (see klear curate).
        benchmark_uris: test sets to decontaminate against (JSONL/Parquet URIs); [] = the shipped AIME and HMMT sets.
        preset: curate config preset (paper, tiny) or a YAML file path.
        overrides: curate config overrides, "key=value" strings (`klear curate --help-keys` lists the keys).
        run_root: where stage outputs go, `<run_root>/<run id>/curate`.
        curated: the published output: the kept prompts, report.json, report.md.
        summary: report.md, shown in the KFP UI.
        metrics: prompts read, kept and removed, and the count per removal reason.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
    """
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.curate.config import CurateConfig
    from klear.curate.report import render_markdown
    from klear.curate.stage import run

    root = kfp_io.input_location(source_data).rstrip("/")
    sources = [f"{root}/{name}" for name in source_files]
    target = kfp_io.output_location(run_root, "curate")
    report = run(sources, target, load_config(CurateConfig, preset, overrides), benchmark_uris or None)
    kfp_io.record_output(curated, target, {"kept": report["totals"]["kept"], "read": report["totals"]["read"],
                                             "input_digest": input_digest})
    kfp_io.publish_report(summary, render_markdown(report), metrics, report["totals"].items())
