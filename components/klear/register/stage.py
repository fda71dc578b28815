"""Entry point of `klear register`: a published model into MLflow's Model Registry (and the Kubeflow Model Registry).

    klear register --model URI --name NAME [--evaluation URI [--label LABEL]] [--tracking-uri URI]
                   [--experiment NAME] [--kubeflow-registry ADDRESS] [--author NAME]

`--model` is a published sft or gppo output (its manifest names the stage). It is registered by reference: the
version's source is the model's published location, never a copy of the weights. MLflow (the server of
`--tracking-uri`, else MLFLOW_TRACKING_URI; credentials from the environment only, as for training) gets:

    a logged model      in the training run's experiment (or --experiment): tags naming the model (location, digest,
                        stage, card), klear_model.json (the reference, with its lineage) and README.md (the card)
    a model version     of the registered model --name: source the published location (a local path, which MLflow
                        accepts only inside its own store: the logged model, models:/<id>), run_id and run link of
                        the training run, the card as its description, tags: digest, lineage (inputs by role, base
                        model, the chain back to the sources as JSON), and with --evaluation its scores
    the training run    (its id from the model's logs/tracking_run.json) the evaluation's scores as metrics
                        `eval/<benchmark>/<metric>` (pass_at_1, stderr, pass_at_<k>, truncated), its report.html and
                        report.md as artifacts under evaluation/<folder>/, tags naming the model, card and version

`--evaluation` is an evaluate output that scored the model: its label there is found through the lineage (the
evaluated samples' model), or named with `--label`. The same content registered again (a retried pod) finds its
version by the digest tag and only brings its tags, description and the run's metrics up to date. With
`--kubeflow-registry ADDRESS` the model is also registered there (klear.register.kubeflow_registry). Prints the
registration as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from klear.common import lineage, model_card, storage, tracking
from klear.register import kubeflow_registry, mlflow_registry
from klear.register.entries import (
    Evaluation,
    KubeflowRegistration,
    MlflowRegistration,
    PublishedModel,
    RegisterError,
    check_name,
    label_of,
    render_markdown,
)

log = logging.getLogger("klear.register")
DEFAULT_AUTHOR = "klear register"
REPORT_FILES = ("report.html", "report.md")


@dataclass
class Registration:
    model: PublishedModel
    evaluation: Evaluation | None
    mlflow: MlflowRegistration | None
    kubeflow: KubeflowRegistration | None

    def markdown(self) -> str:
        return render_markdown(self.model, self.evaluation, self.mlflow, self.kubeflow)

    def to_json(self) -> dict[str, Any]:
        """What the command prints: the model (without its card's text), the evaluation, each registry's entry."""
        model = {key: value for key, value in asdict(self.model).items() if key != "card"}
        return {"model": model, "evaluation": asdict(self.evaluation) if self.evaluation else None,
                "mlflow": asdict(self.mlflow) if self.mlflow else None,
                "kubeflow": asdict(self.kubeflow) if self.kubeflow else None}


# --------------------------------------------------------------------------- reading what was published


def _manifest(uri: str, option: str) -> storage.Manifest:
    try:
        return storage.read_manifest(uri)
    except storage.UnpublishedOutputError as exc:
        raise RegisterError(f"{option} {uri}: not a published output: {exc}") from None
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise RegisterError(f"{option} {uri}: cannot be read: {exc}") from None


def read_model(uri: str) -> PublishedModel:
    """The published model at `uri`: an sft or gppo output, with its digest, card, lineage and training run."""
    where = lineage.location(uri)
    manifest = _manifest(where, "--model")
    stage = manifest.meta.get("stage")
    if stage not in model_card.MODEL_STAGES:
        raise RegisterError(f"--model {uri}: {storage.Uri.parse(where).join(storage.MANIFEST_NAME)} names stage "
                            f"{stage!r}: only a published model ({' or '.join(model_card.MODEL_STAGES)} output) is "
                            "registered")
    steps = lineage.trace(where)
    inputs: dict[str, list[str]] = {}
    for edge in steps[0].inputs:
        inputs.setdefault(edge.role, []).append(edge.uri)
    card_uri = str(storage.Uri.parse(where).join(model_card.CARD_NAME))
    run = tracking.read_run_record(where)
    if storage.exists(card_uri):
        card = storage.read_bytes(card_uri).decode()
    else:  # published before cards were written: the card it would have, not written here
        card = model_card.render(where, manifest, steps, {}, run)
    step = manifest.meta.get("global_step")
    return PublishedModel(
        uri=where, stage=stage, digest=storage.content_digest(where), created=manifest.created,
        global_step=step if isinstance(step, int) else 0, card=card, card_uri=card_uri, inputs=inputs,
        lineage=[{"stage": s.stage or "source", "uri": s.uri, "digest": s.digest} for s in steps[1:]],
        base_model=model_card.base_model(steps), run=run)


def read_evaluation(uri: str, model: PublishedModel, label: str | None = None) -> Evaluation:
    """The scores the evaluate output at `uri` gave `model`: under `label`, else the label its lineage shows the
    model was sampled for."""
    where = lineage.location(uri)
    manifest = _manifest(where, "--evaluation")
    root = storage.Uri.parse(where)
    if manifest.meta.get("stage") != "evaluate":
        raise RegisterError(f"--evaluation {uri}: {root.join(storage.MANIFEST_NAME)} names stage "
                            f"{manifest.meta.get('stage')!r}, not evaluate")
    if "report.json" not in manifest.files:
        raise RegisterError(f"--evaluation {uri}: its manifest lists no report.json")
    try:
        report = json.loads(storage.read_bytes(root.join("report.json")))
    except ValueError as exc:
        raise RegisterError(f"{root.join('report.json')}: not JSON ({exc})") from None
    models = report.get("models") if isinstance(report, dict) else None
    if not isinstance(models, dict) or not models:
        raise RegisterError(f"{root.join('report.json')}: no `models` (label -> scores)")
    labels = list(models)
    if label is None:
        label = label_of(model_card.evaluated_models(where, models), model.uri, labels, where)
    elif label not in models:
        raise RegisterError(f"--label {label}: {root.join('report.json')} has no model labelled so (its labels: "
                            f"{', '.join(labels)})")
    benchmarks = models[label].get("benchmarks") if isinstance(models[label], dict) else None
    if not isinstance(benchmarks, dict):
        raise RegisterError(f"{root.join('report.json')}: models.{label}.benchmarks is not a mapping of scores")
    return Evaluation(where, label, benchmarks, [name for name in REPORT_FILES if name in manifest.files],
                      where.rstrip("/").rsplit("/", 1)[-1])


# --------------------------------------------------------------------------- registering


def tracking_address(given: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The MLflow server: `--tracking-uri` (no credentials in it: they come from the environment), else
    MLFLOW_TRACKING_URI; "" for none."""
    if given:
        found = tracking.uri_credentials(given)
        if found:
            raise RegisterError(f"--tracking-uri holds credentials ({', '.join(found)}): set them in the environment "
                                "(MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN; the "
                                f"chart's Secret {tracking.TRACKING_SECRET}), never in an argument")
        return given
    return environ.get("MLFLOW_TRACKING_URI", "")


def register(model: str, name: str, evaluation: str | None = None, label: str | None = None,
             tracking_uri: str | None = None, experiment: str = "", kubeflow: str = "",
             author: str = DEFAULT_AUTHOR) -> Registration:
    """Register the published model at `model` as a version of `name`: in MLflow (`tracking_uri`, else
    MLFLOW_TRACKING_URI) and, with `kubeflow` (its address), in the Kubeflow Model Registry. Idempotent by content."""
    tracking.redact_output()  # MLflow and urllib3 log the tracking URI
    check_name(name)
    server = tracking_address(tracking_uri)
    if not server and not kubeflow:
        raise RegisterError("nowhere to register: give --tracking-uri (or set MLFLOW_TRACKING_URI) for MLflow, "
                            "--kubeflow-registry for the Kubeflow Model Registry")
    if server and tracking.uri_credentials(server):
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"  # MLflow prints URLs, password included
    published = read_model(model)
    scored = read_evaluation(evaluation, published, label) if evaluation else None
    mlflow = mlflow_registry.register(server, name, published, scored, experiment) if server else None
    kubeflow_entry = kubeflow_registry.register(kubeflow, name, published, scored, mlflow, author) if kubeflow else None
    return Registration(published, scored, mlflow, kubeflow_entry)


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("register", help="a published model into MLflow's (and Kubeflow's) model registry",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="URI", help="a published sft or gppo output")
    parser.add_argument("--name", required=True, help="the registered model's name (letters, digits, _ . -)")
    parser.add_argument("--evaluation", metavar="URI", help="an evaluate output that scored the model")
    parser.add_argument("--label", help="the model's label in --evaluation (default: found through its lineage)")
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow tracking server (default: MLFLOW_TRACKING_URI); no credentials here")
    parser.add_argument("--experiment", default="",
                        help="experiment of the logged model when the model was trained without MLflow (default: "
                             "MLFLOW_EXPERIMENT_NAME, else Default)")
    parser.add_argument("--kubeflow-registry", metavar="ADDRESS", default="",
                        help="also register in the Kubeflow Model Registry at ADDRESS, e.g. "
                             "https://model-registry-service.kubeflow.svc:8443")
    parser.add_argument("--author", default=DEFAULT_AUTHOR, help="author of the Kubeflow Model Registry entries")

    def main(args: argparse.Namespace) -> int:
        done = register(args.model, args.name, args.evaluation, args.label, args.tracking_uri, args.experiment,
                        args.kubeflow_registry, args.author)
        print(json.dumps(done.to_json(), default=str))
        return 0

    parser.set_defaults(func=main)
