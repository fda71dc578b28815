"""A run that reports its outcome, under kfp.local with data on the real S3 server: the real exit component
(klear.common.outcome_component) behind a dsl.ExitHandler around a small body, a succeeded run and a failed one,
each posting to a webhook receiver on loopback; and the recipe's exit handler as compiled."""

# No `from __future__ import annotations`: KFP reads the components' types at definition.
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from google.protobuf import json_format
from kfp import dsl, local
from kfp.dsl import HTML, Markdown, Model

from klear.common import storage
from klear.common.outcome_component import run_outcome
from tests.common.test_notify import SECRET_PATH, Receiver
from tests.evaluate.helpers import boxed, publish_samples, row, write_jsonl

# The exit component names the CPU image; kfp.local runs it in this environment, as run_local does.
pytestmark = pytest.mark.filterwarnings("ignore:.*custom or non-Python base image.*")
MLFLOW_RUN = "4f2a9c"
EVALUATE = ["benchmarks.toy.kind=math", "benchmarks.toy.k=2", "only=[toy]", "settings_check=warn"]


@dsl.component(base_image="python:3.11")
def publish_model(run_root: str, mlflow_run: str):
    """A trained model's output as the training stages leave it: a checkpoint with the tracker ids, then the model."""
    import json
    import tempfile
    from pathlib import Path

    from klear.common import kfp_io, storage

    target = storage.Uri.parse(kfp_io.output_location(run_root, "gppo-code"))
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, final = Path(tmp, "checkpoint"), Path(tmp, "final")
        checkpoint.mkdir()
        (checkpoint / "tracking_run.json").write_text(json.dumps({"mlflow": mlflow_run}))
        storage.publish_dir(checkpoint, target.join("checkpoints", "step-000000002"), meta={"stage": "gppo"})
        final.mkdir()
        (final / "model.safetensors").write_bytes(b"weights")
        storage.publish_dir(final, target, meta={"stage": "gppo"})


@dsl.component(base_image="python:3.11")
def evaluate_samples(samples: str, benchmark: str, overrides: list, run_root: str):
    """The evaluate stage itself on saved samples, publishing to <run_root>/<run id>/evaluate."""
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.evaluate.config import EvaluateConfig
    from klear.evaluate.samples import parse_sample_specs
    from klear.evaluate.stage import run

    run(parse_sample_specs([f"rl={samples}"]), kfp_io.output_location(run_root, "evaluate"),
        load_config(EvaluateConfig, "tiny", list(overrides)), [benchmark])


@dsl.component(base_image="python:3.11")
def refuse(reason: str):
    raise ValueError(reason)


class Handed(NamedTuple):
    summary: Markdown
    model: Model
    report: HTML


@dsl.pipeline(name="outcome-succeeds")
def succeeding(run_root: str, samples: str, benchmark: str, overrides: list) -> Handed:
    outcome = run_outcome(pipeline="klear-test", run_root=run_root).set_caching_options(False)
    with dsl.ExitHandler(outcome, name="body"):
        model = publish_model(run_root=run_root, mlflow_run=MLFLOW_RUN)
        evaluate_samples(samples=samples, benchmark=benchmark, overrides=overrides, run_root=run_root).after(model)
    return Handed(outcome.outputs["summary"], outcome.outputs["model"], outcome.outputs["report"])


