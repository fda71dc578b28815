"""KFP component of `klear register`: a thin wrapper around `klear.register.stage.register`.

The GPU image, which has the MLflow client (the training stages report with it); the task asks for no GPU. It writes
nothing under run_root: what it makes lives in the registries, found again by the model's content digest.
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Model, Output

from klear.common.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def register(
    model: Input[Model],
    name: str,
    summary: Output[Markdown],
    evaluation: Input[Dataset] = None,
    name_suffix: str = "",
    kubeflow_registry: str = "",
    experiment: str = "",
):
    """Register a published model (an sft or gppo output) by reference: a version of a registered model in MLflow's
    Model Registry (the tracking Secret's MLFLOW_TRACKING_URI and credentials) whose source is the model's location,
    with its lineage, scores and card; the scores and evaluation report also go into the model's training run.

    Args:
        model: the published model to register (its location is the version's source; nothing is copied).
        name: the registered model's name (letters, digits, _ . -); a version is added per model content.
        summary: what was registered where (new, or found by its content digest), with links, shown in the KFP UI.
        evaluation: an evaluate output that scored the model (its scores become tags, and metrics of the training
            run; its report an artifact of the run), or none.
        name_suffix: appended to `name` (e.g. "-sft": the SFT model registered beside the final one).
        kubeflow_registry: the Kubeflow Model Registry's address (e.g. https://model-registry-service.kubeflow.svc:8443)
            to register the model there too; "" = MLflow only.
        experiment: MLflow experiment of the model's logged model when it was trained without MLflow ("" =
            MLFLOW_EXPERIMENT_NAME, else Default); a model trained with MLflow goes into its run's experiment.
    """
    from klear.common import kfp_io
    from klear.register.stage import register as register_model

    done = register_model(kfp_io.input_location(model), name + name_suffix,
                          kfp_io.input_location(evaluation) if evaluation is not None else None,
                          kubeflow=kubeflow_registry, experiment=experiment)
    with open(summary.path, "w") as fh:
        fh.write(done.markdown())
