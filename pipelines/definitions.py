"""The Klear-Reasoner post-training DAG, read top to bottom like the paper's recipe.

    klear_pipeline       prompt sources -> curate -> sft (base model imported) -> gppo_math -> gppo_code
                         (RL prompt sets imported from object storage)
    klear_demo_pipeline  synthetic demo sources -> curate -> sft of the tiny model -> gppo_math -> gppo_code
                         (the tiny CPU presets, `make demo`)
    curate_pipeline      curate alone, from existing sources: rerun one stage on demand
    sft_pipeline         sft alone, from an existing model and SFT data (klear-sft)
    gppo_math_pipeline   math RL alone, from an existing model and RL prompts (klear-gppo-math)
    gppo_code_pipeline   code RL alone (klear-gppo-code)

Cluster-only settings (images, resources, node selectors, secrets) are set here; kfp.local
ignores them, so the very same DAG runs on a laptop CPU.
"""

from typing import NamedTuple

from kfp import dsl

from klear.curate.component import curate
from klear.gppo.component import gppo_code, gppo_math
from klear.sft.component import sft
from klear.demo.component import demo_data, tiny_model

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


def _on_gpus(task: dsl.PipelineTask, gpus_per_node: int) -> dsl.PipelineTask:
    """A training stage: on CPU small resources; on a GPU node the GPUs, a RAM-backed /dev/shm for NCCL and
    retries (a preempted pod resumes from the newest checkpoint on object storage)."""
    from kfp import kubernetes

    if isinstance(gpus_per_node, int) and gpus_per_node == 0:  # (a pipeline parameter is decided at run time)
        return _on_cluster(task, cpu="2", memory="8Gi")
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpus_per_node)
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    task.set_retry(num_retries=3)
    return _on_cluster(task, cpu="96", memory="1600Gi")


