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
    preset: str,
    overrides: list,
    run_root: str,
    judged: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    problems_uri: str = "",
    input_digest: str = "",
    problems: Input[Dataset] | None = None,
    name: str = "",
    config_of: str = "",
    merge: bool = False,
    slices: list = [],
    task: str = "",
    benchmark_uris: list = [],
):
    """Judge every sampled response against its problem; publish judged rows and per-problem pass rates.

    Args:
        samples: output of the sample stage (published `samples/part-*.parquet`).
        preset: judge config preset (paper, tiny) or a YAML file path; with `config_of`, that stage's preset.
        overrides: config overrides, "key=value" strings (e.g. "verifier.timeout_s=6").
        run_root: where stage outputs go, `<run_root>/<run id>/judge` (`judge-<name>` with a name).
        judged: the published output: judged/, pass_rates/, report.json, report.md, pass_rate_hist.png.
        summary: report.md, shown in the KFP UI.
        metrics: samples, problems, correct, budget overruns, scorer errors, per-task accuracy.
        problems_uri: problems by id (URI[#id=..&answer=..&tests=..]); "" = each sample's own record.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
        problems: problems by id as an artifact of the run (wins over problems_uri).
        name: what is judged (reference, filter-math): names the output folder and the slices' work area
            (<run_root>/work/judge-<name>-<key>, keyed by the samples, problems and input_digest).
        config_of: judge with the `judge` settings of this stage's config (sft-data, rl-filter, evaluate), so the
            stage that reads the judged rows gets what it would have judged itself; "" = a judge config.
        merge: judge nothing: publish what the `judge_slice` tasks of this use judged, once every slice's part is
            there (refused, naming the missing slices or samples, otherwise).
        slices: the slice tasks' results (dsl.Collected): what the merge waits for; recorded in the log only.
        task: judge every problem as this task (math, code), as rl-filter does with its --task; "" = the config's.
        benchmark_uris: with `config_of` evaluate and no problems: the benchmarks whose problems evaluate judges
            against ([] = the shipped math sets), read as evaluate reads them, so it reuses every verdict.
    """
    from klear.common import kfp_io
    from klear.judge.config import work_area
    from klear.judge.report import render_markdown
    from klear.judge.stage import problems_of, run, stage_judge_config

    kfp_io.use_scratch()
    target = kfp_io.output_location(run_root, f"judge-{name}" if name else "judge")
    problem_spec = kfp_io.input_location(problems) if problems is not None else problems_uri or None
    given = None if problem_spec else problems_of(config_of, preset, list(overrides), list(benchmark_uris))
    source = kfp_io.input_location(samples)
    report = run(source, target, stage_judge_config(config_of, preset, list(overrides), task), problem_spec,
                 merge=merge, stage_problems=given,
                 work=work_area(run_root, name, source, problem_spec, benchmark_uris, config_of, task, input_digest))
    totals = report["totals"]
    kfp_io.record_output(judged, target, {"samples": totals["samples"], "problems": totals["problems"],
                                         "input_digest": input_digest})
    accuracy = [(f"{kind}_accuracy", block["accuracy"]) for kind, block in report["per_kind"].items()
                if block["accuracy"] is not None]
    kfp_io.publish_report(summary, render_markdown(report), metrics, [*totals.items(), *accuracy])


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def judge_slice(
    samples: Input[Dataset],
    preset: str,
    overrides: list,
    run_root: str,
    name: str,
    part: str,
    problems: Input[Dataset] | None = None,
    problems_uri: str = "",
    config_of: str = "",
    task: str = "",
    cpu: str = "",
    benchmark_uris: list = [],
    input_digest: str = "",
) -> str:
    """One slice of a judging use: the samples whose id hashes into slice I of N, judged into the work area that
    every slice and the merge of this use share (<run_root>/work/judge-<name>-<key>); publishes nothing. A
    second pod on the same slice is refused; a retried pod reuses the scores it saved.

    Args:
        samples: sample rows, as for `judge`.
        preset: config preset (of `config_of`'s stage, if given) or a YAML path.
        overrides: config overrides, "key=value" strings.
        run_root: object-storage root of run outputs (s3://bucket/runs).
        name: what is judged: names the output folder and so the shared work area.
        part: the slice, "I/N" (0 <= I < N).
        problems: problems by id as an artifact of the run (wins over problems_uri).
        problems_uri: problems by id as a URI; "" = each sample's own record.
        config_of: judge with the `judge` settings of this stage's config (sft-data, rl-filter, evaluate).
        task: judge every problem as this task (math, code); "" = the config's.
        cpu: the pod's CPU as the run asked (logged). As a task input it is carried into the ParallelFor, which
            KFP 2.17 does not do for resources alone; the judge's workers follow the pod's cores.
        benchmark_uris: with `config_of` evaluate and no problems: evaluate's benchmarks, as for `judge`.
        input_digest: the content digest of the inputs, as for `judge`: part of the cache key and the work area's.

    Returns:
        The slice's counts as JSON (slice, samples, reused).
    """
    import json
    import logging

    from klear.common import kfp_io
    from klear.judge.config import work_area
    from klear.judge.stage import problems_of, run, stage_judge_config

    target = kfp_io.output_location(run_root, f"judge-{name}" if name else "judge")
    logging.getLogger("klear.judge").info("slice %s of %s on a pod of %s CPU", part, target, cpu or "?")
    problem_spec = kfp_io.input_location(problems) if problems is not None else problems_uri or None
    given = None if problem_spec else problems_of(config_of, preset, list(overrides), list(benchmark_uris))
    source = kfp_io.input_location(samples)
    report = run(source, target, stage_judge_config(config_of, preset, list(overrides), task), problem_spec,
                 slice_spec=part, stage_problems=given,
                 work=work_area(run_root, name, source, problem_spec, benchmark_uris, config_of, task, input_digest))
    return json.dumps({key: report[key] for key in ("slice", "samples", "reused")})
