"""KFP component of the sft stage: a thin wrapper around `klear.sft.stage.run`, launched on CPU, one GPU
node or several nodes as `klear.common.launch.run_training_stage` describes."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from klear.common.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def sft(
    base_model: Input[Model],
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
    """Long-CoT SFT of `base_model` on `data` (assistant-only loss, packing, checkpoints to object storage)."""
    from klear.common import kfp_io
    from klear.common.launch import run_training_stage
    from klear.sft.report import metric_items, render_markdown

    # A fixed location under run_root keeps a retried pod resuming from the same checkpoints.
    target = kfp_io.output_location(model, run_root, run_id, "sft")
    report = run_training_stage("sft", kfp_io.input_location(base_model), [kfp_io.input_location(data)], target, preset,
                                list(overrides), gpus_per_node, nodes, run_id)
    kfp_io.record_output(model, target, {"global_step": report["training"]["global_step"],
                                         "kept": report["data"]["kept"]})
    with open(summary.path, "w") as fh:
        fh.write(render_markdown(report))
    for key, value in metric_items(report):
        metrics.log_metric(key, value)
