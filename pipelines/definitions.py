"""The Klear-Reasoner post-training DAG, read top to bottom like the paper's recipe.

    klear-reasoner   prompt sources -> curate -> sample (teacher) -> sft-data (difficulty from the reference
                     model's samples) -> sft -> rl-filter math / code (each fed by the filter model's samples)
                     -> math RL -> code RL -> evaluate (base, SFT and RL side by side)
    klear-<stage>    one stage alone, its inputs imported from URIs, to rerun it on an earlier run's artifacts:
                     curate, sample, judge, sft-data, sft, rl-filter, gppo-math, gppo-code, evaluate

klear-reasoner runs inside an exit handler: its last task, however the run ended, reports the outcome (succeeded or
failed and why, scores, report, model, MLflow run) as its Markdown summary, and to a webhook (`_reports_outcome`).

`make demo` runs klear-reasoner itself, on the demo's synthetic sources and tiny model with the tiny presets
(pipelines/demo.py); there is no separate demo wiring.

Cluster-only settings (images, resources, secrets, retries, scheduling) are set here; kfp.local ignores them,
so the very same DAG runs on a laptop CPU. Resources of the GPU stages are decided at run time: GPUs, CPU and
memory are pipeline parameters (strings, the only kind the KFP driver resolves into a pod's resources), and the
same GPU parameter tells a training component how many processes to launch. "0" GPUs runs on CPU in the pod.

Every stage publishes to `<run_root>/<run id>/<stage>` as it goes, so a retried pod resumes; `run_root` is
required. The run id reaches the pods as KLEAR_RUN_ID from their `pipeline/runid` label, not as a task
parameter, which would change every run and keep KFP from ever caching a stage. Every stage task is cached,
keyed with a content digest of what it reads by URI (`_digest`), so a new run reuses every result whose inputs
and settings are unchanged; the `recompute` parameter forces them to run again.
"""

import functools
import inspect
import os
import textwrap
from types import MappingProxyType
from typing import Final, NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Model

from klear.common.component import digest_inputs, slice_list
from klear.common.config import document_overrides
from klear.common.images import CPU_IMAGE, GPU_IMAGE
from klear.common.kfp_io import (
    API_ENV,
    ENDPOINT_SLICE_SCRATCH,
    IMAGE_ENV,
    MERGE_SCRATCH,
    MODEL_SLICE_SCRATCH,
    POD_NAME_ENV,
    RUN_ID_ENV,
    RUNTIME_ENV,
    SCRATCH_ENV,
    SCRATCH_PATH,
)
from klear.common.lineage import TASK_ENV as TASK_POD_ENV
from klear.common.notify import MLFLOW_URI_ENV, NOTIFY_SECRET, SECRET_KEY_TO_ENV
from klear.common.outcome_component import run_outcome
from klear.common.tracking import TRACKING_SECRET, TRACKING_SECRET_KEYS
from klear.curate.component import OVERRIDE_KEYS as CURATE_KEYS
from klear.curate.component import curate
from klear.evaluate.component import OVERRIDE_KEYS as EVALUATE_KEYS
from klear.evaluate.component import evaluate, evaluation_problems, evaluation_prompts
from klear.gppo.component import OVERRIDE_KEYS as GPPO_KEYS
from klear.gppo.component import gppo
from klear.judge.component import OVERRIDE_KEYS as JUDGE_KEYS
from klear.judge.component import judge, judge_slice
from klear.plan.component import plan_run, plan_stage
from klear.register.component import register
from klear.rl_filter.component import OVERRIDE_KEYS as RL_FILTER_KEYS
from klear.rl_filter.component import rl_filter, rl_filter_judge_settings
from klear.sample.component import OVERRIDE_KEYS as SAMPLE_KEYS
from klear.sample.component import sample, sample_slice
from klear.serve.component import deploy_model
from klear.sft.component import OVERRIDE_KEYS as SFT_KEYS
from klear.sft.component import sft
from klear.sft_data.component import OVERRIDE_KEYS as SFT_DATA_KEYS
from klear.sft_data.component import sft_data, sft_data_judge_settings
from klear.training.component import launcher_resources

S3_SECRET = "klear-s3"  # the Helm chart's Secret: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")
# The default Secret with the API key of an OpenAI-compatible endpoint (teacher, filter model), key `api-key`;
# a pipeline parameter names another; optional: a self-hosted vLLM server needs none.
ENDPOINT_SECRET = "klear-endpoint"
UNTRUSTED_CODE_LABEL = "klear.io/runs-untrusted-code"  # the chart's NetworkPolicy denies these pods the network
GPU_RESOURCE = "nvidia.com/gpu"
# Defaults of one 8-GPU node (H100/H200 class): what the recipe needs, well below what such a node has.
GPUS, SFT_CPU, RL_CPU, NODE_MEMORY = "8", "64", "96", "512Gi"  # RL scores rollouts on CPU workers
# Sampling pods by what they run (klear plan checks them): an endpoint use (the teacher behind the chart's server,
# the filter model behind an API) needs no GPU, only CPU for its requests and memory for its shards; a model use
# with an 8B model (reference, evaluation) one GPU, its engine at tensor-parallel 1 (klear plan's memory check).
ENDPOINT_POD = ("0", "8", "32Gi")
MODEL_8B_POD = ("1", "16", "128Gi")
JUDGE_CPU, JUDGE_MEMORY = "16", "64Gi"  # a judging pod: one verifier worker per core
RUN_ID_LABEL = "metadata.labels['pipeline/runid']"  # set by the KFP backend on every pod of a run
# Kubeflow Trainer settings of multi-node training, fixed when compiling: KLEAR_TRAINER_API=v2 makes TrainJobs
# (Trainer >= v2.2) on the runtime KLEAR_TRAINER_RUNTIME; otherwise PyTorchJobs (Training Operator v1).
TRAINER_SETTINGS = {key: os.environ[key] for key in (API_ENV, RUNTIME_ENV) if os.environ.get(key)}


# --------------------------------------------------------------------------- cluster settings


def _on_cluster(task: dsl.PipelineTask, cpu, memory) -> dsl.PipelineTask:
    """Resources (constants or string pipeline parameters) and S3 credentials of a stage; kfp.local ignores them."""
    from kfp import kubernetes

    task.set_cpu_request(cpu).set_cpu_limit(cpu).set_memory_request(memory).set_memory_limit(memory)
    kubernetes.use_secret_as_env(task, secret_name=S3_SECRET, secret_key_to_env={k: k for k in S3_KEYS})
    kubernetes.use_field_path_as_env(task, RUN_ID_ENV, RUN_ID_LABEL)
    # The pod's name (one per task attempt) for the lineage of what it publishes; like the run id, not a parameter.
    kubernetes.use_field_path_as_env(task, TASK_POD_ENV, "metadata.name")
    return task


def _on_gpu_node(task: dsl.PipelineTask, gpus, cpu, memory, scheduling) -> dsl.PipelineTask:
    """A GPU stage, sized at run time: GPUs, CPU and memory, a RAM-backed /dev/shm for NCCL and vLLM, the GPU
    nodes' selector and tolerations (pipeline parameters), and retries (a preempted pod resumes from what it
    published: checkpoints, sample shards)."""
    from kfp import kubernetes

    node_selector, tolerations = scheduling
    kubernetes.add_node_selector_json(task, node_selector)
    kubernetes.add_toleration_json(task, tolerations)
    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(gpus)
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    task.set_retry(num_retries=3, backoff_duration="60s", backoff_factor=2)
    return _on_cluster(task, cpu, memory)


def _launches_training(task: dsl.PipelineTask, nodes, gpus, cpu, memory, scheduling) -> dsl.PipelineTask:
    """A training stage: one node trains in this pod; more nodes, a Kubeflow Trainer job that this pod creates
    (named after the run and step, owned by the run's Workflow, with the pod's scheduling and the image compiled
    here; a retried pod re-attaches to it) while asking for no GPU itself."""
    from kfp import kubernetes

    size = launcher_resources(nodes=nodes, gpus_per_node=gpus, cpu=cpu, memory=memory)
    size.set_display_name("size the launching pod").set_caching_options(False)
    size.set_cpu_request("100m").set_memory_request("128Mi")
    task.after(size)  # resources read from a task's outputs are not a dependency by themselves
    task.set_env_variable(IMAGE_ENV, GPU_IMAGE)
    for key, value in TRAINER_SETTINGS.items():
        task.set_env_variable(key, value)
    kubernetes.use_field_path_as_env(task, POD_NAME_ENV, "metadata.name")
    # MLflow / W&B credentials (report_to): the chart's optional Secret, read by the trackers, never by a config.
    kubernetes.use_secret_as_env(task, secret_name=TRACKING_SECRET, secret_key_to_env={k: k for k in TRACKING_SECRET_KEYS},
                                 optional=True)
    return _on_gpu_node(task, size.outputs["gpus"], size.outputs["cpu"], size.outputs["memory"], scheduling)


def _with_scratch(task: dsl.PipelineTask, size: str) -> dsl.PipelineTask:
    """A scratch volume of `size` at SCRATCH_PATH, where the task stages its temporary files (kfp_io.use_scratch:
    storage's staging, a downloaded model). Under kfp.local no volume is made and the task stages under /tmp."""
    from kfp import kubernetes

    kubernetes.add_ephemeral_volume(task, volume_name="scratch", mount_path=SCRATCH_PATH,
                                    access_modes=["ReadWriteOnce"], size=size)
    return task.set_env_variable(SCRATCH_ENV, SCRATCH_PATH)


