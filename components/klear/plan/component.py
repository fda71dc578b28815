"""KFP component of `klear plan`: the first task of klear-reasoner, the same checks on the run's own arguments.

It fails the run in seconds, naming stage and setting, before curate or any sampling starts. No chart values in a
pod (the teacher server's context says "not checked"), and no compiled spec (the Workflow size is the command's).
"""

from kfp import dsl

from klear.common.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def plan_run(
    cluster: str,
    base_model_uri: str,
    reference_model_uri: str,
    teacher_model_uri: str,
    curate_preset: str,
    curate_overrides: list,
    sample_preset: str,
    teacher_overrides: list,
    reference_overrides: list,
    filter_math_overrides: list,
    filter_code_overrides: list,
    sft_data_preset: str,
    sft_data_overrides: list,
    sft_preset: str,
    sft_overrides: list,
    rl_filter_preset: str,
    rl_filter_math_overrides: list,
    rl_filter_code_overrides: list,
    gppo_math_preset: str,
    gppo_math_overrides: list,
    gppo_code_preset: str,
    gppo_code_overrides: list,
    evaluate_preset: str,
    evaluate_overrides: list,
    eval_sample_overrides: list,
    sft_nodes: int,
    sft_gpus_per_node: str,
    rl_nodes: int,
    rl_gpus_per_node: str,
    filter_model_uri: str = "",
    teacher_gpus: str = "0",
    reference_gpus: str = "1",
    filter_gpus: str = "0",
    eval_gpus: str = "1",
    teacher_slices: int = 1,
    reference_slices: int = 1,
    filter_math_slices: int = 1,
    filter_code_slices: int = 1,
    eval_slices: int = 1,
    evaluate_code: bool = False,
    gpu_quota: int = 0,
) -> str:
    """Every settings, context and layout check of `klear plan klear-reasoner` on this run's arguments; raises
    (failing the run) with each failed check's stage, check and detail, else returns the table.

    Args:
        cluster: A shipped node shape (h100-80gb-x8, h200-141gb-x8) the run is planned on.
        base_model_uri: The model to post-train; a model that is none of the shipped shapes skips model-shape checks.
        reference_model_uri: The reference model (its shape, where readable).
        teacher_model_uri: The teacher as a model folder, or "" (endpoint or chart server).
        curate_preset: curate config.
        curate_overrides: curate config overrides.
        sample_preset: sampling config of every sample step.
        teacher_overrides: Sample overrides for the teacher.
        reference_overrides: Sample overrides for the reference model.
        filter_math_overrides: Sample overrides for the RL filter model on the math problems.
        filter_code_overrides: Sample overrides for the RL filter model on the code problems.
        sft_data_preset: sft-data config.
        sft_data_overrides: sft-data config overrides.
        sft_preset: sft config.
        sft_overrides: sft config overrides.
        rl_filter_preset: rl-filter config.
        rl_filter_math_overrides: rl-filter config overrides of the math set.
        rl_filter_code_overrides: rl-filter config overrides of the code set.
        gppo_math_preset: math RL config.
        gppo_math_overrides: math RL overrides.
        gppo_code_preset: code RL config.
        gppo_code_overrides: code RL overrides.
        evaluate_preset: evaluation protocol.
        evaluate_overrides: evaluate config overrides.
        eval_sample_overrides: Sample overrides of the evaluation sampling.
        sft_nodes: Training nodes of SFT (its layout is checked at this count).
        sft_gpus_per_node: GPUs per SFT node ("0": one process on CPU).
        rl_nodes: Training nodes of each RL run (its layout is checked at this count).
        rl_gpus_per_node: GPUs per RL node ("0": one process on CPU).
        filter_model_uri: The RL filter model as a model folder, or "" (an endpoint).
        teacher_gpus: GPUs of each teacher sampling pod.
        reference_gpus: GPUs of each reference sampling pod.
        filter_gpus: GPUs of each filter-model sampling pod.
        eval_gpus: GPUs of each evaluation sampling pod.
        teacher_slices: Teacher sampling pods.
        reference_slices: Reference sampling pods.
        filter_math_slices: Filter-model sampling pods of the math problems.
        filter_code_slices: Filter-model sampling pods of the code problems.
        eval_slices: Sampling pods of each evaluation.
        evaluate_code: Whether LiveCodeBench is sampled too (more evaluation pods).
        gpu_quota: The GPUs the run may hold at once; 0: the cluster shape's nodes x GPUs.
    """
    params = dict(locals())  # first: the run's arguments by their pipeline parameter names
    from klear.plan.command import run_plan

    return run_plan("klear-reasoner", params, params.pop("cluster"), params.pop("gpu_quota"))


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def plan_stage(
    pipeline: str,
    cluster: str,
    preset: str,
    overrides: list,
    model_uri: str = "",
    gpus: str = "0",
    slices: int = 1,
    nodes: int = 1,
    gpus_per_node: str = "0",
    gpu_quota: int = 0,
) -> str:
    """The checks of `klear plan` for a single-stage pipeline on this run's arguments: its settings, and as the
    stage has them its contexts, GPU memory, training layout and pods; raises (failing the run) on a failed check.

    Args:
        pipeline: The single-stage pipeline (klear-sft, klear-gppo-math, klear-evaluate, ...).
        cluster: A shipped node shape (h100-80gb-x8, h200-141gb-x8) the run is planned on.
        preset: The stage's config.
        overrides: The stage's config overrides.
        model_uri: The model the stage reads (its shape, where readable).
        gpus: GPUs of each sampling pod (sampling stages).
        slices: Sampling pods (sampling stages).
        nodes: Training nodes (training stages).
        gpus_per_node: GPUs per training node (training stages).
        gpu_quota: The GPUs the run may hold at once; 0: the cluster shape's nodes x GPUs.
    """
    params = dict(locals())
    from klear.plan.command import run_plan

    params.pop("pipeline"), params.pop("cluster"), params.pop("gpu_quota")
    return run_plan(pipeline, params, cluster, gpu_quota)