@dsl.pipeline(name="outcome-fails")
def failing(run_root: str, reason: str):
    outcome = run_outcome(pipeline="klear-test", run_root=run_root).set_caching_options(False)
    with dsl.ExitHandler(outcome, name="body"):
        model = publish_model(run_root=run_root, mlflow_run=MLFLOW_RUN)
        refuse(reason=reason).after(model)  # no retries: kfp.local would wait out a backoff


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture()
def run_env(receiver: Receiver, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The variables the cluster gives the exit task (the run id, the notify Secret's keys, the tracking Secret's
    address), set for the kfp.local tasks, which inherit them; kfp.local itself, on a fresh root."""
    run_id = f"local-test-{secrets.token_hex(3)}"
    values = {"KLEAR_RUN_ID": run_id, "KLEAR_NOTIFY_WEBHOOK": receiver.address,
              "KLEAR_KFP_UI_URL": "https://kubeflow.example.com/pipeline",
              "MLFLOW_TRACKING_URI": "http://alice:pa55word-123@mlflow.example.com:5000"}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)
    return {**values, "run_root": f"{s3_bucket}/runs"}


def _no_secret_in(text: str) -> None:
    assert "xoxSECRET" not in text and SECRET_PATH not in text and "pa55word" not in text


@pytest.mark.slow
def test_a_succeeded_run_reports_scores_report_model_and_mlflow_run(run_env: dict[str, str], receiver: Receiver,
                                                                     s3_bucket: str, tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    samples = publish_samples([row("t1", 0, boxed("12")), row("t1", 1, boxed("12")), row("t2", 0, boxed("7")),
                               row("t2", 1, boxed("8"))], f"{s3_bucket}/inputs/samples")
    benchmark = write_jsonl([{"id": "t1", "benchmark": "toy", "problem": "Compute t1.", "answer": "12"},
                             {"id": "t2", "benchmark": "toy", "problem": "Compute t2.", "answer": "7"}],
                            tmp_path / "toy.jsonl")
    handed = succeeding(run_root=run_env["run_root"], samples=samples, benchmark=str(benchmark), overrides=EVALUATE)
    run = storage.Uri.parse(run_env["run_root"]).join(run_env["KLEAR_RUN_ID"])
    published = json.loads(storage.read_bytes(run.join("evaluate", "report.json")))
    score = f"{published['models']['rl']['benchmarks']['toy']['pass@1']:.1f}"

    summary = Path(handed.outputs["summary"].path).read_text()
    assert summary.startswith("# ✅ klear-test: run succeeded\n")
    link = f"https://kubeflow.example.com/pipeline/#/runs/details/{run_env['KLEAR_RUN_ID']}"
    assert f"[open it in Kubeflow]({link})" in summary
    assert f"| model | toy |\n|---|---|\n| rl | {score} |" in summary
    assert f"Report: {run.join('evaluate')}/report.html" in summary
    assert (f"- **gppo-code**: {run.join('gppo-code')}; MLflow run "
            f"[{MLFLOW_RUN}](http://mlflow.example.com:5000/#/runs/{MLFLOW_RUN})") in summary
    # The pipeline's outputs, handed out by the exit task from storage.
    assert handed.outputs["model"].metadata["uri"] == str(run.join("gppo-code"))
    assert Path(handed.outputs["report"].path).read_bytes() == storage.read_bytes(run.join("evaluate", "report.html"))

    (posted,) = receiver.bodies
    text = posted["text"]
    assert text.startswith(f"✅ *klear-test* run `{run_env['KLEAR_RUN_ID']}` succeeded (<{link}|open in Kubeflow>)")
    assert f"*evaluate* (rl, pass@1 %): toy {score}" in text and "|MLflow run>" in text
    printed = capfd.readouterr()
    assert "posted the run's outcome to the webhook at http://127.0.0.1" in printed.out
    _no_secret_in(printed.out + printed.err + summary + text)


@pytest.mark.slow
def test_a_failed_run_reports_the_failure_and_what_it_published(run_env: dict[str, str], receiver: Receiver,
                                                                 tmp_path: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError, match="refuse"):
        failing(run_root=run_env["run_root"], reason="the plan refused: learning_rat is not a key")
    (summary_file,) = (tmp_path / "kfp").glob("outcome-fails-*/run-outcome/summary")
    summary = summary_file.read_text()
    assert summary.startswith("# ❌ klear-test: run failed\n")
    # kfp.local's status names no task (the cluster's Workflow does: tests/common/test_outcome.py).
    assert "## What failed\n\nThe run's status names no task" in summary
    run = storage.Uri.parse(run_env["run_root"]).join(run_env["KLEAR_RUN_ID"])
    assert f"- **gppo-code**: {run.join('gppo-code')}" in summary  # published before the failure
    assert "Evaluation" not in summary  # the run failed before any: absent, not an error
    (report_file,) = (tmp_path / "kfp").glob("outcome-fails-*/run-outcome/report")
    assert "No evaluation report: evaluate was not published by this run" in report_file.read_text()
    (posted,) = receiver.bodies
    assert posted["text"].startswith(f"❌ *klear-test* run `{run_env['KLEAR_RUN_ID']}` failed")
    printed = capfd.readouterr()
    _no_secret_in(printed.out + printed.err + summary + posted["text"])


def test_the_recipe_runs_inside_its_exit_handler() -> None:
    """klear-reasoner as compiled: the root holds the handler's group (shown by the pipeline's name) and the uncached
    exit task fed the group's status; the run's outputs are the exit task's; the notify Secret is a described
    parameter, mounted optional."""
    from pipelines.definitions import PIPELINES

    recipe = PIPELINES["klear-reasoner"]
    root = recipe.pipeline_spec.root
    (group,) = [name for name in root.dag.tasks if name.startswith("exit-handler-")]
    exit_task = root.dag.tasks["run-outcome"]
    assert set(root.dag.tasks) == {group, "run-outcome"} and root.dag.tasks[group].task_info.name == "klear-reasoner"
    assert exit_task.inputs.parameters["status"].task_final_status.producer_task == group
    assert exit_task.trigger_policy.strategy == exit_task.trigger_policy.TriggerStrategy.ALL_UPSTREAM_TASKS_COMPLETED
    assert not exit_task.caching_options.enable_cache
    assert {key: value.artifact_selectors[0].producer_subtask for key, value in root.dag.outputs.artifacts.items()} == {
        "model": "run-outcome", "report": "run-outcome"}
    parameter = root.input_definitions.parameters["notify_secret"]
    assert parameter.default_value.string_value == "klear-notify" and "webhook-url" in parameter.description
    platform = json_format.MessageToDict(recipe.platform_spec)
    executor = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-run-outcome"]
    (notify,) = [s for s in executor["secretAsEnv"] if {"secretKey": "webhook-url", "envVar": "KLEAR_NOTIFY_WEBHOOK"}
                 in s["keyToEnv"]]
    assert notify["optional"] and notify["secretNameParameter"] == {"componentInputParameter": "notify_secret"}
    assert {"secretKey": "kfp-ui-url", "envVar": "KLEAR_KFP_UI_URL"} in notify["keyToEnv"]
