"""The Klear-Reasoner post-training DAG, read top to bottom like the paper's recipe.

    klear_pipeline       prompt sources (imported from object storage) -> curate -> ...
    klear_demo_pipeline  synthetic demo sources -> curate -> ...   (the tiny CPU preset, `make demo`)
    curate_pipeline      curate alone, from existing sources: rerun one stage on demand

Cluster-only settings (images, resources, node selectors, secrets) are set here; kfp.local
ignores them, so the very same DAG runs on a laptop CPU.
"""

from kfp import dsl

from klear.curate.component import curate
from klear.demo.component import demo_data

S3_SECRET = "klear-s3"  # created by the Helm chart in charts/: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL


def _on_cluster(task: dsl.PipelineTask, cpu: str, memory: str) -> dsl.PipelineTask:
    """Resources and S3 credentials of a CPU stage; kfp.local ignores all of it."""
    from kfp import kubernetes

    task.set_cpu_request(cpu).set_cpu_limit(cpu).set_memory_request(memory).set_memory_limit(memory)
    kubernetes.use_secret_as_env(
        task,
        secret_name=S3_SECRET,
        secret_key_to_env={k: k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")},
    )
    return task


def _curate(source_data, source_files, benchmark_uris, preset, run_root) -> dsl.PipelineTask:
    task = curate(
        source_data=source_data,
        source_files=source_files,
        benchmark_uris=benchmark_uris,
        preset=preset,
        overrides=[],
        run_root=run_root,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    )
    task.set_display_name("curate: dedup + 9-gram decontamination")
    return _on_cluster(task, cpu="16", memory="32Gi")


@dsl.pipeline(name="klear-reasoner", description="Klear-Reasoner post-training recipe (arXiv 2508.07629)")
def klear_pipeline(
    sources_uri: str,
    source_files: list,
    benchmark_uris: list = [],
    preset: str = "paper",
    run_root: str = "",
):
    """`sources_uri` is a folder on object storage; `source_files` names its files, each with an optional
    field mapping (`numina.jsonl#prompt=problem`). Empty `benchmark_uris` means the shipped AIME/HMMT sets."""
    sources = dsl.importer(artifact_uri=sources_uri, artifact_class=dsl.Dataset, reimport=False)
    sources.set_display_name("prompt sources")
    _curate(sources.output, source_files, benchmark_uris, preset, run_root)


@dsl.pipeline(name="klear-reasoner-demo", description="The recipe on synthetic data and a tiny model, for CPU")
def klear_demo_pipeline(
    math_count: int = 200, code_count: int = 16, preset: str = "tiny", run_root: str = ""
) -> dsl.Dataset:
    demo = demo_data(math_count=math_count, code_count=code_count, seed=0, run_root=run_root,
                     run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    demo.set_display_name("demo data")
    _on_cluster(demo, cpu="1", memory="2Gi")
    curated = _curate(demo.outputs["data"], ["math.jsonl#prompt=problem", "code.jsonl#prompt=question"], [], preset,
                      run_root)
    return curated.outputs["curated"]


@dsl.pipeline(name="klear-curate", description="Rerun the curate stage alone on existing prompt sources")
def curate_pipeline(
    sources_uri: str, source_files: list, benchmark_uris: list = [], preset: str = "paper", run_root: str = ""
) -> dsl.Dataset:
    sources = dsl.importer(artifact_uri=sources_uri, artifact_class=dsl.Dataset, reimport=False)
    return _curate(sources.output, source_files, benchmark_uris, preset, run_root).outputs["curated"]


PIPELINES = {
    "klear-reasoner": klear_pipeline,
    "klear-reasoner-demo": klear_demo_pipeline,
    "klear-curate": curate_pipeline,
}
