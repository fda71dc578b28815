"""What a registration writes, from what the published model and its evaluation hold: tags, metric names, the
version's description and source, links, the summary. Pure functions; the registries' clients are elsewhere.

Names follow what each registry accepts: MLflow metric names take letters, digits, `_ - . / : ` and spaces (so
`pass@1` is written `pass_at_1`); a model version's description is at most 5,000 characters in MLflow's SQL stores
(the card is cut there, and named in full by its URI); tag values are strings.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from klear.common.markdown import escape
from klear.common.tracking import public_address

DIGEST_TAG = "klear.digest"  # the model's content digest: a registration of the same content finds its version by it
DESCRIPTION_LIMIT = 5000  # MLflow's model_versions.description column (String(5000))
TAG_LIMIT = 8000  # MLflow's run and logged-model tag values (longer ones are refused or cut)
# A registered model's name: a registry-wide identifier, quoted inside MLflow's search filters.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,255}$")
_METRIC_UNSAFE = re.compile(r"[^\w.\- :/]")
# The Kubeflow Model Registry's model format of a Hugging Face folder: what KServe's Hugging Face runtime serves.
MODEL_FORMAT = ("huggingface", "1")


class RegisterError(RuntimeError):
    """A model, evaluation or registry that cannot be registered with; the message names the URI, file or field."""


@dataclass(frozen=True)
class PublishedModel:
    """A published model as its manifest, card and run record describe it."""

    uri: str
    stage: str  # sft | gppo
    digest: str  # storage.content_digest: the sha256 over its manifest's checksums (the card is not part of it)
    created: str
    global_step: int
    card: str  # the model card's text
    card_uri: str
    inputs: dict[str, list[str]]  # role ("model", "data") -> the URIs it was made from
    lineage: list[dict[str, str]]  # every step back to the sources, nearest first: {"stage", "uri", "digest"}
    base_model: str
    run: dict[str, str]  # tracking.RUN_RECORD: "mlflow", "mlflow_experiment_id", "mlflow_url", "wandb"


@dataclass(frozen=True)
class Evaluation:
    """The scores one published evaluation gave the model (its label there)."""

    uri: str
    label: str
    benchmarks: dict[str, dict[str, Any]]  # report.json's models[label].benchmarks: pass@1, stderr, pass@k, ...
    reports: list[str]  # the report files it published (report.html, report.md)
    folder: str  # its folder's name (evaluate, evaluate-code): where its report goes among the run's artifacts


@dataclass
class MlflowRegistration:
    registered_model: str
    version: str
    created: bool  # False: this content was registered already (the version found by its digest tag)
    source: str
    logged_model_id: str
    experiment_id: str
    run_id: str = ""
    run_url: str = ""
    version_url: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # what went into the run (changed values only)
    artifacts: list[str] = field(default_factory=list)


@dataclass
class KubeflowRegistration:
    address: str
    registered_model: str
    registered_model_id: str
    version: str
    version_id: str
    created: bool


# --------------------------------------------------------------------------- checks


def check_name(name: str) -> str:
    """A registered model's name: letters, digits, `_ . -`, starting with a letter or digit, 256 characters at most."""
    if not NAME.match(name):
        raise RegisterError(f"--name {name!r}: a registered model's name is letters, digits, '_', '.' and '-', "
                            "starting with a letter or digit, 256 characters at most")
    return name


def label_of(evaluated: Sequence[tuple[str, str]], model: str, labels: Sequence[str], evaluation: str) -> str:
    """The label under which `evaluation` scored `model`, from the (model location, label) pairs its lineage gives
    (model_card.evaluated_models); an error naming what it did evaluate when `model` is not among them."""
    found = sorted({label for uri, label in evaluated if uri == model})
    if len(found) == 1:
        return found[0]
    if found:
        raise RegisterError(f"--evaluation {evaluation} scored {model} under several labels ({', '.join(found)}): "
                            "choose one with --label")
    shown = ", ".join(f"{label}={uri}" for uri, label in sorted(set(evaluated), key=lambda p: p[1])) or "no trained model"
    raise RegisterError(f"--evaluation {evaluation} did not evaluate {model} (its samples' models, by label: {shown}; "
                        f"its labels: {', '.join(labels)}); name the label with --label if its lineage was lost")


# --------------------------------------------------------------------------- MLflow


def metric_name(*parts: str) -> str:
    """An MLflow metric name from its parts ("eval", benchmark, metric): `@` spelled `_at_`, other characters MLflow
    refuses as `_`, parts joined by `/`."""
    return "/".join(_METRIC_UNSAFE.sub("_", part.replace("@", "_at_")) for part in parts)


