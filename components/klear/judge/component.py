"""KFP component of the judge stage: a thin wrapper around `klear.judge.stage.run`."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from klear.common.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def judge(
    samples: Input[Dataset],
    preset: str,
    overrides: list,
    run_root: str,
    judged: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    problems_uri: str = "",
    input_digest: str = "",
):
    """Judge every sampled response against its problem; publish judged rows and per-problem pass rates.

    Args:
        samples: output of the sample stage (published `samples/part-*.parquet`).
        preset: judge config preset (paper, tiny) or a YAML file path.
        overrides: config overrides, "key=value" strings (e.g. "verifier.timeout_s=6").
        run_root: where stage outputs go, `<run_root>/<run id>/judge`.
        judged: the published output: judged/, pass_rates/, report.json, report.md, pass_rate_hist.png.
        summary: report.md, shown in the KFP UI.
        metrics: samples, problems, correct, budget overruns, scorer errors, per-task accuracy.
        problems_uri: problems by id (URI[#id=..&answer=..&tests=..]); "" = each sample's own record.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
    """
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.judge.config import JudgeConfig
    from klear.judge.report import render_markdown
    from klear.judge.stage import run

    target = kfp_io.output_location(run_root, "judge")
    report = run(kfp_io.input_location(samples), target, load_config(JudgeConfig, preset, list(overrides)),
                 problems_uri or None)
    totals = report["totals"]
    kfp_io.record_output(judged, target, {"samples": totals["samples"], "problems": totals["problems"],
                                         "input_digest": input_digest})
    accuracy = [(f"{kind}_accuracy", block["accuracy"]) for kind, block in report["per_kind"].items()
                if block["accuracy"] is not None]
    kfp_io.publish_report(summary, render_markdown(report), metrics, [*totals.items(), *accuracy])
