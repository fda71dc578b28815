"""KFP component of the sft-data stage: a thin wrapper around `klear.sft_data.stage.run`."""


from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from klear.common.config import keys_text
from klear.common.images import CPU_IMAGE
from klear.sft_data.config import SftDataConfig

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text(SftDataConfig, "; ")


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def sft_data(
    teacher_samples: Input[Dataset],
    preset: str,
    overrides: list,
    run_root: str,
    records: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    reference_samples: Input[Dataset] | None = None,
    target_model: Input[Model] | None = None,
    input_digest: str = "",
):
    """SFT chat records from the teacher's samples, labelled easy/hard by a reference model, filtered by policy.

    Args:
        teacher_samples: the teacher's samples (output of sample, or of judge to skip judging again).
        preset: sft-data config preset (paper, tiny) or a YAML file path; `policy` picks what is kept.
        overrides: config overrides, "key=value" strings (e.g. "policy=drop_incorrect_on_easy").
        run_root: where stage outputs go, `<run_root>/<run id>/sft-data`.
        records: the published SFT records (records/part-*.parquet) that the sft stage reads.
        summary: report.md, shown in the KFP UI.
        metrics: records read and kept, drops by reason, what each policy would keep.
        reference_samples: the reference model's samples (paper: Qwen3-8B); none = every difficulty unknown.
        target_model: the model SFT trains (its tokenizer measures lengths); none = no length filter.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
    """
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.sft_data.config import SftDataConfig
    from klear.sft_data.report import render_markdown
    from klear.sft_data.stage import run

    target = kfp_io.output_location(run_root, "sft-data")
    report = run(kfp_io.input_location(teacher_samples), target, load_config(SftDataConfig, preset, list(overrides)),
                 reference=kfp_io.input_location(reference_samples) if reference_samples is not None else None,
                 tokenizer=kfp_io.input_location(target_model) if target_model is not None else None)
    totals = report["totals"]
    kfp_io.record_output(records, target, {"records": totals["kept"], "read": totals["read"],
                                          "input_digest": input_digest})
    values = [("read", totals["read"]), ("kept", totals["kept"]), ("unlabelled", totals["unlabelled"])]
    values += [(f"dropped_{reason}", n) for reason, n in totals["dropped"].items()]
    values += [(f"would_keep_{policy}", n) for policy, n in report["would_keep"].items()]
    kfp_io.publish_report(summary, render_markdown(report), metrics, values)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def sft_data_judge_settings(preset: str, overrides: list) -> str:
    """The judge settings of sft-data (its config's `judge` section), handed to the judge step in front of it, so
    the judged rows it reads are what it would have judged itself.

    Args:
        preset: sft-data config preset (paper, tiny) or a YAML file path, as for `sft_data`.
        overrides: sft-data config overrides, "key=value" strings (judge.* keys set the judge's).

    Returns:
        The `judge` section as JSON, the `settings` of the judge components.
    """
    from klear.common.config import load_config
    from klear.judge.config import settings_json
    from klear.sft_data.config import SftDataConfig

    return settings_json(load_config(SftDataConfig, preset, list(overrides)).judge)