def _runs_untrusted_code(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Pods that execute model-written programs (in the sandbox): the chart's NetworkPolicy selects this label."""
    from kfp import kubernetes

    return kubernetes.add_pod_label(task, UNTRUSTED_CODE_LABEL, "true")


def _deterministic(task: dsl.PipelineTask, cpu: str = "16", memory: str = "64Gi") -> dsl.PipelineTask:
    """A CPU data stage whose output depends only on its inputs and settings: cached across runs."""
    task.set_caching_options(True)
    return _on_cluster(task, cpu, memory)


def _import(uri, kind, name: str) -> dsl.PipelineTask:
    task = dsl.importer(artifact_uri=uri, artifact_class=kind, reimport=False)
    return task.set_display_name(name)


def _digest(what: str, recompute, uri="", second_uri="", third_uri="", uris=None, preset=""):
    """The content digest of what a cached task reads, for its cache key: the key holds URIs, artifacts and the
    name of its config (`preset`: a preset, YAML file or URI), while the content behind them may change in place
    (a model folder replaced, a sample output topped up to a larger n, a config file or one of its `base` files
    edited). The run's `recompute` text is folded in: a new text reruns every task keyed by a digest. Never
    cached itself: it must look at the content every run."""
    task = digest_inputs(uri=uri, second_uri=second_uri, third_uri=third_uri, uris=[] if uris is None else uris,
                         preset=preset, recompute=recompute)
    task.set_display_name(f"digest: {what}").set_caching_options(False)
    return _on_cluster(task, "1", "2Gi").output


def cached_stage(component, reads=(), *, what: str = "", recompute=None, preset="", digest=None,
                 **arguments) -> dsl.PipelineTask:
    """A stage task cached by KFP and keyed by the content of what it reads: the `_digest` step ("digest: `what`")
    of `reads` (the URIs it reads, directly or through an importer: up to three string parameters, and a list
    parameter such as benchmark_uris) and of its config `preset`, folding in the run's `recompute`; then
    `component(**arguments, preset=preset, input_digest=<that digest>)`, cached. Stage tasks get their
    `input_digest` here, so none is cached without its digest step (tests/pipelines/test_pipelines.py checks
    that every cached task's digest covers the URIs and preset it reads). `digest`: instead of `reads`, the digest
    step another task over the same inputs took (the judge step in front of sft-data, say)."""
    if digest is None:
        if recompute is None or not what:
            raise ValueError(f"cached_stage({component.name}): give `what` and `recompute` for its digest step")
        single = [uri for uri in reads if not _is_list(uri)]
        lists = [uri for uri in reads if _is_list(uri)]
        if len(single) > 3 or len(lists) > 1:
            raise ValueError(f"{what}: digest_inputs takes up to three URIs and one list of URIs, got {list(reads)}")
        slots = dict(zip(("uri", "second_uri", "third_uri"), single))
        digest = _digest(what, recompute, **slots, uris=lists[0] if lists else None, preset=preset)
    elif reads:
        raise ValueError(f"cached_stage({component.name}): give `reads` or a shared `digest`, not both")
    task = component(**arguments, preset=preset, input_digest=digest)
    return task.set_caching_options(True)


def _is_list(value) -> bool:
    """A list of URIs: a list pipeline parameter (benchmark_uris) or a constant list."""
    return isinstance(value, (list, tuple)) or getattr(value, "channel_type", "") == "List"


# --------------------------------------------------------------------------- stage tasks


def _curate(sources_uri, source_files, benchmark_uris, preset, overrides, run_root, recompute) -> dsl.PipelineTask:
    sources = _import(sources_uri, dsl.Dataset, "prompt sources")
    task = cached_stage(curate, (sources_uri, benchmark_uris), what="curate inputs", recompute=recompute,
                        preset=preset, source_data=sources.output, source_files=source_files,
                        benchmark_uris=benchmark_uris, overrides=overrides, run_root=run_root)
    return _deterministic(task.set_display_name("curate: dedup + 9-gram decontamination"), "16", "32Gi")


def _sample(what: str, prompts, preset, overrides, run_root, gpus, cpu, memory, scheduling, digest, model=None,
            model_uri="", endpoint="", served_model="", key_secret=ENDPOINT_SECRET, slices=1,
            after: dsl.PipelineTask | None = None,
            slice_scratch: str = MODEL_SLICE_SCRATCH) -> dsl.PipelineTask:
    """One use of the sampling engine: a model (artifact or URI; vLLM on the pod's GPUs) or an endpoint, fanned
    out over `slices` pods (a run-time parameter): a ParallelFor of slice tasks, each retried on its own and all
    writing into the use's one work area (<run_root>/work/sample-<what>-<key>, keyed by prompts, model, `digest`
    and settings), then one merge task that publishes, once every unit is in a shard or failed. Slices and merge
    are cached by `digest`: a new run with the same inputs and settings reuses them; one whose earlier run
    stopped halfway samples only what the work area lacks. `after`: a task whose end the slices wait for (the
    critical path first). Returns the merge."""
    from kfp import kubernetes

    arguments = dict(prompts=prompts, endpoint=endpoint, served_model=served_model, api_key_env="", name=what,
                     preset=preset, overrides=overrides, run_root=run_root, model_uri=model_uri, input_digest=digest,
                     **({"model": model} if model is not None else {}))
    parts = slice_list(count=slices).set_display_name(f"slices of sample: {what}").set_caching_options(False)
    parts.set_cpu_request("100m").set_memory_request("128Mi")
    if after is not None:
        parts.after(after)
    # KFP 2.17 takes the loop's parallelism at compile time only: the number of slices bounds the pods at once.
    with dsl.ParallelFor(parts.output, name=f"sample-slices-{what}") as part:
        # The resources as inputs too: KFP 2.17 carries into a loop only the parameters its tasks take as inputs.
        piece = sample_slice(**arguments, part=part, gpus=gpus, cpu=cpu, memory=memory)
        piece.set_display_name(f"sample slice: {what}")
        kubernetes.use_secret_as_env(piece, secret_name=key_secret, secret_key_to_env={"api-key": "OPENAI_API_KEY"},
                                     optional=True)
        _with_scratch(_on_gpu_node(piece, gpus, cpu, memory, scheduling), slice_scratch).set_caching_options(True)
    task = sample(**arguments, merge=True, slices=dsl.Collected(piece.output))
    task.set_display_name(f"sample: {what} (merge of the slices)")
    # The same flags as the slices, the key included (the merge calls no server: it checks the settings).
    kubernetes.use_secret_as_env(task, secret_name=key_secret, secret_key_to_env={"api-key": "OPENAI_API_KEY"},
                                 optional=True)
    task.set_retry(num_retries=3, backoff_duration="60s", backoff_factor=2).set_caching_options(True)
    return _with_scratch(_on_cluster(task, "4", "32Gi"), MERGE_SCRATCH)


def _judge_settings(task: dsl.PipelineTask, stage: str):
    """The judge settings a stage hands to the judge step in front of it (its config's `judge` section, resolved
    from its preset and overrides by its own component): never cached, a preset file may change in place; the
    judge tasks are cached on the settings' text."""
    task.set_display_name(f"judge settings: {stage}").set_caching_options(False)
    return _on_cluster(task, "1", "2Gi").output


def _evaluation_problems(benchmark_uris, preset, overrides, run_root, digest) -> dsl.PipelineTask:
    """What the judge steps in front of evaluate judge with: its problems (outputs["problems"]) and its judge
    settings (outputs["Output"]); cached by `digest`, which covers the benchmarks and the preset."""
    task = evaluation_problems(benchmark_uris=benchmark_uris, preset=preset, overrides=overrides, run_root=run_root,
                               input_digest=digest)
    return _deterministic(task.set_display_name("evaluate: problems and judge settings"), "2", "8Gi")


def _judge(what: str, samples, settings, run_root, cpu, slices, digest, problems=None) -> dsl.PipelineTask:
    """One judging use in front of the stage that reads its rows, judged with the `settings` that stage handed
    over (_judge_settings, _evaluation_problems) and against `problems` (else each sample's record), fanned out over
    `slices` CPU pods (a run-time parameter): a ParallelFor of slice tasks, each retried on its own and all saving
    scores into the use's one work area (<run_root>/work/judge-<what>-<key>, keyed by samples, problems and
    `digest`), then one merge task that publishes the judged rows once every slice's part is there; cached by
    `digest`, as sampling is. Returns the merge."""
    arguments = dict(samples=samples, settings=settings, run_root=run_root, name=what, input_digest=digest,
                     **({"problems": problems} if problems is not None else {}))
    parts = slice_list(count=slices).set_display_name(f"slices of judge: {what}").set_caching_options(False)
    parts.set_cpu_request("100m").set_memory_request("128Mi")
    with dsl.ParallelFor(parts.output, name=f"judge-slices-{what}") as part:
        # The CPU as an input too: KFP 2.17 carries into a loop only the parameters its tasks take as inputs.
        piece = judge_slice(**arguments, part=part, cpu=cpu).set_display_name(f"judge slice: {what}")
        piece.set_retry(num_retries=3, backoff_duration="60s", backoff_factor=2).set_caching_options(True)
        _runs_untrusted_code(_on_cluster(piece, cpu, JUDGE_MEMORY))
    merged = judge(**arguments, merge=True, slices=dsl.Collected(piece.output))
    merged.set_display_name(f"judge: {what} (merge of the slices)")
    merged.set_retry(num_retries=3, backoff_duration="60s", backoff_factor=2).set_caching_options(True)
    return _with_scratch(_on_cluster(merged, "4", "32Gi"), MERGE_SCRATCH)


def _sft(base_model, data, preset, run_root, gpus, nodes, cpu, memory, scheduling, recompute, reads,
         overrides=[]) -> dsl.PipelineTask:
    """SFT, cached by the digest of `reads` (with its inputs): a new run with the same inputs and settings reuses
    the model."""
    task = cached_stage(sft, reads, what="sft inputs", recompute=recompute, preset=preset, base_model=base_model,
                        data=data, overrides=overrides, gpus_per_node=gpus, nodes=nodes, run_root=run_root)
    task.set_display_name("sft: long-CoT SFT (TRL, ZeRO-3)")
    return _launches_training(task, nodes, gpus, cpu, memory, scheduling).set_caching_options(True)


def _gppo(rl_task: str, policy, data, preset, run_root, gpus, nodes, cpu, memory, scheduling, recompute, reads,
          what: str, overrides=[]) -> dsl.PipelineTask:
    """One RL run of the paper with the one gppo component: "math" (after SFT), then "code" (after math RL); cached
    by the digest of `reads` (with its inputs), as SFT is."""
    task = cached_stage(gppo, reads, what=what, recompute=recompute, preset=preset, policy=policy, data=data,
                        task=rl_task, overrides=overrides, gpus_per_node=gpus, nodes=nodes, run_root=run_root)
    task.set_display_name(f"{rl_task} RL: GPPO (TRL + vLLM)")
    return _runs_untrusted_code(_launches_training(task, nodes, gpus, cpu, memory, scheduling)).set_caching_options(True)


def _rl_filter(rl_task: str, problems, filter_samples, benchmark_uris, preset, overrides, run_root,
               digest, cpu=JUDGE_CPU) -> dsl.PipelineTask:
    """rl-filter on the digest of its judge step (the same inputs)."""
    task = cached_stage(rl_filter, digest=digest, preset=preset, problems=problems, filter_samples=filter_samples,
                        task=rl_task, overrides=overrides, benchmark_uris=benchmark_uris, run_root=run_root)
    task.set_display_name(f"rl-filter: {rl_task} (pass rate of the filter model)")
    return _runs_untrusted_code(_deterministic(task, cpu))


def _eval_judged(kind: str, samples: dict, judging: dsl.PipelineTask, run_root, cpu, slices, digest) -> dict:
    """Each model's evaluation samples of one kind judged in `slices` slices with evaluate's judge settings and
    against its problems (`judging`: _evaluation_problems), so evaluate takes every verdict as it is (it still judges
    the other math modes of judge.report_modes itself): label -> the judged rows."""
    return {label: _judge(f"eval-{label}-{kind}", rows, judging.outputs["Output"], run_root, cpu, slices, digest,
                          problems=judging.outputs["problems"]).outputs["judged"] for label, rows in samples.items()}


def _evaluate(models: dict, benchmark_uris, preset, overrides, run_root, digest, name: str, code: dict | None = None,
              folder: str = "evaluate", cpu=JUDGE_CPU) -> dsl.PipelineTask:
    """evaluate with up to three models side by side: `models` maps label -> its judged math samples, in the
    order final, baseline, reference (RL, SFT, base); `code` the same for LiveCodeBench samples."""
    (label, first), (base_label, second), (ref_label, third) = list(models.items())
    code = code or {}
    inputs = {"samples": first, "baseline_samples": second, "reference_samples": third}
    if code:
        inputs |= {"code_samples": code[label], "baseline_code_samples": code[base_label],
                   "reference_code_samples": code[ref_label]}
    task = cached_stage(evaluate, digest=digest, preset=preset, **inputs, benchmark_uris=benchmark_uris,
                        overrides=overrides, run_root=run_root, label=label, baseline_label=base_label,
                        reference_label=ref_label, name=folder)
    task.set_display_name(name)
    return _runs_untrusted_code(_deterministic(task, cpu))


def _register(what: str, model, evaluation, name, suffix: str, kubeflow_registry) -> dsl.PipelineTask:
    """Register a trained model by reference in MLflow's Model Registry (the tracking Secret's address and
    credentials), and in the Kubeflow Model Registry when its address is given. Never cached: the registries live
    outside KFP's cache, and registering the same content again adds nothing, so a retried pod is harmless too."""
    from kfp import kubernetes

    task = register(model=model, evaluation=evaluation, name=name, name_suffix=suffix,
                    kubeflow_registry=kubeflow_registry)
    task.set_display_name(f"register: {what}").set_caching_options(False)
    task.set_retry(num_retries=3, backoff_duration="60s", backoff_factor=2)
    kubernetes.use_secret_as_env(task, secret_name=TRACKING_SECRET, secret_key_to_env={k: k for k in TRACKING_SECRET_KEYS},
                                 optional=True)
    return _on_cluster(task, "1", "2Gi")


def _serve(model, name, gpus, scheduling) -> dsl.PipelineTask:
    """A model behind an OpenAI-compatible endpoint: a small CPU task creates or replaces the KServe InferenceService
    `name` (vLLM's server on `gpus` GPUs of the GPU nodes, the model copied from its published folder) and waits until
    it serves. Never cached: it changes the cluster, and a new run must serve its own model."""
    node_selector, tolerations = scheduling
    task = deploy_model(model=model, name=name, server_image=GPU_IMAGE, fetch_image=CPU_IMAGE, gpus=gpus,
                        cpu=MODEL_8B_POD[1], memory=MODEL_8B_POD[2], node_selector=node_selector,
                        tolerations=tolerations, s3_secret=S3_SECRET)
    task.set_display_name("serve: the final model on KServe (vLLM)")
    return _on_cluster(task.set_caching_options(False), "1", "2Gi")


def _after_all(first: dsl.PipelineTask) -> None:
    """Every other task of the pipeline being defined runs after `first` (the plan): each task's own dependency,
    so no importer, digest or slice list starts before the plan has passed."""
    from kfp.dsl import pipeline_context

    pipeline = pipeline_context.Pipeline.get_default_pipeline()
    for task in list(pipeline.tasks.values()):
        if task is not first and not getattr(task, "is_exit_handler", False):  # an exit task depends on nothing
            task.after(first)


def _plan_first(pipeline: str, cluster, gpu_quota, preset, overrides, **sizes) -> None:
    """A single-stage pipeline's first task: `klear plan` on the stage's own arguments (plan_stage), before any
    other task of the pipeline being defined (called last in its body: every task made so far waits for it)."""
    task = plan_stage(pipeline=pipeline, cluster=cluster, gpu_quota=gpu_quota, preset=preset, overrides=overrides,
                      **sizes)
    _on_cluster(task.set_display_name("plan: klear plan on this run's arguments").set_caching_options(False),
                "1", "2Gi")
    _after_all(task)


# --------------------------------------------------------------------------- the recipe


# What the whole recipe hands over, in the run's outputs: the final (code RL) model and the evaluation report (the RL
# model beside SFT and base on AIME and HMMT; with evaluate_code, the LiveCodeBench report is its own task's).
class RecipeOutputs(NamedTuple):
    model: Model
    report: HTML


# The run form's descriptions of the parameters several pipelines share, written once; a pipeline's own `Args:`
# line wins (the whole recipe's, for instance, says more of run_root, plan_cluster and recompute).
SHARED_ARGS: Final = MappingProxyType({
    "run_root": "Object-storage root of this run's outputs (s3://bucket/runs).",
    "source_files": 'Its files, each with an optional field mapping, e.g. "numina.jsonl#prompt=problem".',
    "benchmark_uris": "Test sets to decontaminate against; empty: the shipped AIME24/AIME25/HMMT25.",
    "overrides": 'Config overrides, "key=value".',
    "plan_cluster": "The node shape the first task (`klear plan`) checks this run's settings against "
                    "(h100-80gb-x8, h200-141gb-x8); it fails the run before the stage starts.",
    "plan_gpu_quota": "The GPUs this run may hold at once; 0: the cluster shape's nodes x GPUs.",
    "recompute": "Any new text (e.g. a date) makes this run compute its result anew instead of reusing an earlier "
                 "run's result for the same inputs and settings (KFP's cache, keyed by content digests that fold it "
                 "in).",
})
# ... and of the pod parameters, by the kind of pod the pipeline sizes.
POD_ARGS: Final = MappingProxyType({
    "training": MappingProxyType({
        "nodes": "Training nodes (more than 1: a Kubeflow Trainer job).",
        "gpus_per_node": "GPUs per training node (a whole number).",
        "memory": "Memory per training node.",
        "gpu_node_selector": "Node labels the training pods must match.",
        "gpu_tolerations": "Tolerations of the training pods.",
    }),
    "sampling": MappingProxyType({
        "cpu": "CPU of the sampling pod.",
        "memory": "Memory of the sampling pod.",
        "gpu_node_selector": "Node labels the GPU pod must match.",
        "gpu_tolerations": "Tolerations of the GPU pod.",
    }),
})


def _run_form(pods: str = "", **keys: str):
    """The pipeline's run form: every parameter its `Args:` leaves out described from SHARED_ARGS (and POD_ARGS[pods]),
    a parameter in neither refused here, at import; then, under each named override parameter, the keys it can set
    (from the stage's config class through its component's OVERRIDE_KEYS): what a `key=value` override may name."""
    table = {**SHARED_ARGS, **POD_ARGS.get(pods, {})}

    def add(func):
        doc = func.__doc__ or ""
        described = _described(doc)
        for name in inspect.signature(func).parameters:
            if name in described:
                continue
            if name not in table:
                raise TypeError(f"{func.__name__}: describe the parameter {name!r} in its Args: section, or add it to "
                                "SHARED_ARGS in pipelines/definitions.py if several pipelines share it")
            doc = _with_argument(doc, name, table[name])
        func.__doc__ = document_overrides(doc, keys)
        return func

    return add


def _described(doc: str) -> set[str]:
    """The parameters a docstring's `Args:` section describes."""
    lines = doc.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "Args:"]
    if not starts:
        return set()
    indent = len(lines[starts[0]]) - len(lines[starts[0]].lstrip()) + 4
    names = set()
    for line in lines[starts[0] + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        if len(line) - len(line.lstrip()) == indent and ":" in line:
            names.add(line.strip().split(":", 1)[0])
    return names


def _with_argument(doc: str, name: str, text: str) -> str:
    """`doc` with one more entry at the end of its `Args:` section (the pipeline's run form shows it)."""
    lines = doc.rstrip().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.strip() == "Args:"]
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent), len(lines))
    entry = textwrap.wrap(f"{name}: {text}", 110, initial_indent=" " * (indent + 4),
                          subsequent_indent=" " * (indent + 8), break_on_hyphens=False)
    return "\n".join([*lines[:end], *entry, *lines[end:]]) + "\n" + " " * indent


