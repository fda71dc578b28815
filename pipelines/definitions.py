"""The Klear-Reasoner post-training DAG, read top to bottom like the paper's recipe.

    klear_pipeline       prompt sources -> curate -> sft (base model imported) -> math RL -> code RL
                         (RL prompt sets imported from object storage)
    klear_demo_pipeline  synthetic demo sources -> curate -> sft of the tiny model -> math RL -> code RL
                         (the tiny CPU presets, `make demo`)
    curate_pipeline      curate alone, from existing sources: rerun one stage on demand
    sft_pipeline         sft alone, from an existing model and SFT data (klear-sft)
    gppo_math_pipeline   math RL alone, from an existing model and RL prompts (klear-gppo-math)
    gppo_code_pipeline   code RL alone (klear-gppo-code)

Math RL and code RL are the one `gppo` component with `task="math"` / `task="code"`.

Cluster-only settings (images, resources, node selectors, secrets) are set here; kfp.local
ignores them, so the very same DAG runs on a laptop CPU.

Resources of the training stages are decided at run time: GPUs per node, CPU and memory are
pipeline parameters (strings, the only kind the KFP driver resolves into a pod's resources), and
the same GPU parameter tells the component how many processes to launch. A run with
`*_gpus_per_node` = "0" trains on CPU in the component's pod (then lower `*_cpu` / `*_memory` too).
The demo pipeline is CPU-only and requests no accelerator at all.
"""

from typing import NamedTuple

from kfp import dsl

from klear.curate.component import curate
from klear.gppo.component import gppo
from klear.sft.component import sft
from klear.demo.component import demo_data, tiny_model

S3_SECRET = "klear-s3"  # created by the Helm chart in charts/: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL
GPU_RESOURCE = "nvidia.com/gpu"
# Defaults of one 8-GPU training node (H100/H200 class): what the recipe needs, well below what such a node has.
GPUS, SFT_CPU, RL_CPU, NODE_MEMORY = "8", "64", "96", "512Gi"  # RL scores rollouts on CPU workers: more cores
CPU_TRAINING = ("2", "8Gi")  # the demo's tiny presets


def _on_cluster(task: dsl.PipelineTask, cpu, memory) -> dsl.PipelineTask:
    """Resources (constants or string pipeline parameters) and S3 credentials of a stage; kfp.local ignores them."""
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


def _on_training_node(task: dsl.PipelineTask, gpus, cpu, memory) -> dsl.PipelineTask:
    """A training stage on a GPU node, sized at run time by (string) pipeline parameters: the GPUs, CPU and
    memory, a RAM-backed /dev/shm for NCCL, and retries (a preempted pod resumes from the newest checkpoint on
    object storage). "0" GPUs still schedules (a zero GPU limit) and trains on CPU in the pod."""
    from kfp import kubernetes

    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(gpus)
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    task.set_retry(num_retries=3)
    return _on_cluster(task, cpu, memory)


