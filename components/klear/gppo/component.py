"""KFP components of the gppo stage, one per RL run of the paper: math RL after SFT, then code RL.

Thin wrappers around `klear.gppo.stage.run`, launched on CPU, one GPU node or several nodes as
`klear.training.launch.run_training_stage` describes. Two components rather than one used twice, so
the run's graph names them as the paper does and each keeps its own preset.
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from klear.common.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def gppo_math(
    policy: Input[Model],
    data: Input[Dataset],
    preset: str,
    overrides: list,
    gpus_per_node: int,
    nodes: int,
    run_root: str,
    run_id: str,
    model: Output[Model],
    summary: Output[Markdown],
    metrics: Output[Metrics],
):
    """Math RL of `policy` (the SFT model) on `data` with GPPO; checkpoints to object storage."""
    from klear.training.launch import run_training_component

    run_training_component("gppo", "gppo-math", policy, data, preset, list(overrides), gpus_per_node, nodes, run_root,
                           run_id, model, summary, metrics)


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def gppo_code(
    policy: Input[Model],
    data: Input[Dataset],
    preset: str,
    overrides: list,
    gpus_per_node: int,
    nodes: int,
    run_root: str,
    run_id: str,
    model: Output[Model],
    summary: Output[Markdown],
    metrics: Output[Metrics],
):
    """Code RL of `policy` (the math RL model) on `data` with GPPO; checkpoints to object storage."""
    from klear.training.launch import run_training_component

    run_training_component("gppo", "gppo-code", policy, data, preset, list(overrides), gpus_per_node, nodes, run_root,
                           run_id, model, summary, metrics)