def _reports_outcome(pipeline: str):
    """The pipeline's whole body inside a `dsl.ExitHandler` whose exit task (klear.common.outcome_component) runs
    after the last task, however the run ended: it publishes the run's outcome as its Markdown summary and posts it
    to the webhook of the notify Secret, which a `notify_secret` parameter (added here) names. KFP takes no output
    out of an ExitHandler, so the body's RecipeOutputs become the exit task's, which finds them on storage."""

    def wrap(func):
        signature = inspect.signature(func)
        secret = inspect.Parameter("notify_secret", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=NOTIFY_SECRET,
                                   annotation=str)
        reporting = signature.replace(parameters=[*signature.parameters.values(), secret])

        @functools.wraps(func)
        def body(*args):
            from kfp import kubernetes

            arguments = reporting.bind(*args).arguments
            notify_secret = arguments.pop("notify_secret")
            outcome = run_outcome(pipeline=pipeline, run_root=arguments["run_root"])
            outcome.set_display_name("outcome: summary and notification").set_caching_options(False)
            kubernetes.use_secret_as_env(outcome, secret_name=notify_secret, secret_key_to_env=SECRET_KEY_TO_ENV,
                                         optional=True)
            kubernetes.use_secret_as_env(outcome, secret_name=TRACKING_SECRET,  # the MLflow address, for links
                                         secret_key_to_env={MLFLOW_URI_ENV: MLFLOW_URI_ENV}, optional=True)
            _on_cluster(outcome, "1", "2Gi")
            with dsl.ExitHandler(outcome, name=pipeline):
                returned = func(**arguments)
            if not isinstance(returned, RecipeOutputs):
                raise TypeError(f"{pipeline}: _reports_outcome hands out RecipeOutputs, the body returned {returned!r}")
            return RecipeOutputs(model=outcome.outputs["model"], report=outcome.outputs["report"])

        body.__signature__ = reporting  # type: ignore[attr-defined]
        body.__doc__ = _with_argument(func.__doc__ or "", "notify_secret", (
            "The Secret whose keys `webhook-url` (a Slack-compatible incoming webhook) and `kfp-ui-url` (this "
            "Kubeflow UI, for a link to the run) the exit task reads; missing, or without a webhook-url: the outcome "
            "is only the run's summary (the chart's notifications values)."))
        return body

    return wrap


