"""`klear register` for real: a published tiny model on the S3 server, evaluated by the real evaluate stage,
registered on a real MLflow server and read back through MlflowClient (version, source, run link, description, tags;
the run's metrics, report artifacts and tags; the logged model); the same content registered again adds nothing;
a bad model URI fails naming it. (The Kubeflow Model Registry and the KFP component: test_component.py.)"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from klear.common import lineage, model_card, storage, tracking
from klear.evaluate.samples import parse_sample_specs
from klear.evaluate.stage import run as evaluate
from klear.register.entries import DIGEST_TAG, RegisterError, version_description
from klear.register.stage import read_model, register
from tests.commands import klear
from tests.evaluate.helpers import SAMPLE_SCHEMA, TINY_SAMPLING
from tests.evaluate.test_scores import _benchmark, _config, planted_rows

SECRET = "s3cr3t-register-password-4d2e"
EXPERIMENT = "klear-register-test"


def _publish_model(tiny_model: str, output: str, data: str, tracked: dict[str, str], staging: Path) -> None:
    """The tiny model published as `klear sft` publishes a model (no training: the weights are the tiny model's),
    with its training run's record in logs/ (none without a tracker) and its card."""
    shutil.copytree(tiny_model, staging)
    if tracked:
        (staging / "logs").mkdir()
        (staging / tracking.RUN_RECORD).write_text(json.dumps(tracked))
    storage.publish_dir(staging, output, meta={"stage": "sft", "global_step": 7, "inputs": {"model": [tiny_model],
                                                                                           "data": [data]},
                                               "lineage": {**lineage.RunLineage([tiny_model, data], None).record(),
                                                           "config": {"learning_rate": 8e-5, "num_epochs": 4}}})
    model_card.write(output)


def _publish_samples(model: str, output: str, tmp_path: Path) -> None:
    """The model's evaluation samples (planted: 13 of 32 correct), as `klear sample --model` publishes them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = tmp_path / "rows"
    (rows / "samples").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(planted_rows(), schema=SAMPLE_SCHEMA), rows / "samples" / "part-00000.parquet")
    storage.publish_dir(rows, output, meta={"stage": "sample", "inputs": {"model": [model]}, "settings": {
        "format": 1, "identity": {"engine": "model", "model": model}, "sampling": TINY_SAMPLING},
        "lineage": lineage.RunLineage([model], None).record()})


def _register(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return klear("register", *args, env=env, timeout=180)


def _registered(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_published_model_is_registered_by_reference_with_its_run_scores_and_card(
        mlflow_server: str, tiny_model: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    from mlflow.artifacts import download_artifacts
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server, registry_uri=mlflow_server)
    experiment = client.create_experiment(EXPERIMENT)
    training = client.create_run(experiment, run_name="sft tiny").info.run_id  # the run training would have made
    client.set_terminated(training)
    model, samples, evaluation = (f"{s3_bucket}/run/{name}" for name in ("sft", "sample-eval-sft-math", "evaluate"))
    data = str(tmp_path / "sft.jsonl")
    Path(data).write_text('{"messages": []}\n')
    _publish_model(tiny_model, model, data, tracking.run_record({"mlflow": training}, experiment, mlflow_server),
                   tmp_path / "staging")
    _publish_samples(model, samples, tmp_path)
    report = evaluate(parse_sample_specs([f"sft={samples}"]), evaluation, _config(), [_benchmark(tmp_path)])
    pass1 = report["benchmarks"]["toy"]["pass@1"]

    # The credentials of the chart's Secret are in the environment (this server asks for none): never in an output.
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "trainer")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    caplog.set_level(logging.INFO)
    first = register(model, "klear-tiny", evaluation=evaluation, tracking_uri=mlflow_server)
    printed = capfd.readouterr()
    assert SECRET not in printed.out + printed.err + caplog.text + json.dumps(first.to_json(), default=str)
    assert first.mlflow is not None and first.mlflow.created
    assert first.evaluation is not None and first.evaluation.label == "sft"  # found through the lineage

    version = client.get_model_version("klear-tiny", first.mlflow.version)
    digest = storage.content_digest(model)
    card = storage.read_bytes(f"{model}/README.md").decode()
    assert version.source == model  # a reference: its published location, nothing copied
    assert version.run_id == training
    assert version.run_link == f"{mlflow_server}/#/experiments/{experiment}/runs/{training}"
    assert version.description == version_description(card, f"{model}/README.md")
    assert f"MLflow run {training} (experiment {experiment})" in card  # the card names its run (and the run the card)
    tags = version.tags
    assert tags[DIGEST_TAG] == digest and tags["klear.stage"] == "sft" and tags["klear.card"] == f"{model}/README.md"
    assert tags["klear.input.model"] == tiny_model and tags["klear.input.data"] == data
    assert [step["uri"] for step in json.loads(tags["klear.lineage"])] == [tiny_model, data]
    assert tags["klear.evaluation"] == evaluation and float(tags["eval/toy/pass_at_1"]) == pass1

    # The training run: the scores as metrics (linked to the logged model), the report, tags naming model and version.
    run = client.get_run(training)
    assert run.data.metrics["eval/toy/pass_at_1"] == pass1
    assert run.data.metrics["eval/toy/stderr"] == pytest.approx(report["benchmarks"]["toy"]["stderr"])
    assert {a.path for a in client.list_artifacts(training, "evaluation/evaluate")} == {
        "evaluation/evaluate/report.html", "evaluation/evaluate/report.md"}
    assert run.data.tags["klear.model.uri"] == model and run.data.tags["klear.model.card"] == f"{model}/README.md"
    assert run.data.tags["klear.registered_model"] == f"klear-tiny/{version.version}"
    (logged,) = client.search_logged_models([experiment], filter_string=f"tags.`{DIGEST_TAG}` = '{digest}'")
    assert logged.model_id == first.mlflow.logged_model_id and logged.source_run_id == training
    local = Path(download_artifacts(artifact_uri=logged.artifact_location, dst_path=str(tmp_path / "logged"),
                                    tracking_uri=mlflow_server))
    assert json.loads((local / "klear_model.json").read_text())["uri"] == model
    assert (local / "README.md").read_text() == card

    # A retried pod registers the same content again: the same version, no second one, no metric logged twice.
    again = register(model, "klear-tiny", evaluation=evaluation, tracking_uri=mlflow_server).mlflow
    assert again is not None and not again.created and again.version == version.version and again.metrics == {}
    assert len(client.search_model_versions("name = 'klear-tiny'")) == 1
    assert len(client.search_logged_models([experiment], filter_string=f"tags.`{DIGEST_TAG}` = '{digest}'")) == 1
    assert len(client.get_metric_history(training, "eval/toy/pass_at_1")) == 1

    # The same content published elsewhere is that version too (registered by content), which keeps its source.
    copy = str(tmp_path / "copy")
    shutil.copytree(tmp_path / "staging", tmp_path / "staging-copy")
    storage.publish_dir(tmp_path / "staging-copy", copy, meta=storage.read_manifest(model).meta)
    assert storage.content_digest(copy) == digest
    found = register(copy, "klear-tiny", tracking_uri=mlflow_server).mlflow
    assert found is not None and (found.version, found.created) == (version.version, False)
    assert client.get_model_version("klear-tiny", version.version).tags["klear.uri"] == model
    # Other content on a local path: MLflow takes no local source outside its store, so the version's source is the
    # logged model (models:/<id>), whose tags name the path.
    (tmp_path / "staging-copy" / "generation_config.json").write_text("{}")
    local = str(tmp_path / "local")
    storage.publish_dir(tmp_path / "staging-copy", local, meta={"stage": "sft", "inputs": {}})
    other = register(local, "klear-tiny", tracking_uri=mlflow_server, experiment=EXPERIMENT).mlflow
    assert other is not None and other.created and other.version != version.version
    assert client.get_model_version("klear-tiny", other.version).source == f"models:/{other.logged_model_id}"
    assert client.get_logged_model(other.logged_model_id).tags["klear.uri"] == local

    # Bad input fails before any registry is touched, naming what is wrong.
    missing = f"{s3_bucket}/run/nothing"
    done = _register("--model", missing, "--name", "klear-tiny", "--tracking-uri", mlflow_server)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"klear register: error: --model {missing}: not a published output: {missing} has no _MANIFEST.json" in (
        done.stderr)
    with pytest.raises(RegisterError, match=f"--model {evaluation}: {evaluation}/_MANIFEST.json names stage "
                                            "'evaluate': only a published model"):
        read_model(evaluation)
    with pytest.raises(RegisterError, match=f"--evaluation {model}: .* names stage 'sft', not evaluate"):
        register(model, "klear-tiny", evaluation=model, tracking_uri=mlflow_server)
