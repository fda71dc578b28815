"""KFP component of the sft stage: a thin wrapper around `klear.sft.stage.run`.

`gpus_per_node` 0 (CPU, kfp.local, tests): the stage runs in this process. One node with GPUs: one
`accelerate launch` process per GPU in this pod. More nodes: a Kubeflow Trainer job runs the same
command on every node; this pod creates it, streams its logs and fails if it fails.
"""

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
    import json
    import subprocess

    from klear.common import kfp_io, storage
    from klear.common.config import load_config
    from klear.sft.config import SftConfig
    from klear.sft.launch import accelerate_command
    from klear.sft.report import metric_items, render_markdown
    from klear.sft.stage import run

    # A fixed location under run_root keeps a retried pod resuming from the same checkpoints.
    target = kfp_io.output_location(model, run_root, run_id, "sft")
    model_uri, data_uri = kfp_io.input_location(base_model), kfp_io.input_location(data)
    if nodes > 1:
        from klear.sft.trainjob import run_trainjob

        run_trainjob(model_uri, [data_uri], target, preset, list(overrides), nodes, gpus_per_node, run_id)
        report = json.loads(storage.read_bytes(storage.Uri.parse(target).join("report.json")))
    elif gpus_per_node > 0:
        subprocess.run(accelerate_command(model_uri, [data_uri], target, preset, list(overrides), gpus_per_node),
                       check=True)
        report = json.loads(storage.read_bytes(storage.Uri.parse(target).join("report.json")))
    else:
        report = run(model_uri, [data_uri], target, load_config(SftConfig, preset, overrides))
    kfp_io.record_output(model, target, {"global_step": report["training"]["global_step"],
                                         "kept": report["data"]["kept"]})
    with open(summary.path, "w") as fh:
        fh.write(render_markdown(report))
    for key, value in metric_items(report):
        metrics.log_metric(key, value)
