"""KFP component of the sample stage: a thin wrapper around `klear.sample.stage.run`."""


from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from klear.common.config import keys_text
from klear.common.images import GPU_IMAGE
from klear.sample.config import SampleConfig

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text(SampleConfig, "; ")


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def sample(
    prompts: Input[Dataset],
    endpoint: str,
    served_model: str,
    api_key_env: str,
    name: str,
    preset: str,
    overrides: list,
    run_root: str,
    samples: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    model: Input[Model] | None = None,
    model_uri: str = "",
    merge: bool = False,
    slices: list = [],
    input_digest: str = "",
):
    """n responses per prompt from a model (vLLM on the pod's GPUs, transformers on CPU) or an OpenAI-compatible
    endpoint, kept per (prompt, sample) so a retried pod samples only what is missing.

    Args:
        prompts: Prompt records: curate's output (its prompts/ are read) or a published folder of JSONL/Parquet
            files with `id` and `prompt` fields.
        endpoint: OpenAI-compatible API root (e.g. http://teacher.svc:8000/v1); empty to sample `model` instead.
        served_model: The model name the endpoint serves (its `model` field); ignored without an endpoint.
        api_key_env: Name of the environment variable holding the endpoint's API key (set it from a Kubernetes
            Secret); the key is never written anywhere. Empty for the default, OPENAI_API_KEY.
        name: What this sampling is for (teacher, reference, eval-aime24): names the output folder under
            run_root, so several sample tasks of one run do not collide.
        preset: Config preset (paper: T 0.6, top_p 0.95, 32,768 tokens, n 16; tiny: CPU demo) or a YAML path.
        overrides: Config overrides, "key=value" strings (e.g. "n=64", "max_failed_fraction=0.01").
        run_root: Object-storage root of run outputs (s3://bucket/runs); the output goes to
            <run_root>/<run id>/sample-<name>, the units as they are sampled to <run_root>/work/sample-<name>-<key>
            (keyed by prompts, model and settings), so a retried pod and a new run resume.
        samples: The published samples: samples/part-*.parquet, failed/, report.json, report.md.
        summary: The run's report: counts, settings, tokens, speed, failures.
        metrics: Sampled and failed units, tokens, samples/s and tokens/s.
        model: The model to sample (a published model folder); leave unset when sampling an endpoint.
        model_uri: The model to sample as a URI (s3://..., a path) when it is not an artifact of this run (the
            teacher, the reference or filter model of the full recipe); `model` wins when both are given.
        merge: Sample nothing: publish what the `sample_slice` tasks of this use sampled into the shared work area,
            once every unit is in a shard or recorded as failed (refused, naming the missing units, otherwise).
        slices: The slice tasks' results (dsl.Collected): what the merge waits for; recorded in the log only.
        input_digest: The content digest of the model and config files (the digest step): part of the cache key
            and of the work area's key, so a model replaced in place is sampled anew.
    """
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.sample.config import SampleConfig, work_area
    from klear.sample.report import metric_items, render_markdown
    from klear.sample.stage import run

    extra = [f"api_key_env={api_key_env}"] if api_key_env else []
    config = load_config(SampleConfig, preset, [*overrides, *extra])
    kfp_io.use_scratch()
    target = kfp_io.output_location(run_root, f"sample-{name}" if name else "sample")
    sampled = (kfp_io.input_location(model) if model is not None else model_uri or None) if not endpoint else None
    source = kfp_io.input_location(prompts)
    report = run([source], target, config, model=sampled, endpoint=endpoint or None, served_model=served_model or None,
                 merge=merge, work=work_area(run_root, name, source, sampled, endpoint, served_model, input_digest, config))
    kfp_io.record_output(samples, target, {"rows": report["units"]["rows"], "failed": report["units"]["failed"],
                                           "settings_hash": report["settings_hash"]})
    kfp_io.publish_report(summary, render_markdown(report), metrics, metric_items(report))


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def sample_slice(
    prompts: Input[Dataset],
    endpoint: str,
    served_model: str,
    api_key_env: str,
    name: str,
    preset: str,
    overrides: list,
    run_root: str,
    part: str,
    model: Input[Model] | None = None,
    model_uri: str = "",
    gpus: str = "",
    cpu: str = "",
    memory: str = "",
    input_digest: str = "",
) -> str:
    """One slice of a sampling use: the prompts whose id hashes into slice I of N, sampled into the work area
    that every slice and the merge of this use share (<run_root>/work/sample-<name>-<key>); publishes nothing.
    A second pod on the same slice is refused; a retried pod resumes from the shards.

    Args:
        prompts: Prompt records, as for `sample`.
        endpoint: OpenAI-compatible API root; empty to sample `model` instead.
        served_model: The model name the endpoint serves.
        api_key_env: Name of the environment variable holding the endpoint's API key; empty: OPENAI_API_KEY.
        name: What this sampling is for: names the output folder and so the shared work area.
        preset: Config preset or a YAML path.
        overrides: Config overrides, "key=value" strings.
        run_root: Object-storage root of run outputs (s3://bucket/runs).
        part: The slice, "I/N" (0 <= I < N).
        model: The model to sample (a published model folder); unset when sampling an endpoint.
        model_uri: The model to sample as a URI when it is not an artifact of this run.
        gpus: The pod's GPUs as the run asked (logged). The pod's size is set from the same run-time parameters;
            as task inputs they are carried into the ParallelFor, which KFP 2.17 does not do for resources alone.
        cpu: The pod's CPU as the run asked (logged).
        memory: The pod's memory as the run asked (logged).
        input_digest: The content digest of the model and config files, as for `sample`.

    Returns:
        The slice's unit counts as JSON (total, done_before, sampled, failed).
    """
    import json
    import logging

    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.sample.config import SampleConfig, work_area
    from klear.sample.stage import run

    extra = [f"api_key_env={api_key_env}"] if api_key_env else []
    config = load_config(SampleConfig, preset, [*overrides, *extra])
    kfp_io.use_scratch()
    target = kfp_io.output_location(run_root, f"sample-{name}" if name else "sample")
    logging.getLogger("klear.sample").info("slice %s of %s on a pod of %s GPUs, %s CPU, %s memory", part, target,
                                           gpus or "?", cpu or "?", memory or "?")
    sampled = (kfp_io.input_location(model) if model is not None else model_uri or None) if not endpoint else None
    source = kfp_io.input_location(prompts)
    report = run([source], target, config, model=sampled, endpoint=endpoint or None,
                 served_model=served_model or None, slice_spec=part,
                 work=work_area(run_root, name, source, sampled, endpoint, served_model, input_digest, config))
    return json.dumps({"slice": part, **report["units"]})

