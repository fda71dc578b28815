"""KFP components of the judge stage: thin wrappers around `klear.judge.stage.run` (whole, a slice, the merge)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from klear.common.config import keys_text
from klear.common.images import CPU_IMAGE
from klear.judge.config import JudgeConfig

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text(JudgeConfig, "; ")


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def judge(
    samples: Input[Dataset],
    run_root: str,
    judged: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    preset: str = "",
    overrides: list = [],
    settings: str = "",
    problems_uri: str = "",
    input_digest: str = "",
    problems: Input[Dataset] | None = None,
    name: str = "",
    merge: bool = False,
    slices: list = [],
):
    """Judge every sampled response against its problem; publish judged rows and per-problem pass rates.

    Args:
        samples: output of the sample stage (published `samples/part-*.parquet`).
        run_root: where stage outputs go, `<run_root>/<run id>/judge` (`judge-<name>` with a name).
        judged: the published output: judged/, pass_rates/, report.json, report.md, pass_rate_hist.png.
        summary: report.md, shown in the KFP UI.
        metrics: samples, problems, correct, budget overruns, scorer errors, per-task accuracy.
        preset: judge config preset (paper, tiny) or a YAML file path; "" = the defaults. Not with `settings`.
        overrides: judge config overrides, "key=value" strings (e.g. "verifier.timeout_s=6"). Not with `settings`.
        settings: the judge settings the stage that reads the judged rows handed over (the JSON of its config's
            `judge` section, from its judge-settings step), so it gets what it would have judged itself; "" = a
            judge config from `preset` and `overrides`.
        problems_uri: problems by id (URI[#id=..&answer=..&tests=..]); "" = each sample's own record.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
        problems: problems by id as an artifact of the run (wins over problems_uri): the candidate RL problems,
            or the problems evaluate judges against (its benchmarks, from its problems step).
        name: what is judged (reference, filter-math): names the output folder and the slices' work area
            (<run_root>/work/judge-<name>-<key>, keyed by the samples, problems and input_digest).
        merge: judge nothing: publish what the `judge_slice` tasks of this use judged, once every slice's part is
            there (refused, naming the missing slices or samples, otherwise).
        slices: the slice tasks' results (dsl.Collected): what the merge waits for; recorded in the log only.
    """
    from klear.common import kfp_io
    from klear.judge.config import judge_config, work_area
    from klear.judge.report import render_markdown
    from klear.judge.stage import run

    kfp_io.use_scratch()
    target = kfp_io.output_location(run_root, f"judge-{name}" if name else "judge")
    problem_spec = kfp_io.input_location(problems) if problems is not None else problems_uri or None
    source = kfp_io.input_location(samples)
    report = run(source, target, judge_config(settings, preset, list(overrides)), problem_spec, merge=merge,
                 work=work_area(run_root, name, source, problem_spec, input_digest))
    totals = report["totals"]
    kfp_io.record_output(judged, target, {"samples": totals["samples"], "problems": totals["problems"],
                                         "input_digest": input_digest})
    accuracy = [(f"{kind}_accuracy", block["accuracy"]) for kind, block in report["per_kind"].items()
                if block["accuracy"] is not None]
    kfp_io.publish_report(summary, render_markdown(report), metrics, [*totals.items(), *accuracy])


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def judge_slice(
    samples: Input[Dataset],
    run_root: str,
    name: str,
    part: str,
    preset: str = "",
    overrides: list = [],
    settings: str = "",
    problems: Input[Dataset] | None = None,
    problems_uri: str = "",
    cpu: str = "",
    input_digest: str = "",
) -> str:
    """One slice of a judging use: the samples whose id hashes into slice I of N, judged into the work area that
    every slice and the merge of this use share (<run_root>/work/judge-<name>-<key>); publishes nothing. A
    second pod on the same slice is refused; a retried pod reuses the scores it saved.

    Args:
        samples: sample rows, as for `judge`.
        run_root: object-storage root of run outputs (s3://bucket/runs).
        name: what is judged: names the output folder and so the shared work area.
        part: the slice, "I/N" (0 <= I < N).
        preset: judge config preset or a YAML path; "" = the defaults. Not with `settings`.
        overrides: judge config overrides, "key=value" strings. Not with `settings`.
        settings: the judge settings handed over by the stage that reads the judged rows, as for `judge`.
        problems: problems by id as an artifact of the run (wins over problems_uri).
        problems_uri: problems by id as a URI; "" = each sample's own record.
        cpu: the pod's CPU as the run asked (logged). As a task input it is carried into the ParallelFor, which
            KFP 2.17 does not do for resources alone; the judge's workers follow the pod's cores.
        input_digest: the content digest of the inputs, as for `judge`: part of the cache key and the work area's.

    Returns:
        The slice's counts as JSON (slice, samples, reused).
    """
    import json
    import logging

    from klear.common import kfp_io
    from klear.judge.config import judge_config, work_area
    from klear.judge.stage import run

    target = kfp_io.output_location(run_root, f"judge-{name}" if name else "judge")
    logging.getLogger("klear.judge").info("slice %s of %s on a pod of %s CPU", part, target, cpu or "?")
    problem_spec = kfp_io.input_location(problems) if problems is not None else problems_uri or None
    source = kfp_io.input_location(samples)
    report = run(source, target, judge_config(settings, preset, list(overrides)), problem_spec, slice_spec=part,
                 work=work_area(run_root, name, source, problem_spec, input_digest))
    return json.dumps({key: report[key] for key in ("slice", "samples", "reused")})