@dsl.pipeline(name="klear-reasoner", display_name="Klear-Reasoner: the whole recipe",
              description="Klear-Reasoner post-training recipe (arXiv 2508.07629)")
@_run_form(curate_overrides=CURATE_KEYS, teacher_overrides=SAMPLE_KEYS, reference_overrides=SAMPLE_KEYS,
                filter_math_overrides=SAMPLE_KEYS, filter_code_overrides=SAMPLE_KEYS, sft_data_overrides=SFT_DATA_KEYS,
                sft_overrides=SFT_KEYS, rl_filter_math_overrides=RL_FILTER_KEYS, rl_filter_code_overrides=RL_FILTER_KEYS,
                gppo_math_overrides=GPPO_KEYS, gppo_code_overrides=GPPO_KEYS, evaluate_overrides=EVALUATE_KEYS,
                eval_sample_overrides=SAMPLE_KEYS)
@_reports_outcome("klear-reasoner")
def klear_pipeline(
    sources_uri: str,
    source_files: list,
    base_model_uri: str,
    reference_model_uri: str,
    rl_math_uri: str,
    rl_code_uri: str,
    run_root: str,
    teacher_model_uri: str = "",
    teacher_endpoint: str = "",
    teacher_served_model: str = "",
    teacher_key_secret: str = ENDPOINT_SECRET,
    filter_model_uri: str = "",
    filter_endpoint: str = "",
    filter_served_model: str = "",
    filter_key_secret: str = ENDPOINT_SECRET,
    benchmark_uris: list = [],
    curate_preset: str = "paper",
    curate_overrides: list = [],
    sample_preset: str = "paper",
    teacher_overrides: list = [],
    reference_overrides: list = ["n=8"],
    filter_math_overrides: list = [],
    filter_code_overrides: list = [],
    sft_data_preset: str = "paper",
    sft_data_overrides: list = [],
    sft_preset: str = "paper",
    sft_overrides: list = [],
    rl_filter_preset: str = "paper",
    rl_filter_math_overrides: list = [],
    rl_filter_code_overrides: list = [],
    gppo_math_preset: str = "math",
    gppo_math_overrides: list = [],
    gppo_code_preset: str = "code",
    gppo_code_overrides: list = [],
    evaluate_preset: str = "paper",
    evaluate_overrides: list = [],
    eval_sample_overrides: list = [],
    evaluate_code: bool = False,
    gpu_node_selector: dict = {},
    gpu_tolerations: list = [],
    teacher_gpus: str = ENDPOINT_POD[0],
    teacher_cpu: str = ENDPOINT_POD[1],
    teacher_memory: str = ENDPOINT_POD[2],
    reference_gpus: str = MODEL_8B_POD[0],
    reference_cpu: str = MODEL_8B_POD[1],
    reference_memory: str = MODEL_8B_POD[2],
    filter_gpus: str = ENDPOINT_POD[0],
    filter_cpu: str = ENDPOINT_POD[1],
    filter_memory: str = ENDPOINT_POD[2],
    eval_gpus: str = MODEL_8B_POD[0],
    eval_cpu: str = MODEL_8B_POD[1],
    eval_memory: str = MODEL_8B_POD[2],
    teacher_slices: int = 1,
    reference_slices: int = 1,
    filter_math_slices: int = 1,
    filter_code_slices: int = 1,
    eval_slices: int = 1,
    judge_cpu: str = JUDGE_CPU,
    reference_judge_slices: int = 1,
    filter_math_judge_slices: int = 1,
    filter_code_judge_slices: int = 1,
    evaluate_judge_slices: int = 1,
    sft_nodes: int = 1,
    sft_gpus_per_node: str = GPUS,
    sft_cpu: str = SFT_CPU,
    sft_memory: str = NODE_MEMORY,
    rl_nodes: int = 1,
    rl_gpus_per_node: str = GPUS,
    rl_cpu: str = RL_CPU,
    rl_memory: str = NODE_MEMORY,
    plan_cluster: str = "h100-80gb-x8",
    plan_gpu_quota: int = 0,
    recompute: str = "",
    register_model_name: str = "",
    register_sft: bool = False,
    register_kubeflow_registry: str = "",
    serve_model: bool = False,
    serve_name: str = "klear-reasoner",
    serve_gpus: str = MODEL_8B_POD[0],
) -> RecipeOutputs:
    """The whole recipe: curated prompts, teacher traces, SFT, filtered RL data, math then code RL, evaluation.

    Args:
        sources_uri: Folder of prompt sources on object storage (s3://...).
        base_model_uri: The model to post-train, a Hugging Face folder on object storage (Qwen3-8B-Base).
        reference_model_uri: The model whose pass rate labels prompts easy or hard for SFT data (Qwen3-8B).
        rl_math_uri: Candidate math RL problems (with `answer`), a file or published output.
        rl_code_uri: Candidate code RL problems (with `tests`), a file or published output.
        teacher_model_uri: The teacher as a model folder, sampled with vLLM in the pipeline; or give an endpoint.
        teacher_endpoint: OpenAI-compatible API of the teacher (DeepSeek-R1-0528), e.g. http://teacher:8000/v1.
        teacher_served_model: The model name the teacher endpoint serves.
        teacher_key_secret: The Secret holding the teacher endpoint's API key (key `api-key`), if it needs one.
        filter_model_uri: The RL filter model (DeepSeek-R1-0120) as a model folder; or give an endpoint.
        filter_endpoint: OpenAI-compatible API of the RL filter model.
        filter_served_model: The model name the filter endpoint serves.
        filter_key_secret: The Secret holding the filter endpoint's API key (key `api-key`), if it needs one.
        benchmark_uris: Test sets: curate and rl-filter remove overlaps with them, evaluate scores them. Empty:
            the shipped AIME24/AIME25/HMMT25; LiveCodeBench code_generation_lite files are brought by you.
        curate_preset: curate config (paper: 9-gram decontamination).
        curate_overrides: curate config overrides, "key=value" (e.g. "ngram_size=13").
        sample_preset: sampling config of every sample step (paper: T 0.6, top_p 0.95, 32K tokens, n 16).
        teacher_overrides: Sample overrides for the teacher ("backend=records" imports traces the sources ship).
        reference_overrides: Sample overrides for the reference model (k samples per prompt for difficulty).
        filter_math_overrides: Sample overrides for the RL filter model on the math problems.
        filter_code_overrides: Sample overrides for the RL filter model on the code problems.
        sft_data_preset: sft-data config (paper: keep every response; easy/hard threshold).
        sft_data_overrides: sft-data config overrides, e.g. ["policy=drop_incorrect_on_easy"].
        sft_preset: sft config (paper: 32K, lr 8e-5 cosine to 4e-5, 4 epochs, ZeRO-3).
        sft_overrides: sft config overrides, "key=value".
        rl_filter_preset: rl-filter config (paper: >= 16 tests, pass rate > 0.5 of 16 samples).
        rl_filter_math_overrides: rl-filter config overrides of the math set, e.g. ["keep_above=0.5"].
        rl_filter_code_overrides: rl-filter config overrides of the code set, e.g. ["min_tests=8"].
        gppo_math_preset: math RL config (math: the paper's, lr 1e-6, mini-batch 16; release-math: as the released code ran).
        gppo_math_overrides: Overrides of the math RL run, e.g. ["loss=cispo"] for an ablation.
        gppo_code_preset: code RL config (code: the paper's, lr 5e-7, mini-batch 32; release-code: as the released code ran).
        gppo_code_overrides: Overrides of the code RL run, e.g. ["loss=cispo"] for an ablation.
        evaluate_preset: evaluation protocol (paper: avg@64 math, avg@8 LiveCodeBench, 32K; paper-64k: YaRN;
            release: as the released code judged).
        evaluate_overrides: evaluate config overrides, e.g. ["only=[aime24]"] or ["sampling.max_tokens=65536"]
            (protocol settings such as sampling.* also set the evaluation sampling).
        eval_sample_overrides: Sample overrides of the evaluation sampling that the protocol leaves open, e.g.
            ["concurrency=64"]; the protocol's settings (n, temperature, top_p, max_tokens, ...) win.
        evaluate_code: Also sample and score LiveCodeBench (needs its files among benchmark_uris).
        run_root: Object-storage root of stage outputs (s3://bucket/runs): outputs and checkpoints go to
            <run_root>/<run id>/<stage> as they are made, so a retried pod resumes where its predecessor stopped;
            sampling and judging work areas to <run_root>/work/<use>-<key>, shared by runs of the same inputs.
        gpu_node_selector: Node labels the GPU pods (sampling, training) must match, e.g.
            {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}; multi-node training jobs inherit them.
        gpu_tolerations: Tolerations of the GPU pods, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists",
            "effect": "NoSchedule"}]; multi-node training jobs inherit them.
        teacher_gpus: GPUs of each teacher sampling pod: "0" for an endpoint (the chart's server) or imported traces;
            a teacher_model_uri needs the GPUs its engine's tensor parallelism takes.
        teacher_cpu: CPU of each teacher sampling pod.
        teacher_memory: Memory of each teacher sampling pod.
        reference_gpus: GPUs of each reference sampling pod (an 8B model: 1, its vLLM engine at tensor-parallel 1).
        reference_cpu: CPU of each reference sampling pod.
        reference_memory: Memory of each reference sampling pod.
        filter_gpus: GPUs of each filter-model sampling pod ("0" for an endpoint).
        filter_cpu: CPU of each filter-model sampling pod.
        filter_memory: Memory of each filter-model sampling pod.
        eval_gpus: GPUs of each evaluation sampling pod (the model under evaluation, 8B: 1).
        eval_cpu: CPU of each evaluation sampling pod.
        eval_memory: Memory of each evaluation sampling pod.
        teacher_slices: Pods the teacher sampling is spread over (slices of the prompts by a hash of their id, each
            its own retried task, then one merge); another number reuses every unit already sampled in the use's
            work area, which is keyed by content, so a new run with the same inputs reuses them too.
        reference_slices: Pods the reference model's sampling is spread over.
        filter_math_slices: Pods the filter model's sampling of the math problems is spread over.
        filter_code_slices: Pods the filter model's sampling of the code problems is spread over.
        eval_slices: Pods each evaluation sampling (per model and benchmark kind) is spread over.
        judge_cpu: CPU of each judging pod (judge slices, sft-data, rl-filter, evaluate): one verifier worker per core.
        reference_judge_slices: Pods the judging of the reference model's samples is spread over (slices of the
            samples by a hash of their id, each its own retried task, then one merge that sft-data reads).
        filter_math_judge_slices: Pods the judging of the filter model's math samples is spread over.
        filter_code_judge_slices: Pods the judging of the filter model's code samples (sandboxed) is spread over.
        evaluate_judge_slices: Pods the judging of each evaluation's samples (per model and benchmark kind) is
            spread over, with the evaluate preset's judge settings, then one merge that evaluate reads.
        sft_nodes: Training nodes of SFT (more than 1: a Kubeflow Trainer job).
        sft_gpus_per_node: GPUs per SFT node.
        sft_cpu: CPU per SFT node.
        sft_memory: Memory per SFT node.
        rl_nodes: Training nodes of each RL run.
        rl_gpus_per_node: GPUs per RL node.
        rl_cpu: CPU per RL node.
        rl_memory: Memory per RL node.
        plan_cluster: The node shape the first task (`klear plan`) checks this run's settings, contexts and
            training layouts against (h100-80gb-x8, h200-141gb-x8); it fails the run before any stage starts.
        plan_gpu_quota: The GPUs this run may hold at once (a namespace quota); 0: the cluster shape's nodes x GPUs.
            The plan fails a phase of the run that wants more at once.
        recompute: Any new text (e.g. a date) makes this run sample, judge and train anew instead of reusing the
            results of earlier runs with the same inputs and settings (KFP's cache, keyed by content digests that
            fold this text in, and the work areas keyed by them); runs with the same text share results.
        register_model_name: After the evaluation, register the final (code RL) model under this name in MLflow's
            Model Registry (the tracking Secret's MLflow server): a version per model content, its source the model's
            location, with its lineage, scores and card; the scores and report also go into its training run. "" =
            no registration.
        register_sft: Also register the SFT model, as <register_model_name>-sft (needs register_model_name).
        register_kubeflow_registry: Also register in the Kubeflow Model Registry at this address, e.g.
            https://model-registry-service.kubeflow.svc:8443 ("" = MLflow only; needs register_model_name).
        serve_model: Serve the final (code RL) model once it is trained: a KServe InferenceService named serve_name
            (vLLM's OpenAI server) is created, or replaced if it exists, and the step waits until it answers; its
            output is the endpoint, http://<serve_name>-predictor.<namespace>.svc.cluster.local/v1 (KServe >= 0.13).
        serve_name: The InferenceService's name and the model name requests give (`--served-model`).
        serve_gpus: GPUs of the serving pod (on the GPU nodes: gpu_node_selector, gpu_tolerations); vLLM's tensor
            parallelism spans them.
    """
    first = plan_run(cluster=plan_cluster, base_model_uri=base_model_uri, reference_model_uri=reference_model_uri,
                     teacher_model_uri=teacher_model_uri, curate_preset=curate_preset,
                     curate_overrides=curate_overrides, sample_preset=sample_preset,
                     teacher_overrides=teacher_overrides, reference_overrides=reference_overrides,
                     filter_math_overrides=filter_math_overrides, filter_code_overrides=filter_code_overrides,
                     sft_data_preset=sft_data_preset, sft_data_overrides=sft_data_overrides, sft_preset=sft_preset,
                     sft_overrides=sft_overrides, rl_filter_preset=rl_filter_preset,
                     rl_filter_math_overrides=rl_filter_math_overrides,
                     rl_filter_code_overrides=rl_filter_code_overrides, gppo_math_preset=gppo_math_preset,
                     gppo_math_overrides=gppo_math_overrides, gppo_code_preset=gppo_code_preset,
                     gppo_code_overrides=gppo_code_overrides, evaluate_preset=evaluate_preset,
                     evaluate_overrides=evaluate_overrides, eval_sample_overrides=eval_sample_overrides,
                     sft_nodes=sft_nodes, sft_gpus_per_node=sft_gpus_per_node, rl_nodes=rl_nodes,
                     rl_gpus_per_node=rl_gpus_per_node, filter_model_uri=filter_model_uri,
                     teacher_gpus=teacher_gpus, reference_gpus=reference_gpus, filter_gpus=filter_gpus,
                     eval_gpus=eval_gpus, teacher_slices=teacher_slices, reference_slices=reference_slices,
                     filter_math_slices=filter_math_slices, filter_code_slices=filter_code_slices,
                     eval_slices=eval_slices, evaluate_code=evaluate_code, gpu_quota=plan_gpu_quota)
    # Never cached: a preset file may change in place; the plan takes seconds.
    _on_cluster(first.set_display_name("plan: klear plan on this run's arguments").set_caching_options(False),
                "1", "2Gi")
    scheduling = (gpu_node_selector, gpu_tolerations)
    curated = _curate(sources_uri, source_files, benchmark_uris, curate_preset, curate_overrides, run_root,
                      recompute).outputs["curated"]
    base = _import(base_model_uri, dsl.Model, "base model")

    # SFT data: teacher traces, labelled by the reference model's pass rate (paper §5.1).
    # The teacher is the critical path (SFT waits for it): it and the reference model start first; the filter model
    # and the base model's evaluation wait for the teacher's merge rather than take GPUs ahead of it.
    teacher = _sample("teacher", curated, sample_preset, teacher_overrides, run_root, teacher_gpus, teacher_cpu,
                      teacher_memory, scheduling,
                      _digest("teacher sampling inputs", recompute, teacher_model_uri, preset=sample_preset),
                      model_uri=teacher_model_uri, endpoint=teacher_endpoint,
                      served_model=teacher_served_model, key_secret=teacher_key_secret, slices=teacher_slices,
                      slice_scratch=ENDPOINT_SLICE_SCRATCH)
    reference = _sample("reference", curated, sample_preset, reference_overrides, run_root, reference_gpus,
                        reference_cpu, reference_memory, scheduling,
                        _digest("reference sampling inputs", recompute, reference_model_uri, preset=sample_preset),
                        model_uri=reference_model_uri, slices=reference_slices)
    sft_data_digest = _digest("sft-data inputs", recompute, base_model_uri, preset=sft_data_preset)
    sft_data_judging = _judge_settings(sft_data_judge_settings(preset=sft_data_preset, overrides=sft_data_overrides),
                                       "sft-data")
    reference_judged = _judge("reference", reference.outputs["samples"], sft_data_judging, run_root, judge_cpu,
                              reference_judge_slices, sft_data_digest)
    records = cached_stage(sft_data, digest=sft_data_digest, preset=sft_data_preset,
                           teacher_samples=teacher.outputs["samples"], reference_samples=reference_judged.outputs["judged"],
                           target_model=base.output, overrides=sft_data_overrides, run_root=run_root)
    _runs_untrusted_code(_deterministic(records.set_display_name("sft-data: difficulty and policy"), judge_cpu))
    tuned = _sft(base.output, records.outputs["records"], sft_preset, run_root, sft_gpus_per_node, sft_nodes,
                 sft_cpu, sft_memory, scheduling, recompute, (base_model_uri,), sft_overrides)

    # RL data: problems the filter model solves reliably (label noise out), then math RL, then code RL.
    rl_data = {}
    for rl_task, uri, sampling_overrides, filtering_overrides, filter_slices, judge_slices in (
            ("math", rl_math_uri, filter_math_overrides, rl_filter_math_overrides, filter_math_slices,
             filter_math_judge_slices),
            ("code", rl_code_uri, filter_code_overrides, rl_filter_code_overrides, filter_code_slices,
             filter_code_judge_slices)):
        problems = _import(uri, dsl.Dataset, f"{rl_task} RL problems")
        digest = _digest(f"rl-filter {rl_task} inputs", recompute, uri, uris=benchmark_uris, preset=rl_filter_preset)
        filtered = _sample(f"filter-{rl_task}", problems.output, sample_preset, sampling_overrides, run_root,
                           filter_gpus, filter_cpu, filter_memory, scheduling,
                           _digest(f"filter {rl_task} sampling inputs", recompute, filter_model_uri, uri,
                                   preset=sample_preset), model_uri=filter_model_uri,
                           endpoint=filter_endpoint, served_model=filter_served_model, key_secret=filter_key_secret,
                           slices=filter_slices, after=teacher, slice_scratch=ENDPOINT_SLICE_SCRATCH)
        # Judged against the problems as rl-filter reads them (its judge settings, every problem as this task).
        filter_judging = _judge_settings(rl_filter_judge_settings(preset=rl_filter_preset,
                                                                  overrides=filtering_overrides, task=rl_task),
                                         f"rl-filter {rl_task}")
        judged = _judge(f"filter-{rl_task}", filtered.outputs["samples"], filter_judging, run_root, judge_cpu,
                        judge_slices, digest, problems=problems.output)
        rl_data[rl_task] = _rl_filter(rl_task, problems.output, judged.outputs["judged"], benchmark_uris,
                                      rl_filter_preset, filtering_overrides, run_root, digest, judge_cpu
                                      ).outputs["rl_data"]
    math_rl = _gppo("math", tuned.outputs["model"], rl_data["math"], gppo_math_preset, run_root, rl_gpus_per_node,
                    rl_nodes, rl_cpu, rl_memory, scheduling, recompute, (), "math RL config", gppo_math_overrides)
    code_rl = _gppo("code", math_rl.outputs["model"], rl_data["code"], gppo_code_preset, run_root,
                    rl_gpus_per_node, rl_nodes, rl_cpu, rl_memory, scheduling, recompute, (), "code RL config",
                    gppo_code_overrides)

    # Evaluation under the paper's protocol: the final model beside SFT and the base model.
    benchmarks = _digest("benchmarks", recompute, uris=benchmark_uris, preset=evaluate_preset)
    prompts = cached_stage(evaluation_prompts, digest=benchmarks, preset=evaluate_preset,
                           benchmark_uris=benchmark_uris, overrides=evaluate_overrides,
                           sampling_overrides=eval_sample_overrides, run_root=run_root)
    _deterministic(prompts.set_display_name("evaluate: benchmark prompts"), "2", "8Gi")
    judging = _evaluation_problems(benchmark_uris, evaluate_preset, evaluate_overrides, run_root, benchmarks)
    models = {"rl": code_rl.outputs["model"], "sft": tuned.outputs["model"], "base": base.output}
    # The trained models are this run's artifacts (their URIs key the cache); the base model is read by URI.
    trained_sampling = _digest("evaluation sampling config", recompute, preset=sample_preset)
    sampling_digests = {"rl": trained_sampling, "sft": trained_sampling,
                        "base": _digest("base model sampling inputs", recompute, base_model_uri, preset=sample_preset)}

    def eval_samples(kind: str) -> dict:
        samples = {label: _sample(f"eval-{label}-{kind}", prompts.outputs[f"{kind}_prompts"], sample_preset,
                                  prompts.outputs[f"{kind}_sample_overrides"], run_root, eval_gpus, eval_cpu,
                                  eval_memory, scheduling, sampling_digests[label], model=model, slices=eval_slices,
                                  after=teacher if label == "base" else None).outputs["samples"]
                   for label, model in models.items()}
        return _eval_judged(kind, samples, judging, run_root, judge_cpu, evaluate_judge_slices, benchmarks)

    math_samples = eval_samples("math")  # judged once, read by both evaluations
    math_evaluation = _evaluate(math_samples, benchmark_uris, evaluate_preset, evaluate_overrides, run_root,
                                benchmarks, "evaluate: AIME / HMMT", cpu=judge_cpu)
    with dsl.If(evaluate_code == True, name="evaluate-code"):  # noqa: E712 - a pipeline condition, compiled, not a Python comparison
        _evaluate(math_samples, benchmark_uris, evaluate_preset, evaluate_overrides, run_root, benchmarks,
                  "evaluate: AIME / HMMT / LiveCodeBench", code=eval_samples("code"), folder="evaluate-code",
                  cpu=judge_cpu)
    # On request, the trained models into the model registries, with the scores of the evaluation.
    with dsl.If(register_model_name != "", name="register-model"):
        _register("final model", code_rl.outputs["model"], math_evaluation.outputs["scores"], register_model_name, "",
                  register_kubeflow_registry)
        with dsl.If(register_sft == True, name="register-sft"):  # noqa: E712 - a pipeline condition, compiled
            _register("SFT model", tuned.outputs["model"], math_evaluation.outputs["scores"], register_model_name,
                      "-sft", register_kubeflow_registry)
    with dsl.If(serve_model == True, name="serve-model"):  # noqa: E712 - a pipeline condition, compiled
        _serve(code_rl.outputs["model"], serve_name, serve_gpus, scheduling)
    _after_all(first)
    # What the run hands out; from inside the ExitHandler, _reports_outcome's exit task hands them out from storage.
    return RecipeOutputs(model=code_rl.outputs["model"], report=math_evaluation.outputs["report"])


