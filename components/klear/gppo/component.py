"""KFP component of the gppo stage, used once per RL run of the paper: `task="math"` after SFT, then
`task="code"` from the math RL model. A thin wrapper around the stage's spec (`klear.gppo.stage.STAGE`),
launched on CPU, one GPU node or several nodes as `klear.training.launch.run_training_stage` describes.
The pipeline names each use in the run's graph ("math RL: GPPO ...", "code RL: GPPO ...").
"""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from klear.common.images import GPU_IMAGE


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
    """RL of `policy` on `data` with GPPO; checkpoints to object storage. `task` ("math" or "code") names the
    step (its output goes to `<run_root>/<run id>/gppo-<task>`) and must match the preset's task.
    `gpus_per_node` is a whole number as a string: the pipeline parameter that also sets the pod's GPU limit.
    `input_digest`: the content digest of the inputs read by URI and of the config files (the digest step): only
    part of KFP's cache key, so a new run with the same inputs and settings reuses the trained model."""
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
