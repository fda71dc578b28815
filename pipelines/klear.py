"""The Klear-Reasoner post-training DAG, read top to bottom like the paper's recipe.

    klear_pipeline       prompt sources (imported from object storage) -> curate -> sft (base model imported) -> ...
    klear_demo_pipeline  synthetic demo sources -> curate -> sft of the tiny model   (the tiny CPU preset, `make demo`)
    curate_pipeline      curate alone, from existing sources: rerun one stage on demand
    sft_pipeline         sft alone, from an existing model and SFT data (klear-sft)

Cluster-only settings (images, resources, node selectors, secrets) are set here; kfp.local
ignores them, so the very same DAG runs on a laptop CPU.
"""

from typing import NamedTuple

from kfp import dsl

from klear.curate.component import curate
from klear.demo.component import demo_data
from klear.sft.component import sft
from klear.tiny_model.component import tiny_model

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


def _sft(base_model, data, preset, run_root, gpus_per_node: int, nodes=1) -> dsl.PipelineTask:
    """Long-CoT SFT; on a GPU node: the GPU image, GPUs, a RAM-backed /dev/shm for NCCL, retries that resume."""
    from kfp import kubernetes

    task = sft(base_model=base_model, data=data, preset=preset, overrides=[], gpus_per_node=gpus_per_node,
               nodes=nodes, run_root=run_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    task.set_display_name("sft: long-CoT SFT (TRL, ZeRO-3)")
    if gpus_per_node == 0:
        return _on_cluster(task, cpu="2", memory="8Gi")
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpus_per_node)
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    task.set_retry(num_retries=3)  # a preempted pod resumes from the newest checkpoint on object storage
    return _on_cluster(task, cpu="96", memory="1600Gi")


@dsl.pipeline(name="klear-reasoner", description="Klear-Reasoner post-training recipe (arXiv 2508.07629)")
def klear_pipeline(
    sources_uri: str,
    source_files: list,
    base_model_uri: str,
    benchmark_uris: list = [],
    preset: str = "paper",
    run_root: str = "",
    sft_nodes: int = 1,
):
    """`sources_uri` is a folder on object storage; `source_files` names its files, each with an optional
    field mapping (`numina.jsonl#prompt=problem`). Empty `benchmark_uris` means the shipped AIME/HMMT sets.
    `base_model_uri`: a Hugging Face model folder on object storage (Qwen3-8B-Base)."""
    sources = dsl.importer(artifact_uri=sources_uri, artifact_class=dsl.Dataset, reimport=False)
    sources.set_display_name("prompt sources")
    curated = _curate(sources.output, source_files, benchmark_uris, preset, run_root)
    base = dsl.importer(artifact_uri=base_model_uri, artifact_class=dsl.Model, reimport=False)
    base.set_display_name("base model")
    _sft(base.output, curated.outputs["curated"], preset, run_root, gpus_per_node=8, nodes=sft_nodes)


@dsl.pipeline(name="klear-reasoner-demo", description="The recipe on synthetic data and a tiny model, for CPU")
def klear_demo_pipeline(
    math_count: int = 200, code_count: int = 16, preset: str = "tiny", run_root: str = ""
) -> NamedTuple("DemoOutputs", [("curated", dsl.Dataset), ("model", dsl.Model)]):
    demo = demo_data(math_count=math_count, code_count=code_count, seed=0, run_root=run_root,
                     run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    demo.set_display_name("demo data")
    _on_cluster(demo, cpu="1", memory="2Gi")
    curated = _curate(demo.outputs["data"], ["math.jsonl#prompt=problem", "code.jsonl#prompt=question"], [], preset,
                      run_root)
    tiny = tiny_model(run_root=run_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    tiny.set_display_name("tiny model")
    _on_cluster(tiny, cpu="1", memory="2Gi")
    tuned = _sft(tiny.outputs["model"], curated.outputs["curated"], preset, run_root, gpus_per_node=0)
    outputs = NamedTuple("DemoOutputs", [("curated", dsl.Dataset), ("model", dsl.Model)])
    return outputs(curated=curated.outputs["curated"], model=tuned.outputs["model"])


@dsl.pipeline(name="klear-curate", description="Rerun the curate stage alone on existing prompt sources")
def curate_pipeline(
    sources_uri: str, source_files: list, benchmark_uris: list = [], preset: str = "paper", run_root: str = ""
) -> dsl.Dataset:
    sources = dsl.importer(artifact_uri=sources_uri, artifact_class=dsl.Dataset, reimport=False)
    return _curate(sources.output, source_files, benchmark_uris, preset, run_root).outputs["curated"]


@dsl.pipeline(name="klear-sft", description="Rerun the SFT stage alone on an existing model and SFT data")
def sft_pipeline(
    base_model_uri: str, data_uri: str, preset: str = "paper", run_root: str = "", gpus_per_node: int = 8,
    nodes: int = 1,
) -> dsl.Model:
    from kfp import kubernetes

    base = dsl.importer(artifact_uri=base_model_uri, artifact_class=dsl.Model, reimport=False)
    data = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset, reimport=False)
    task = sft(base_model=base.output, data=data.output, preset=preset, overrides=[], gpus_per_node=gpus_per_node,
               nodes=nodes, run_root=run_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    task.set_display_name("sft: long-CoT SFT (TRL, ZeRO-3)")
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpus_per_node)
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    task.set_retry(num_retries=3)
    return _on_cluster(task, cpu="8", memory="64Gi").outputs["model"]


PIPELINES = {
    "klear-reasoner": klear_pipeline,
    "klear-reasoner-demo": klear_demo_pipeline,
    "klear-curate": curate_pipeline,
    "klear-sft": sft_pipeline,
}
