"""KFP component of the rl-filter stage: a thin wrapper around `klear.rl_filter.stage.run`."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from klear.common.config import keys_text
from klear.common.images import CPU_IMAGE
from klear.rl_filter.config import RlFilterConfig

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text(RlFilterConfig, "; ")


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def rl_filter(
    problems: Input[Dataset],
    filter_samples: Input[Dataset],
    task: str,
    preset: str,
    overrides: list,
    benchmark_uris: list,
    run_root: str,
    rl_data: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    input_digest: str = "",
):
    """The RL training set: candidate problems kept when the filter model solves them reliably enough.

    Args:
        problems: candidate RL problems (curate's output: prompts/ with the source rows in `record`).
        filter_samples: the filter model's samples of them (paper: DeepSeek-R1-0120, 16 each), from sample or judge.
        task: "math" or "code" (each RL run's set), or "" for the config's task (auto: tests make a problem code).
        preset: rl-filter config preset (paper, tiny) or a YAML file path.
        overrides: config overrides, "key=value" strings (e.g. "min_tests=16", "keep_above=0.5").
        benchmark_uris: test sets for decontamination; [] = the shipped AIME24/25 and HMMT25.
        run_root: where stage outputs go, `<run_root>/<run id>/rl-filter-<task>`.
        rl_data: the published RL set (prompts/ in the gppo format, removed/ with reasons) that gppo reads.
        summary: report.md, shown in the KFP UI.
        metrics: problems read, kept, removed, and removals per reason.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
    """
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.rl_filter.config import RlFilterConfig
    from klear.rl_filter.report import render_markdown
    from klear.rl_filter.stage import run

    if task not in ("", "math", "code"):
        raise ValueError(f"task {task!r}: expected math, code or '' (the config's task)")
    target = kfp_io.output_location(run_root, f"rl-filter-{task}" if task else "rl-filter")
    report = run(kfp_io.input_location(problems), kfp_io.input_location(filter_samples), target,
                 load_config(RlFilterConfig, preset, list(overrides)), list(benchmark_uris) or None, task or None)
    totals = report["totals"]
    kfp_io.record_output(rl_data, target, {"kept": totals["kept"], "problems": totals["problems"],
                                          "input_digest": input_digest})
    removed = [(f"removed_{reason}", n) for reason, n in report["reasons"].items()]
    kfp_io.publish_report(summary, render_markdown(report), metrics, [*totals.items(), *removed])


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def rl_filter_judge_settings(preset: str, overrides: list, task: str = "") -> str:
    """The judge settings of rl-filter (its config's `judge` section), handed to the judge step in front of it,
    so the judged rows it reads are what it would have judged itself.

    Args:
        preset: rl-filter config preset (paper, tiny) or a YAML file path, as for `rl_filter`.
        overrides: rl-filter config overrides, "key=value" strings (judge.* keys set the judge's).
        task: "math" or "code": every problem judged as that task, as `rl_filter` reads them; "" = the config's.

    Returns:
        The `judge` section as JSON, the `settings` of the judge components.
    """
    from klear.common.config import load_config
    from klear.judge.config import settings_json
    from klear.rl_filter.config import RlFilterConfig

    if task not in ("", "math", "code"):
        raise ValueError(f"task {task!r}: expected math, code or '' (the config's task)")
    task_override = [f"judge.task={task}"] if task else []
    return settings_json(load_config(RlFilterConfig, preset, [*list(overrides), *task_override]).judge)