# --------------------------------------------------------------------------- single-stage reruns
# Each takes its inputs as URIs (an earlier run's outputs: <run_root>/<run id>/<stage>) and writes a new run.

@dsl.pipeline(name="klear-curate", display_name="Curate prompts (rerun)",
              description="Rerun curate alone on existing prompt sources")
@_run_form(overrides=CURATE_KEYS)
def curate_pipeline(sources_uri: str, source_files: list, run_root: str, benchmark_uris: list = [],
                    preset: str = "paper", overrides: list = [], plan_cluster: str = "h100-80gb-x8",
                    plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Dataset:
    """Exact dedup and 9-gram decontamination of prompt sources.

    Args:
        sources_uri: Folder of prompt sources (s3://...).
        preset: curate config (paper, tiny) or a YAML path.
        overrides: Config overrides, "key=value" (e.g. "ngram_size=13").
    """
    curated = _curate(sources_uri, source_files, benchmark_uris, preset, overrides, run_root, recompute).outputs["curated"]
    _plan_first("klear-curate", plan_cluster, plan_gpu_quota, preset, overrides)
    return curated


@dsl.pipeline(name="klear-sample", display_name="Sample responses (rerun)",
              description="Rerun sampling alone: a model or an endpoint on existing prompts")
@_run_form("sampling", overrides=SAMPLE_KEYS)
def sample_pipeline(prompts_uri: str, run_root: str, name: str = "teacher", model_uri: str = "", endpoint: str = "",
                    served_model: str = "", key_secret: str = ENDPOINT_SECRET, preset: str = "paper",
                    overrides: list = [], gpus: str = MODEL_8B_POD[0],
                    cpu: str = MODEL_8B_POD[1], memory: str = MODEL_8B_POD[2], gpu_node_selector: dict = {},
                    gpu_tolerations: list = [], slices: int = 1, plan_cluster: str = "h100-80gb-x8",
                    plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Dataset:
    """n responses per prompt from a model folder (vLLM on the pod's GPUs) or an OpenAI-compatible endpoint.

    Args:
        prompts_uri: Prompts: a curate output or a folder of JSONL/Parquet files with `id` and `prompt`.
        name: What the samples are for (teacher, reference, filter-math): names the output folder.
        model_uri: The model to sample, a Hugging Face folder (s3://...); or give an endpoint.
        endpoint: OpenAI-compatible API root, e.g. http://teacher:8000/v1.
        served_model: The model name the endpoint serves.
        key_secret: The Secret holding the endpoint's API key (key `api-key`), if it needs one.
        preset: Sampling config (paper: T 0.6, top_p 0.95, 32K tokens, n 16).
        overrides: Config overrides, "key=value" (e.g. "n=8", "backend=records").
        gpus: GPUs of each sampling pod: "0" for an endpoint; an 8B model, 1 (its engine at tensor-parallel 1).
        slices: Pods the sampling is spread over (slices of the prompts by a hash of their id, then one merge).
    """
    prompts = _import(prompts_uri, dsl.Dataset, "prompts")
    samples = _sample(name, prompts.output, preset, overrides, run_root, gpus, cpu, memory,
                      (gpu_node_selector, gpu_tolerations),
                      _digest("sampling inputs", recompute, prompts_uri, model_uri, preset=preset), model_uri=model_uri, endpoint=endpoint,
                      served_model=served_model, key_secret=key_secret, slices=slices).outputs["samples"]
    _plan_first("klear-sample", plan_cluster, plan_gpu_quota, preset, overrides, model_uri=model_uri, gpus=gpus,
                slices=slices)
    return samples


@dsl.pipeline(name="klear-judge", display_name="Judge samples (rerun)",
              description="Rerun judging alone on existing samples")
@_run_form(overrides=JUDGE_KEYS)
def judge_pipeline(samples_uri: str, run_root: str, problems_uri: str = "", preset: str = "paper",
                   overrides: list = [], plan_cluster: str = "h100-80gb-x8",
                   plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Dataset:
    """Pass rates of saved samples: math answers by math-verify, programs in the sandbox.

    Args:
        samples_uri: A `klear sample` output.
        problems_uri: Problems with answers/tests, when the samples' prompts do not carry them.
        preset: judge config (paper, tiny).
    """
    samples = _import(samples_uri, dsl.Dataset, "samples")
    task = judge(samples=samples.output, problems_uri=problems_uri, preset=preset, overrides=overrides,
                 run_root=run_root, input_digest=_digest("judge inputs", recompute, samples_uri, problems_uri, preset=preset))
    judged = _runs_untrusted_code(_deterministic(task.set_display_name("judge"))).outputs["judged"]
    _plan_first("klear-judge", plan_cluster, plan_gpu_quota, preset, overrides)
    return judged


@dsl.pipeline(name="klear-sft-data", display_name="Build SFT data (rerun)",
              description="Rerun sft-data alone on existing teacher and reference samples")
@_run_form(overrides=SFT_DATA_KEYS)
def sft_data_pipeline(teacher_samples_uri: str, reference_samples_uri: str, target_model_uri: str, run_root: str,
                      preset: str = "paper", overrides: list = [], plan_cluster: str = "h100-80gb-x8",
                      plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Dataset:
    """SFT records from teacher samples, with difficulty from the reference model's pass rate.

    Args:
        teacher_samples_uri: The teacher's `klear sample` output.
        reference_samples_uri: The reference model's `klear sample` output on the same prompts.
        target_model_uri: The model to be trained (its tokenizer measures lengths).
        preset: sft-data config (paper, tiny).
        overrides: Config overrides, e.g. ["policy=drop_incorrect"] (keep_all, drop_incorrect_on_easy, drop_incorrect).
    """
    teacher = _import(teacher_samples_uri, dsl.Dataset, "teacher samples")
    reference = _import(reference_samples_uri, dsl.Dataset, "reference samples")
    target = _import(target_model_uri, dsl.Model, "target model (tokenizer)")
    task = cached_stage(sft_data, (teacher_samples_uri, reference_samples_uri, target_model_uri),
                        what="sft-data inputs", recompute=recompute, preset=preset, teacher_samples=teacher.output,
                        reference_samples=reference.output, target_model=target.output, overrides=overrides,
                        run_root=run_root)
    records = _runs_untrusted_code(_deterministic(task.set_display_name("sft-data"))).outputs["records"]
    _plan_first("klear-sft-data", plan_cluster, plan_gpu_quota, preset, overrides, model_uri=target_model_uri)
    return records


@dsl.pipeline(name="klear-sft", display_name="Long-CoT SFT (rerun)",
              description="Rerun SFT alone on an existing model and SFT data")
@_run_form("training", overrides=SFT_KEYS)
def sft_pipeline(base_model_uri: str, data_uri: str, run_root: str, preset: str = "paper", overrides: list = [],
                 gpus_per_node: str = GPUS, nodes: int = 1, cpu: str = SFT_CPU, memory: str = NODE_MEMORY,
                 gpu_node_selector: dict = {}, gpu_tolerations: list = [], plan_cluster: str = "h100-80gb-x8",
                 plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Model:
    """Long-CoT SFT.

    Args:
        base_model_uri: The model to train, a Hugging Face folder (s3://...).
        data_uri: SFT records: an sft-data output.
        run_root: Object-storage root of this run's outputs and checkpoints (s3://bucket/runs).
        preset: sft config (paper, tiny, demo).
        cpu: CPU per training node.
    """
    base = _import(base_model_uri, dsl.Model, "base model")
    data = _import(data_uri, dsl.Dataset, "SFT data")
    model = _sft(base.output, data.output, preset, run_root, gpus_per_node, nodes, cpu, memory,
                 (gpu_node_selector, gpu_tolerations),
                 recompute, (base_model_uri, data_uri), overrides).outputs["model"]
    _plan_first("klear-sft", plan_cluster, plan_gpu_quota, preset, overrides, model_uri=base_model_uri, nodes=nodes,
                gpus_per_node=gpus_per_node)
    return model


@dsl.pipeline(name="klear-rl-filter", display_name="Filter RL data (rerun)",
              description="Rerun RL data filtering alone on existing problems and samples")
@_run_form(overrides=RL_FILTER_KEYS)
def rl_filter_pipeline(problems_uri: str, filter_samples_uri: str, run_root: str, task: str = "math",
                       benchmark_uris: list = [], preset: str = "paper", overrides: list = [],
                       plan_cluster: str = "h100-80gb-x8", plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Dataset:
    """RL problems the filter model solves reliably, decontaminated against the test sets.

    Args:
        problems_uri: Candidate RL problems (math with `answer`, code with `tests`).
        filter_samples_uri: The filter model's `klear sample` output on them.
        task: math or code.
        preset: rl-filter config (paper, tiny).
        overrides: Config overrides, "key=value" (e.g. "keep_above=0.25", "judge.verifier.timeout_s=6").
    """
    problems = _import(problems_uri, dsl.Dataset, "RL problems")
    samples = _import(filter_samples_uri, dsl.Dataset, "filter-model samples")
    digest = _digest("rl-filter inputs", recompute, problems_uri, filter_samples_uri, uris=benchmark_uris,
                     preset=preset)
    rl_data = _rl_filter(task, problems.output, samples.output, benchmark_uris, preset, overrides, run_root,
                         digest).outputs["rl_data"]
    _plan_first("klear-rl-filter", plan_cluster, plan_gpu_quota, preset, overrides)
    return rl_data


def _rl_rerun(rl_task, model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes, cpu, memory,
              scheduling, plan_cluster, plan_gpu_quota, recompute) -> dsl.Model:
    policy = _import(model_uri, dsl.Model, "policy")
    data = _import(data_uri, dsl.Dataset, f"{rl_task} RL data")
    model = _gppo(rl_task, policy.output, data.output, preset, run_root, gpus_per_node, nodes, cpu, memory,
                  scheduling, recompute, (model_uri, data_uri), f"{rl_task} RL inputs", overrides).outputs["model"]
    _plan_first(f"klear-gppo-{rl_task}", plan_cluster, plan_gpu_quota, preset, overrides, model_uri=model_uri,
                nodes=nodes, gpus_per_node=gpus_per_node)
    return model


@dsl.pipeline(name="klear-gppo-math", display_name="Math RL with GPPO (rerun)",
              description="Rerun math RL alone on an existing model and math RL data")
@_run_form("training", overrides=GPPO_KEYS)
def gppo_math_pipeline(model_uri: str, data_uri: str, run_root: str, preset: str = "math", overrides: list = [],
                       gpus_per_node: str = GPUS, nodes: int = 1, cpu: str = RL_CPU, memory: str = NODE_MEMORY,
                       gpu_node_selector: dict = {}, gpu_tolerations: list = [],
                       plan_cluster: str = "h100-80gb-x8", plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Model:
    """Math RL with GPPO.

    Args:
        model_uri: The policy to train (the SFT model), a Hugging Face folder (s3://...).
        data_uri: Math RL problems: an rl-filter output.
        run_root: Object-storage root of this run's outputs and checkpoints (s3://bucket/runs).
        preset: gppo config (math, release-math, tiny-math, demo-math).
        overrides: Config overrides, e.g. ["loss=cispo"] for an ablation arm.
        cpu: CPU per training node (reward workers score on CPU).
    """
    return _rl_rerun("math", model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes, cpu, memory,
                     (gpu_node_selector, gpu_tolerations), plan_cluster, plan_gpu_quota, recompute)


@dsl.pipeline(name="klear-gppo-code", display_name="Code RL with GPPO (rerun)",
              description="Rerun code RL alone on an existing model and code RL data")
@_run_form("training", overrides=GPPO_KEYS)
def gppo_code_pipeline(model_uri: str, data_uri: str, run_root: str, preset: str = "code", overrides: list = [],
                       gpus_per_node: str = GPUS, nodes: int = 1, cpu: str = RL_CPU, memory: str = NODE_MEMORY,
                       gpu_node_selector: dict = {}, gpu_tolerations: list = [],
                       plan_cluster: str = "h100-80gb-x8", plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Model:
    """Code RL with GPPO (programs run in the sandbox).

    Args:
        model_uri: The policy to train (the math RL model), a Hugging Face folder (s3://...).
        data_uri: Code RL problems: an rl-filter output.
        run_root: Object-storage root of this run's outputs and checkpoints (s3://bucket/runs).
        preset: gppo config (code, release-code, tiny-code).
        overrides: Config overrides, e.g. ["loss=clip_higher"] for an ablation arm.
        cpu: CPU per training node (reward workers run programs on CPU).
    """
    return _rl_rerun("code", model_uri, data_uri, preset, overrides, run_root, gpus_per_node, nodes, cpu, memory,
                     (gpu_node_selector, gpu_tolerations), plan_cluster, plan_gpu_quota, recompute)


@dsl.pipeline(name="klear-evaluate", display_name="Evaluate a model",
              description="Evaluate one model: sample the benchmarks, then score them")
@_run_form("sampling", overrides=EVALUATE_KEYS, sample_overrides=SAMPLE_KEYS)
def evaluate_pipeline(model_uri: str, run_root: str, benchmark_uris: list = [], preset: str = "paper",
                      overrides: list = [], sample_preset: str = "paper", sample_overrides: list = [],
                      gpus: str = MODEL_8B_POD[0], cpu: str = MODEL_8B_POD[1], memory: str = MODEL_8B_POD[2],
                      gpu_node_selector: dict = {}, gpu_tolerations: list = [], slices: int = 1,
                      judge_slices: int = 1, judge_cpu: str = JUDGE_CPU, plan_cluster: str = "h100-80gb-x8",
                      plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Markdown:
    """AIME/HMMT pass@1 (avg@k) of one model under the paper's protocol.

    Args:
        model_uri: The model to evaluate, a Hugging Face folder (s3://...).
        benchmark_uris: Test sets; empty: the shipped AIME24/AIME25/HMMT25.
        preset: Evaluation protocol (paper: avg@64, 32K; paper-64k: YaRN).
        overrides: Evaluation config overrides, e.g. ["only=[aime24]"] (sampling.* also sets the protocol's sampling).
        sample_preset: Sampling config of the model.
        sample_overrides: Sampling overrides the protocol leaves open, e.g. ["concurrency=64"] (the protocol's
            settings win).
        gpus: GPUs of the sampling pod.
        slices: Pods the benchmark sampling is spread over (then one merge).
        judge_slices: Pods the judging of the samples is spread over (the preset's judge settings; then one merge
            that evaluate reads).
        judge_cpu: CPU of each judging pod (judge slices, evaluate): one verifier worker per core.
    """
    model = _import(model_uri, dsl.Model, "model")
    digest = _digest("benchmarks", recompute, uris=benchmark_uris, preset=preset)
    prompts = cached_stage(evaluation_prompts, digest=digest, preset=preset, benchmark_uris=benchmark_uris,
                           overrides=overrides, sampling_overrides=sample_overrides, run_root=run_root)
    _deterministic(prompts.set_display_name("evaluate: benchmark prompts"), "2", "8Gi")
    math = _sample("eval-math", prompts.outputs["math_prompts"], sample_preset,
                   prompts.outputs["math_sample_overrides"], run_root, gpus, cpu, memory,
                   (gpu_node_selector, gpu_tolerations),
                   _digest("model sampling inputs", recompute, model_uri, preset=sample_preset), model=model.output,
                   slices=slices)
    judging = _evaluation_problems(benchmark_uris, preset, overrides, run_root, digest)
    judged = _judge("eval-math", math.outputs["samples"], judging.outputs["Output"], run_root, judge_cpu,
                    judge_slices, digest, problems=judging.outputs["problems"])
    task = cached_stage(evaluate, digest=digest, preset=preset, samples=judged.outputs["judged"],
                        benchmark_uris=benchmark_uris, overrides=overrides, run_root=run_root, label="model")
    summary = _runs_untrusted_code(_deterministic(task.set_display_name("evaluate"), judge_cpu)).outputs["summary"]
    _plan_first("klear-evaluate", plan_cluster, plan_gpu_quota, preset, overrides, model_uri=model_uri, gpus=gpus,
                slices=slices)
    return summary


@dsl.pipeline(name="klear-evaluate-samples", display_name="Evaluate saved samples",
              description="Rescore saved samples (no sampling)")
@_run_form(overrides=EVALUATE_KEYS)
def evaluate_samples_pipeline(samples_uri: str, run_root: str, benchmark_uris: list = [], preset: str = "paper",
                              overrides: list = [], label: str = "model", judge_slices: int = 1,
                              judge_cpu: str = JUDGE_CPU, plan_cluster: str = "h100-80gb-x8",
                              plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Markdown:
    """Score saved samples of a model again (another protocol, a fixed verifier) without sampling.

    Args:
        samples_uri: A `klear sample` output on evaluation prompts (e.g. <run>/sample-eval-rl-math).
        benchmark_uris: The test sets the samples answer; empty: the shipped AIME24/AIME25/HMMT25.
        preset: Evaluation protocol (paper, demo).
        overrides: Config overrides, e.g. ["settings_check=warn"] or ["judge.verifier.allow_unconfined=true"].
        label: The model's name in the report.
        judge_slices: Pods the judging of the samples is spread over (the preset's judge settings; then one merge
            that evaluate reads).
        judge_cpu: CPU of each judging pod (judge slices, evaluate): one verifier worker per core.
    """
    samples = _import(samples_uri, dsl.Dataset, "samples")
    digest = _digest("evaluate inputs", recompute, samples_uri, uris=benchmark_uris, preset=preset)
    judging = _evaluation_problems(benchmark_uris, preset, overrides, run_root, digest)
    judged = _judge("eval-samples", samples.output, judging.outputs["Output"], run_root, judge_cpu, judge_slices,
                    digest, problems=judging.outputs["problems"])
    task = cached_stage(evaluate, digest=digest, preset=preset, samples=judged.outputs["judged"],
                        benchmark_uris=benchmark_uris, overrides=overrides, run_root=run_root, label=label)
    summary = _runs_untrusted_code(_deterministic(task.set_display_name("evaluate"), judge_cpu)).outputs["summary"]
    _plan_first("klear-evaluate-samples", plan_cluster, plan_gpu_quota, preset, overrides)
    return summary


PIPELINES = {
    "klear-reasoner": klear_pipeline,
    "klear-curate": curate_pipeline,
    "klear-sample": sample_pipeline,
    "klear-judge": judge_pipeline,
    "klear-sft-data": sft_data_pipeline,
    "klear-sft": sft_pipeline,
    "klear-rl-filter": rl_filter_pipeline,
    "klear-gppo-math": gppo_math_pipeline,
    "klear-gppo-code": gppo_code_pipeline,
    "klear-evaluate": evaluate_pipeline,
    "klear-evaluate-samples": evaluate_samples_pipeline,
}