def _on_cpu(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """A training stage of the CPU demo: small resources, no accelerator requested at all."""
    return _on_cluster(task, *CPU_TRAINING)


def _sft(base_model, data, preset, run_root, gpus_per_node, nodes=1) -> dsl.PipelineTask:
    task = sft(base_model=base_model, data=data, preset=preset, overrides=[], gpus_per_node=gpus_per_node,
               nodes=nodes, run_root=run_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    return task.set_display_name("sft: long-CoT SFT (TRL, ZeRO-3)")


def _gppo(rl_task: str, policy, data, preset, run_root, gpus_per_node, nodes=1, overrides=[]) -> dsl.PipelineTask:
    """One RL run of the paper with the one gppo component: rl_task "math" (after SFT) or "code" (after math RL)."""
    task = gppo(policy=policy, data=data, task=rl_task, preset=preset, overrides=overrides, gpus_per_node=gpus_per_node,
                nodes=nodes, run_root=run_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    return task.set_display_name(f"{rl_task} RL: GPPO (TRL + vLLM)")


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
    sft_gpus_per_node: str = GPUS,
    sft_cpu: str = SFT_CPU,
    sft_memory: str = NODE_MEMORY,
    rl_gpus_per_node: str = GPUS,
    rl_cpu: str = RL_CPU,
    rl_memory: str = NODE_MEMORY,
):
    """`sources_uri` is a folder on object storage; `source_files` names its files, each with an optional
    field mapping (`numina.jsonl#prompt=problem`). Empty `benchmark_uris` means the shipped AIME/HMMT sets.
    `base_model_uri`: a Hugging Face model folder on object storage (Qwen3-8B-Base). `rl_math_uri` and
    `rl_code_uri`: the RL prompt sets (math with `answer`, code with `tests`), files or published outputs.
    `sft_*` / `rl_*`: GPUs (a whole number), CPU and memory (Kubernetes quantities) of each training node."""
    sources = dsl.importer(artifact_uri=sources_uri, artifact_class=dsl.Dataset, reimport=False)
    sources.set_display_name("prompt sources")
    curated = _curate(sources.output, source_files, benchmark_uris, preset, run_root)
    base = dsl.importer(artifact_uri=base_model_uri, artifact_class=dsl.Model, reimport=False)
    base.set_display_name("base model")
    tuned = _on_training_node(_sft(base.output, curated.outputs["curated"], preset, run_root, sft_gpus_per_node,
                                   sft_nodes), sft_gpus_per_node, sft_cpu, sft_memory)
    rl_math = dsl.importer(artifact_uri=rl_math_uri, artifact_class=dsl.Dataset, reimport=False)
    rl_math.set_display_name("math RL prompts")
    math_rl = _on_training_node(_gppo("math", tuned.outputs["model"], rl_math.output, gppo_math_preset, run_root,
                                      rl_gpus_per_node, rl_nodes), rl_gpus_per_node, rl_cpu, rl_memory)
    rl_code = dsl.importer(artifact_uri=rl_code_uri, artifact_class=dsl.Dataset, reimport=False)
    rl_code.set_display_name("code RL prompts")
    _on_training_node(_gppo("code", math_rl.outputs["model"], rl_code.output, gppo_code_preset, run_root,
                            rl_gpus_per_node, rl_nodes), rl_gpus_per_node, rl_cpu, rl_memory)


class DemoOutputs(NamedTuple):
    curated: dsl.Dataset
    sft_model: dsl.Model
    model: dsl.Model


@dsl.pipeline(name="klear-reasoner-demo", description="The recipe on synthetic data and a tiny model, for CPU")
def klear_demo_pipeline(
    math_count: int = 200, code_count: int = 16, preset: str = "tiny", run_root: str = "",
    gppo_math_preset: str = "tiny-math", gppo_code_preset: str = "tiny-code",
) -> DemoOutputs:
    demo = demo_data(math_count=math_count, code_count=code_count, seed=0, run_root=run_root,
                     run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    demo.set_display_name("demo data")
    _on_cluster(demo, cpu="1", memory="2Gi")
    curated = _curate(demo.outputs["data"], ["math.jsonl#prompt=problem", "code.jsonl#prompt=question"], [], preset,
                      run_root)
    tiny = tiny_model(run_root=run_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    tiny.set_display_name("tiny model")
    _on_cluster(tiny, cpu="1", memory="2Gi")
    tuned = _on_cpu(_sft(tiny.outputs["model"], curated.outputs["curated"], preset, run_root, gpus_per_node="0"))
    # The curated prompts hold both kinds: math RL keeps those with an answer, code RL those with tests.
    math_rl = _on_cpu(_gppo("math", tuned.outputs["model"], curated.outputs["curated"], gppo_math_preset, run_root, "0"))
    code_rl = _on_cpu(_gppo("code", math_rl.outputs["model"], curated.outputs["curated"], gppo_code_preset, run_root,
                            "0"))
    return DemoOutputs(curated=curated.outputs["curated"], sft_model=tuned.outputs["model"], model=code_rl.outputs["model"])


@dsl.pipeline(name="klear-curate", description="Rerun the curate stage alone on existing prompt sources")
def curate_pipeline(
    sources_uri: str, source_files: list, benchmark_uris: list = [], preset: str = "paper", run_root: str = ""
) -> dsl.Dataset:
    sources = dsl.importer(artifact_uri=sources_uri, artifact_class=dsl.Dataset, reimport=False)
    return _curate(sources.output, source_files, benchmark_uris, preset, run_root).outputs["curated"]


@dsl.pipeline(name="klear-sft", description="Rerun the SFT stage alone on an existing model and SFT data")
def sft_pipeline(
    base_model_uri: str, data_uri: str, preset: str = "paper", run_root: str = "", gpus_per_node: str = GPUS,
    nodes: int = 1, cpu: str = SFT_CPU, memory: str = NODE_MEMORY,
) -> dsl.Model:
    """`gpus_per_node` (a whole number), `cpu` and `memory` (Kubernetes quantities) size each training node."""
    base = dsl.importer(artifact_uri=base_model_uri, artifact_class=dsl.Model, reimport=False)
    data = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset, reimport=False)
    task = _sft(base.output, data.output, preset, run_root, gpus_per_node, nodes)
    return _on_training_node(task, gpus_per_node, cpu, memory).outputs["model"]


def _rl_rerun(rl_task, model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes, cpu, memory) -> dsl.Model:
    policy = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=False)
    data = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset, reimport=False)
    task = _gppo(rl_task, policy.output, data.output, preset, run_root, gpus_per_node, nodes, overrides)
    return _on_training_node(task, gpus_per_node, cpu, memory).outputs["model"]


@dsl.pipeline(name="klear-gppo-math", description="Rerun math RL alone on an existing model and math RL prompts")
def gppo_math_pipeline(
    model_uri: str, data_uri: str, preset: str = "math", overrides: list = [], run_root: str = "",
    gpus_per_node: str = GPUS, nodes: int = 1, cpu: str = RL_CPU, memory: str = NODE_MEMORY,
) -> dsl.Model:
    """`overrides` are config `key=value` pairs, e.g. ["loss=cispo"] for an ablation arm. `gpus_per_node` (a whole
    number), `cpu` and `memory` (Kubernetes quantities) size each training node."""
    return _rl_rerun("math", model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes, cpu, memory)


@dsl.pipeline(name="klear-gppo-code", description="Rerun code RL alone on an existing model and code RL prompts")
def gppo_code_pipeline(
    model_uri: str, data_uri: str, preset: str = "code", overrides: list = [], run_root: str = "",
    gpus_per_node: str = GPUS, nodes: int = 1, cpu: str = RL_CPU, memory: str = NODE_MEMORY,
) -> dsl.Model:
    """`overrides` are config `key=value` pairs, e.g. ["loss=clip_higher"] for an ablation arm. `gpus_per_node` (a
    whole number), `cpu` and `memory` (Kubernetes quantities) size each training node."""
    return _rl_rerun("code", model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes, cpu, memory)


PIPELINES = {
    "klear-reasoner": klear_pipeline,
    "klear-reasoner-demo": klear_demo_pipeline,
    "klear-curate": curate_pipeline,
    "klear-sft": sft_pipeline,
    "klear-gppo-math": gppo_math_pipeline,
    "klear-gppo-code": gppo_code_pipeline,
}
