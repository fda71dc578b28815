"""KFP component of the gppo stage, used once per RL run of the paper: `task="math"` after SFT, then
`task="code"` from the math RL model. A thin wrapper around the stage's spec (`klear.gppo.stage.STAGE`),
launched on CPU, one GPU node or several nodes as `klear.training.launch.run_training_stage` describes.
The pipeline names each use in the run's graph ("math RL: GPPO ...", "code RL: GPPO ...").
"""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from klear.common.config import keys_text
from klear.common.images import GPU_IMAGE
from klear.gppo.config import GppoConfig

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text(GppoConfig, "; ")


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def gppo(
    policy: Input[Model],
    data: Input[Dataset],
    task: str,
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
    """RL of `policy` on `data` with GPPO; checkpoints to object storage.

    Args:
        policy: the model to train (the SFT output, or the math RL model for code RL).
        data: the RL problems (rl-filter's output, or JSONL/Parquet with `answer` or `tests`).
        task: "math" or "code": names the step (its output goes to `<run_root>/<run id>/gppo-<task>`) and must
            match the preset's task.
        preset: gppo config preset (math, code, release-math, release-code, tiny-math, ...) or a YAML file path.
        overrides: gppo config overrides, "key=value" strings (`klear gppo --help-keys` lists the keys).
        gpus_per_node: GPUs per node, a whole number as a string: the pipeline parameter that also sets the pod's
            GPU limit; "0" trains on CPU.
        nodes: nodes of the training job (1 = in this pod; more = a Kubeflow Trainer job this pod launches).
        run_root: where stage outputs go; checkpoints under the output.
        model: the published model: weights, tokenizer, report.json, report.md, logs/ (rollouts.jsonl among them).
        summary: report.md, shown in the KFP UI.
        metrics: prompts read, kept and skipped (per reason), steps, and the final training figures (reward,
            accuracy, reward timeouts).
        curves: the training and validation curves (HTML).
        input_digest: the content digest of the inputs read by URI and of the config files (the digest step): only
            part of KFP's cache key, so a new run with the same inputs and settings reuses the trained model.
    """
    from klear.common import kfp_io, tracking
    from klear.gppo.stage import STAGE
    from klear.training.launch import run_training_component

    config = STAGE.config(preset, list(overrides))
    if task not in ("math", "code") or config.task != task:
        raise ValueError(f"step task {task!r} does not match preset {preset!r} (task {config.task!r}); expected "
                         "math or code, with a preset of the same task")
    run_training_component(STAGE, f"gppo-{task}", policy, data, preset, list(overrides), gpus_per_node, nodes,
                           run_root, model, summary, metrics)
    tracking.publish_curves(kfp_io.output_location(run_root, f"gppo-{task}"), curves.path)  # training and validation curves