def evaluation_metrics(benchmarks: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """`eval/<benchmark>/<metric>` of every number of an evaluation's benchmark blocks: pass@1, stderr (percent),
    pass@k for each k, the truncated fraction, mean response tokens."""
    metrics: dict[str, float] = {}
    for bench, block in sorted(benchmarks.items()):
        for key in ("pass@1", "stderr", "truncated", "mean_response_tokens"):
            if _number(block.get(key)):
                metrics[metric_name("eval", bench, key)] = float(block[key])
        for k, value in sorted((block.get("pass@k") or {}).items(), key=lambda item: int(item[0])):
            if _number(value):
                metrics[metric_name("eval", bench, f"pass@{k}")] = float(value)
    return metrics


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def changed_metrics(latest: Mapping[str, float], metrics: Mapping[str, float]) -> dict[str, float]:
    """The metrics whose value differs from the run's latest one: a second registration logs nothing twice."""
    return {key: value for key, value in metrics.items() if latest.get(key) != value}


def scores_text(benchmarks: Mapping[str, Mapping[str, Any]]) -> str:
    """"aime24 pass@1 12.5 ± 3.1; ..." for a tag or a summary line."""
    parts = []
    for bench, block in sorted(benchmarks.items()):
        if _number(block.get("pass@1")):
            error = f" ± {block['stderr']:.1f}" if _number(block.get("stderr")) else ""
            parts.append(f"{bench} pass@1 {block['pass@1']:.1f}{error}")
    return "; ".join(parts)


def lineage_entries(model: PublishedModel) -> dict[str, str]:
    """Tags of the model's lineage: its direct inputs by role, the base model, and the whole chain as JSON
    (stage, URI, digest of each step back to the sources, nearest first), cut to a tag's length."""
    tags = {f"klear.input.{role}": ", ".join(uris) for role, uris in sorted(model.inputs.items()) if uris}
    if model.base_model:
        tags["klear.base_model"] = model.base_model
    chain = json.dumps(model.lineage, separators=(",", ":"))
    tags["klear.lineage"] = chain if len(chain) <= TAG_LIMIT else clip_json_list(model.lineage, TAG_LIMIT)
    return tags


def clip_json_list(items: Sequence[Mapping[str, str]], limit: int) -> str:
    """As many leading `items` as fit in `limit` characters of JSON, and {"more": n} for the rest."""
    kept: list[Any] = []
    for index, item in enumerate(items):
        trial = json.dumps([*kept, item, {"more": len(items) - index - 1}], separators=(",", ":"))
        if len(trial) > limit:
            return json.dumps([*kept, {"more": len(items) - index}], separators=(",", ":"))
        kept.append(item)
    return json.dumps(kept, separators=(",", ":"))


def model_tags(model: PublishedModel) -> dict[str, str]:
    """What names the model wherever it is registered: location, content digest, stage, card, training run."""
    tags = {DIGEST_TAG: model.digest, "klear.uri": model.uri, "klear.stage": model.stage, "klear.card": model.card_uri,
            "klear.published": model.created, "klear.global_step": str(model.global_step)}
    if model.run.get("mlflow"):
        tags["klear.mlflow_run"] = model.run["mlflow"]
    if model.run.get("wandb"):
        tags["klear.wandb_run"] = model.run["wandb"]
    return tags


def evaluation_tags(evaluation: Evaluation | None) -> dict[str, str]:
    """The evaluation behind the scores, and each score as a tag (a version page shows tags, not metrics)."""
    if evaluation is None:
        return {}
    tags = {"klear.evaluation": evaluation.uri, "klear.evaluation.label": evaluation.label,
            "klear.scores": scores_text(evaluation.benchmarks)}
    tags |= {key: f"{value:g}" for key, value in evaluation_metrics(evaluation.benchmarks).items()}
    return tags


def version_tags(model: PublishedModel, evaluation: Evaluation | None) -> dict[str, str]:
    """A registered version's tags: the model, its lineage, its evaluation."""
    return {**model_tags(model), **lineage_entries(model), **evaluation_tags(evaluation)}


def run_tags(model: PublishedModel, registered: str) -> dict[str, str]:
    """Tags of the training run, pointing at what it made: the model's location, card and digest, and its
    registered version ("name/version")."""
    return {"klear.model.uri": model.uri, "klear.model.card": model.card_uri, "klear.model.digest": model.digest,
            "klear.registered_model": registered}


def version_description(card: str, card_uri: str, limit: int = DESCRIPTION_LIMIT) -> str:
    """The model card as a version's description; a longer card is cut, with a last line naming it in full."""
    if len(card) <= limit:
        return card
    note = f"\n\n... (cut at {limit} characters; the whole card: {card_uri})"
    return card[: limit - len(note)].rstrip() + note


def mlflow_source(uri: str, logged_model_id: str) -> str:
    """A version's source: the model's published location, which MLflow only references; a local path (which an
    MLflow server accepts only inside its own artifact store) is reached through the logged model instead,
    `models:/<id>`, whose tags name the path."""
    scheme = urllib.parse.urlsplit(uri).scheme
    return uri if scheme not in ("", "file") and len(scheme) > 1 else f"models:/{logged_model_id}"


def model_reference(model: PublishedModel, evaluation: Evaluation | None) -> dict[str, Any]:
    """klear_model.json, the logged model's one artifact besides the card: where the model is, what it is."""
    return {"uri": model.uri, "digest": model.digest, "stage": model.stage, "card": model.card_uri,
            "published": model.created, "global_step": model.global_step, "inputs": model.inputs,
            "base_model": model.base_model, "lineage": model.lineage, "training_run": model.run,
            "evaluation": None if evaluation is None else {"uri": evaluation.uri, "label": evaluation.label,
                                                           "scores": scores_text(evaluation.benchmarks)}}


def mlflow_page(tracking_uri: str, *path: str) -> str:
    """A page of the MLflow UI (`#/models/<name>/versions/<v>`, `#/experiments/<id>/runs/<id>`) with no credentials;
    "" when the tracking URI is no web server."""
    base = public_address(tracking_uri)
    return f"{base}/#/" + "/".join(urllib.parse.quote(part, safe="") for part in path) if base else ""


# --------------------------------------------------------------------------- Kubeflow Model Registry


def kubeflow_version(model: PublishedModel) -> str:
    """The version's name in the Kubeflow Model Registry, unique per content: `<stage>-<digest, 16 hex>`."""
    return f"{model.stage}-{model.digest[:16]}"


def kubeflow_metadata(model: PublishedModel, evaluation: Evaluation | None,
                      mlflow: MlflowRegistration | None) -> dict[str, str | float]:
    """The version's custom properties: the same tags as MLflow's, scores as numbers, the MLflow version it is."""
    metadata: dict[str, str | float] = dict(version_tags(model, evaluation))
    if evaluation is not None:
        metadata |= evaluation_metrics(evaluation.benchmarks)
    if mlflow is not None:
        metadata["klear.mlflow_version"] = f"{mlflow.registered_model}/{mlflow.version}"
    return metadata


# --------------------------------------------------------------------------- summary


def render_markdown(model: PublishedModel, evaluation: Evaluation | None, mlflow: MlflowRegistration | None,
                    kubeflow: KubeflowRegistration | None) -> str:
    """The registration as the KFP UI shows it: what was registered where, new or found, with links."""
    lines = ["# Model registration", "", "| | |", "|---|---|",
             f"| model | {escape(model.uri)} |", f"| stage | {escape(model.stage)} |",
             f"| content digest | {escape(model.digest)} |", f"| model card | {escape(model.card_uri)} |"]
    if evaluation is not None:
        lines += [f"| evaluation | {escape(evaluation.uri)} (as {escape(evaluation.label)}) |",
                  f"| scores | {escape(scores_text(evaluation.benchmarks) or 'none')} |"]
    if model.run.get("mlflow"):
        lines.append(f"| training run | MLflow {escape(model.run['mlflow'])} |")
    if mlflow is not None:
        state = "a new version" if mlflow.created else "this content's version, registered before (nothing added)"
        lines += ["", "## MLflow Model Registry", "",
                  f"{escape(mlflow.registered_model)} version {escape(mlflow.version)}: {state}.", "",
                  f"- source: {escape(mlflow.source)}", f"- logged model: {escape(mlflow.logged_model_id)}"]
        if mlflow.version_url:
            lines.append(f"- [the version in MLflow]({mlflow.version_url})")
        if mlflow.run_url:
            lines.append(f"- [the training run]({mlflow.run_url}): {len(mlflow.metrics)} evaluation metrics logged, "
                         f"{len(mlflow.artifacts)} report files")
    if kubeflow is not None:
        state = "a new version" if kubeflow.created else "this content's version, registered before"
        lines += ["", "## Kubeflow Model Registry", "",
                  f"{escape(kubeflow.registered_model)} (id {escape(kubeflow.registered_model_id)}) version "
                  f"{escape(kubeflow.version)} (id {escape(kubeflow.version_id)}) at {escape(kubeflow.address)}: {state}."]
    return "\n".join(lines) + "\n"
