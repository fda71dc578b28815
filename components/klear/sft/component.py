"""KFP component of the sft stage: a thin wrapper around the stage's spec (`klear.sft.stage.STAGE`), launched on
CPU, one GPU node or several nodes as `klear.training.launch.run_training_stage` describes."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from klear.common.config import keys_text
from klear.common.images import GPU_IMAGE
from klear.sft.config import SftConfig

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text(SftConfig, "; ")


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def sft(
    base_model: Input[Model],
    data: Input[Dataset],
    preset: str,
    overrides: list,
    gpus_per_node: str,
    nodes: int,
    run_root: str,
    model: Output[Model],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    curves: Output[HTML],
    input_digest: str = "",
):
    """Long-CoT SFT of `base_model` on `data` (assistant-only loss, packing, checkpoints to object storage).

    Args:
        base_model: the model to fine-tune (Hugging Face folder, published or imported).
        data: the SFT records (sft-data's output, or JSONL/Parquet of chat records).
        preset: sft config preset (paper, tiny) or a YAML file path.
        overrides: sft config overrides, "key=value" strings (`klear sft --help-keys` lists the keys).
        gpus_per_node: GPUs per node, a whole number as a string: the pipeline parameter that also sets the pod's
            GPU limit; "0" trains on CPU.
        nodes: nodes of the training job (1 = in this pod; more = a Kubeflow Trainer job this pod launches).
        run_root: where stage outputs go, `<run_root>/<run id>/sft`; checkpoints under it.
        model: the published model: weights, tokenizer, report.json, report.md, logs/.
        summary: report.md, shown in the KFP UI.
        metrics: records read, kept and skipped (per reason), steps, and the final training figures.
        curves: the training curves (HTML, also in the model's logs/ and each checkpoint).
        input_digest: the content digest of the inputs read by URI and of the config files (the digest step): only
            part of KFP's cache key, so a new run with the same inputs and settings reuses the trained model.
    """
    from klear.common import kfp_io, tracking
    from klear.sft.stage import STAGE
    from klear.training.launch import run_training_component

    run_training_component(STAGE, "sft", base_model, data, preset, list(overrides), gpus_per_node, nodes, run_root,
                           model, summary, metrics)
    tracking.publish_curves(kfp_io.output_location(run_root, "sft"), curves.path)
