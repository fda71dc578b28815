"""KFP component of a run's exit task: the outcome of the run, whatever it was (klear.common.notify does the work).

The pipeline runs it as the exit task of a `dsl.ExitHandler` around its whole body, so it runs after the last task,
whether the run succeeded or failed. KFP gives an exit task no output of the tasks inside the handler (and a pipeline
no output of them either): it finds what the run made by the storage convention, `<run_root>/<run id>/<stage>`, and
hands the final model and the evaluation report out as the pipeline's outputs.
"""

from kfp import dsl
from kfp.dsl import HTML, Markdown, Model, Output

from klear.common.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def run_outcome(
    status: dsl.PipelineTaskFinalStatus,
    pipeline: str,
    run_root: str,
    summary: Output[Markdown],
    model: Output[Model],
    report: Output[HTML],
    final_model: str = "gppo-code",
    evaluation: str = "evaluate",
):
    """The run's outcome: succeeded or failed, which task failed and why, the scores, the report, the models and their
    MLflow runs, as a Markdown summary; posted to the notify Secret's webhook when it names one.

    Args:
        status: The final status of the tasks the exit handler wraps (KFP fills it in: state, and on kfp.local a
            generic error message; neither runner names the failed task, which the run's Workflow does on a cluster).
        pipeline: The pipeline's name, as the summary and the message show it.
        run_root: Object-storage root of the run's outputs: what it published is under <run_root>/<run id>.
        summary: The outcome as Markdown, shown in the Kubeflow UI.
        model: The run's final model (its location in the metadata, as the stages record theirs), or a note of why
            the run did not publish it.
        report: The evaluation's HTML report, or a page saying why there is none.
        final_model: The output folder of the run's final model (gppo-code: the code RL model).
        evaluation: The output folder of the evaluation whose report.html becomes `report`.
    """
    from klear.common import notify

    notify.report_outcome(status.state, status.pipeline_task_name, status.error_message, pipeline, run_root,
                          summary.path, model, report.path, final_model, evaluation)
