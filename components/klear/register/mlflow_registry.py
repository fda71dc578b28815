"""MLflow: the model as a logged model of its training run's experiment (a reference: its location, digest and card,
no weights), a version of a registered model (source: the published location), and the training run completed
with the evaluation (`eval/<benchmark>/<metric>` metrics linked to the logged model, the report as artifacts) and
tags naming the model and its version.

Everything is found again by the model's content digest (the tag `klear.digest` on the logged model and the
version): registering the same content twice adds nothing, so a retried pod is harmless. Two registrations racing
may both create a version; each then keeps the lowest-numbered one and deletes its own if it is not that one.

Credentials come from the environment only (MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN, or user:password@ in
MLFLOW_TRACKING_URI), as for the training stages (klear.common.tracking); every message is redacted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from klear.common import storage, tracking
from klear.common.config import clip
from klear.register.entries import (
    DIGEST_TAG,
    Evaluation,
    MlflowRegistration,
    PublishedModel,
    RegisterError,
    changed_metrics,
    evaluation_metrics,
    evaluation_tags,
    mlflow_page,
    mlflow_source,
    model_reference,
    model_tags,
    run_tags,
    version_description,
    version_tags,
)

log = logging.getLogger("klear.register")
REFERENCE_FILE = "klear_model.json"
ERROR_LIMIT = 600  # characters of MLflow's error in a message (they carry the response body)


def _failure(what: str, uri: str, exc: BaseException) -> RegisterError:
    """MLflow's failure as a RegisterError, redacted (MLflow's messages name the URL, user:password@ included)."""
    return RegisterError(f"MLflow at {tracking.redact(uri)!r}: {what}: {clip(tracking.redact(str(exc)), ERROR_LIMIT)}")


@contextlib.contextmanager
def _mlflow_errors(what: str, uri: str) -> Iterator[None]:
    try:
        yield
    except RegisterError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the client or the server; re-raised, redacted
        raise _failure(what, uri, exc) from None


def _is_missing(exc: Exception) -> bool:
    return getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST"


def check_tracking_uri(uri: str) -> None:
    """A server the registry can live on: not a local file store (MLflow 3 refuses one; a pod loses it), unless
    MLFLOW_ALLOW_FILE_STORE opts in, as for the training stages."""
    if tracking.is_file_store(uri) and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        raise RegisterError(f"MLflow tracking URI {tracking.redact(uri)!r} is a local file store: use a tracking "
                            "server, http(s)://host:port (MLFLOW_ALLOW_FILE_STORE=true opts in to a file store)")


def register(uri: str, name: str, model: PublishedModel, evaluation: Evaluation | None,
             experiment: str = "") -> MlflowRegistration:
    """Register `model` as a version of `name` on the MLflow server at `uri` (idempotent by content digest) and
    complete its training run, if it had one there, with `evaluation`."""
    from mlflow.tracking import MlflowClient

    check_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = _training_run(client, uri, model)
    with _mlflow_errors("the experiment", uri):
        experiment_id = run.info.experiment_id if run is not None else _experiment_id(client, experiment)
    run_id = run.info.run_id if run is not None else ""
    with _mlflow_errors("the logged model", uri):
        logged = _logged_model(client, experiment_id, name, model, evaluation, run_id)
    run_url = tracking.mlflow_run_url(uri, experiment_id, run_id)
    with _mlflow_errors(f"the registered model {name!r}", uri):
        _registered_model(client, name)
        version, created = _version(client, name, model, evaluation, logged, run_id, run_url)
    result = MlflowRegistration(name, version, created, mlflow_source(model.uri, logged), logged, experiment_id,
                                run_id, run_url, mlflow_page(uri, "models", name, "versions", version))
    if run is not None:
        with _mlflow_errors(f"the training run {run_id}", uri):
            _complete_run(client, run, model, evaluation, result)
    log.info("mlflow: %s version %s (%s), source %s", name, version, "new" if created else "registered before",
             result.source)
    return result


def _training_run(client: Any, uri: str, model: PublishedModel) -> Any:
    """The MLflow run the model was trained in (its run record), on this server; None when it had none."""
    run_id = model.run.get("mlflow", "")
    if not run_id:
        return None
    try:
        return client.get_run(run_id)
    except Exception as exc:  # noqa: BLE001 - not found, or the server failing: both named
        if _is_missing(exc):
            raise RegisterError(f"{model.uri}: its training run {run_id} ({tracking.RUN_RECORD}) is not on the MLflow "
                                f"server {tracking.redact(uri)!r}: register on the server it was trained with "
                                "(--tracking-uri)") from None
        raise _failure(f"the training run {run_id}", uri, exc) from None


def _experiment_id(client: Any, name: str) -> str:
    """For a model trained without MLflow: the experiment its logged model goes into (`--experiment`, else
    MLFLOW_EXPERIMENT_NAME, else the server's Default experiment), created when missing."""
    name = name or os.environ.get("MLFLOW_EXPERIMENT_NAME", "")
    if not name:
        return "0"
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


def _logged_model(client: Any, experiment_id: str, name: str, model: PublishedModel, evaluation: Evaluation | None,
                  run_id: str) -> str:
    """The model's logged model in the experiment (found by its digest, else created): tags naming the model, and
    two small artifacts, klear_model.json (the reference) and README.md (the card). Returns its id."""
    found = client.search_logged_models([experiment_id], filter_string=f"tags.`{DIGEST_TAG}` = '{model.digest}'",
                                        max_results=10)
    ready = [m for m in found if str(m.status) == "READY"]
    if ready:
        return str(sorted(ready, key=lambda m: m.creation_timestamp)[0].model_id)
    logged = found[0] if found else client.create_logged_model(
        experiment_id, name=name, source_run_id=run_id or None, tags=model_tags(model), model_type=f"klear-{model.stage}")
    with tempfile.TemporaryDirectory(prefix="klear-register-") as tmp:
        (Path(tmp) / REFERENCE_FILE).write_text(json.dumps(model_reference(model, evaluation), indent=2))
        (Path(tmp) / "README.md").write_text(model.card)
        client.log_model_artifacts(logged.model_id, tmp)
    client.finalize_logged_model(logged.model_id, "READY")
    return str(logged.model_id)


def _registered_model(client: Any, name: str) -> None:
    try:
        client.get_registered_model(name)
        return
    except Exception as exc:  # noqa: BLE001 - only "does not exist" leads on
        if not _is_missing(exc):
            raise
    try:
        client.create_registered_model(name, tags={"klear.recipe": "Klear-Reasoner (arXiv 2508.07629)"},
                                       description="Klear-Reasoner models registered by `klear register`: each version "
                                                   "references a published model folder (its source).")
    except Exception as exc:  # noqa: BLE001 - another registration created it meanwhile
        if getattr(exc, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
            raise


def _versions_of(client: Any, name: str, digest: str) -> list[Any]:
    found = client.search_model_versions(f"name = '{name}' and tags.`{DIGEST_TAG}` = '{digest}'")
    return sorted(found, key=lambda v: int(v.version))


def _version(client: Any, name: str, model: PublishedModel, evaluation: Evaluation | None, logged: str, run_id: str,
             run_url: str) -> tuple[str, bool]:
    """(version, created): the version of this content (by its digest tag), brought up to date: registered from the
    same place, its tags and description (the card gains the scores of later evaluations); the same content copied
    elsewhere, the evaluation's tags only (the version keeps naming the place it was registered from). Else a new
    version."""
    tags = version_tags(model, evaluation)
    description = version_description(model.card, model.card_uri)
    found = _versions_of(client, name, model.digest)
    if found:
        version = found[0]
        same_place = version.tags.get("klear.uri") == model.uri
        if not same_place:
            log.info("mlflow: the content of %s is registered already as %s version %s, from %s", model.uri, name,
                     version.version, version.tags.get("klear.uri") or version.source)
        for key, value in (tags if same_place else evaluation_tags(evaluation)).items():
            if version.tags.get(key) != value:
                client.set_model_version_tag(name, version.version, key, value)
        if same_place and version.description != description:
            client.update_model_version(name, version.version, description=description)
        return str(version.version), False
    created = client.create_model_version(name, mlflow_source(model.uri, logged), run_id=run_id or None, tags=tags,
                                          run_link=run_url or None, description=description, model_id=logged)
    # A registration racing this one (a retried pod beside its predecessor) may have created one too: the lowest
    # version stays, the others go.
    found = _versions_of(client, name, model.digest)
    if found and str(found[0].version) != str(created.version):
        with contextlib.suppress(Exception):
            client.delete_model_version(name, created.version)
        return str(found[0].version), False
    return str(created.version), True


def _complete_run(client: Any, run: Any, model: PublishedModel, evaluation: Evaluation | None,
                  result: MlflowRegistration) -> None:
    """The training run gets the evaluation's metrics (changed values only, linked to the logged model), its report
    files as artifacts (evaluation/<folder>/), tags naming the model and its registered version, and the logged
    model as its output."""
    from mlflow.entities import Metric, RunTag
    from mlflow.entities.logged_model_output import LoggedModelOutput

    run_id = run.info.run_id
    if evaluation is not None:
        result.metrics = changed_metrics(run.data.metrics, evaluation_metrics(evaluation.benchmarks))
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, model.global_step, model_id=result.logged_model_id)
                   for key, value in sorted(result.metrics.items())]
        if metrics:
            client.log_batch(run_id, metrics=metrics)
        with tempfile.TemporaryDirectory(prefix="klear-register-") as tmp:
            for name in evaluation.reports:
                local = Path(tmp) / name
                local.write_bytes(storage.read_bytes(storage.Uri.parse(evaluation.uri).join(name)))
                client.log_artifact(run_id, str(local), f"evaluation/{evaluation.folder}")
                result.artifacts.append(f"evaluation/{evaluation.folder}/{name}")
    tags = run_tags(model, f"{result.registered_model}/{result.version}")
    changed = [RunTag(key, value) for key, value in tags.items() if run.data.tags.get(key) != value]
    if changed:
        client.log_batch(run_id, tags=changed)
    outputs = getattr(getattr(run, "outputs", None), "model_outputs", None) or []
    if result.logged_model_id not in {output.model_id for output in outputs}:
        client.log_outputs(run_id, [LoggedModelOutput(result.logged_model_id, model.global_step)])