def _sft(base_model, data, preset, run_root, gpus_per_node: int, nodes=1) -> dsl.PipelineTask:
    task = sft(base_model=base_model, data=data, preset=preset, overrides=[], gpus_per_node=gpus_per_node,
               nodes=nodes, run_root=run_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    task.set_display_name("sft: long-CoT SFT (TRL, ZeRO-3)")
    return _on_gpus(task, gpus_per_node)


def _gppo(component, policy, data, preset, run_root, gpus_per_node: int, nodes=1, overrides=[]) -> dsl.PipelineTask:
    task = component(policy=policy, data=data, preset=preset, overrides=overrides, gpus_per_node=gpus_per_node, nodes=nodes,
                     run_root=run_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    task.set_display_name(f"{'math' if component is gppo_math else 'code'} RL: GPPO (TRL + vLLM)")
    return _on_gpus(task, gpus_per_node)


@dsl.pipeline(name="klear-reasoner", description="Klear-Reasoner post-training recipe (arXiv 2508.07629)")
def klear_pipeline(
    sources_uri: str,
    source_files: list,
    base_model_uri: str,
    benchmark_uris: list = [],
    preset: str = "paper",
    run_root: str = "",
    rl_math_uri: str = "",
    rl_code_uri: str = "",
    sft_nodes: int = 1,
    rl_nodes: int = 1,
    gppo_math_preset: str = "math",
    gppo_code_preset: str = "code",
):
    """`sources_uri` is a folder on object storage; `source_files` names its files, each with an optional
    field mapping (`numina.jsonl#prompt=problem`). Empty `benchmark_uris` means the shipped AIME/HMMT sets.
    `base_model_uri`: a Hugging Face model folder on object storage (Qwen3-8B-Base). `rl_math_uri` and
    `rl_code_uri`: the RL prompt sets (math with `answer`, code with `tests`), files or published outputs."""
    sources = dsl.importer(artifact_uri=sources_uri, artifact_class=dsl.Dataset, reimport=False)
    sources.set_display_name("prompt sources")
    curated = _curate(sources.output, source_files, benchmark_uris, preset, run_root)
    base = dsl.importer(artifact_uri=base_model_uri, artifact_class=dsl.Model, reimport=False)
    base.set_display_name("base model")
    tuned = _sft(base.output, curated.outputs["curated"], preset, run_root, gpus_per_node=8, nodes=sft_nodes)
    rl_math = dsl.importer(artifact_uri=rl_math_uri, artifact_class=dsl.Dataset, reimport=False)
    rl_math.set_display_name("math RL prompts")
    math_rl = _gppo(gppo_math, tuned.outputs["model"], rl_math.output, gppo_math_preset, run_root, 8, rl_nodes)
    rl_code = dsl.importer(artifact_uri=rl_code_uri, artifact_class=dsl.Dataset, reimport=False)
    rl_code.set_display_name("code RL prompts")
    _gppo(gppo_code, math_rl.outputs["model"], rl_code.output, gppo_code_preset, run_root, 8, rl_nodes)


@dsl.pipeline(name="klear-reasoner-demo", description="The recipe on synthetic data and a tiny model, for CPU")
def klear_demo_pipeline(
    math_count: int = 200, code_count: int = 16, preset: str = "tiny", run_root: str = "",
    gppo_math_preset: str = "tiny-math", gppo_code_preset: str = "tiny-code",
) -> NamedTuple("DemoOutputs", [("curated", dsl.Dataset), ("sft_model", dsl.Model), ("model", dsl.Model)]):
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
    # The curated prompts hold both kinds: math RL keeps those with an answer, code RL those with tests.
    math_rl = _gppo(gppo_math, tuned.outputs["model"], curated.outputs["curated"], gppo_math_preset, run_root, 0)
    code_rl = _gppo(gppo_code, math_rl.outputs["model"], curated.outputs["curated"], gppo_code_preset, run_root, 0)
    outputs = NamedTuple("DemoOutputs", [("curated", dsl.Dataset), ("sft_model", dsl.Model), ("model", dsl.Model)])
    return outputs(curated=curated.outputs["curated"], sft_model=tuned.outputs["model"], model=code_rl.outputs["model"])


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
    base = dsl.importer(artifact_uri=base_model_uri, artifact_class=dsl.Model, reimport=False)
    data = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset, reimport=False)
    return _sft(base.output, data.output, preset, run_root, gpus_per_node, nodes).outputs["model"]


def _rl_rerun(component, model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes) -> dsl.Model:
    policy = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=False)
    data = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset, reimport=False)
    return _gppo(component, policy.output, data.output, preset, run_root, gpus_per_node, nodes, overrides).outputs["model"]


@dsl.pipeline(name="klear-gppo-math", description="Rerun math RL alone on an existing model and math RL prompts")
def gppo_math_pipeline(
    model_uri: str, data_uri: str, preset: str = "math", overrides: list = [], run_root: str = "",
    gpus_per_node: int = 8, nodes: int = 1,
) -> dsl.Model:
    """`overrides` are config `key=value` pairs, e.g. ["loss=cispo"] for an ablation arm."""
    return _rl_rerun(gppo_math, model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes)


@dsl.pipeline(name="klear-gppo-code", description="Rerun code RL alone on an existing model and code RL prompts")
def gppo_code_pipeline(
    model_uri: str, data_uri: str, preset: str = "code", overrides: list = [], run_root: str = "",
    gpus_per_node: int = 8, nodes: int = 1,
) -> dsl.Model:
    """`overrides` are config `key=value` pairs, e.g. ["loss=clip_higher"] for an ablation arm."""
    return _rl_rerun(gppo_code, model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes)


PIPELINES = {
    "klear-reasoner": klear_pipeline,
    "klear-reasoner-demo": klear_demo_pipeline,
    "klear-curate": curate_pipeline,
    "klear-sft": sft_pipeline,
    "klear-gppo-math": gppo_math_pipeline,
    "klear-gppo-code": gppo_code_pipeline,
}
