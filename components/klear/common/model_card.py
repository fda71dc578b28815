"""The model card (README.md, Hugging Face model-card format) of every published model folder.

The card lies beside the manifest, not in it: it describes the model (lineage, recipe, evaluation scores) and is
rewritten when an evaluation of the model is published later, while the model's content digest (weights, config,
tokenizer, reports), which the evaluation and every KFP cache key recorded, stays what it was. Readers of the
model never need it: `fetch_published` serves the listed files, a copy of the folder to a hub carries it along.

Its values come from manifests (the model's, and through the lineage every upstream one) and the training's tracker
run (tracking.RUN_RECORD, published with the model: the MLflow run's id and page): in the Markdown body each
is escaped (klear.common.markdown.escape) or shown in a fence no value can close (markdown.fence). A card is written
after the model is published: a card that cannot be written is a warning (`write_after_publish`), never a failed
stage, which under KFP would retry and train again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import yaml

from klear.common import lineage, storage, tracking
from klear.common.config import describe_preset
from klear.common.markdown import escape, fence

CARD_NAME = "README.md"
MODEL_STAGES = ("sft", "gppo")
log = logging.getLogger("klear.model_card")


def base_model(steps: list[lineage.Step]) -> str:
    """The first model of the chain: follow `model` inputs until one that no training stage published."""
    by_uri = {step.uri: step for step in steps}
    step = steps[0] if steps else None
    while step is not None and step.stage in MODEL_STAGES:
        model = next((edge.uri for edge in step.inputs if edge.role == "model"), None)
        if model is None:
            return ""
        step = by_uri.get(model)
        if step is None or step.stage not in MODEL_STAGES:
            return model
    return step.uri if step is not None else ""


def render(uri: str, manifest: storage.Manifest, steps: list[lineage.Step],
           evaluations: Mapping[str, Mapping[str, Any]] | None = None, run: Mapping[str, str] | None = None) -> str:
    """The card of the model published at `uri`. `evaluations`: evaluation URI -> {"label", "scores": {bench: pass@1}};
    `run`: the tracker run it was trained in (tracking.RUN_RECORD: "mlflow", "mlflow_url", "wandb", ...)."""
    record = lineage.recorded(manifest.meta, str(storage.Uri.parse(uri).join(storage.MANIFEST_NAME)))
    config = record.config or {}
    data = [entry for entry in record.inputs if record.role(entry) == "data"]
    base = base_model(steps)
    digest = storage.content_digest(uri)
    header: dict[str, Any] = {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["klear-reasoner", record.stage],
        "base_model": base or None,
        "datasets": [entry["uri"] for entry in data] or None,
        "klear": {"stage": record.stage or None, "digest": digest, "recipe": "Klear-Reasoner (arXiv 2508.07629)",
                  "preset": record.preset, "code": record.code or None, "kfp": record.kfp or None,
                  "data": [{"uri": e["uri"], "digest": e["digest"]} for e in data], "hyperparameters": config,
                  "training_run": dict(run) if run else None},
    }
    results: list[dict[str, Any]] = [{"task": {"type": "text-generation"}, "dataset": {"name": bench, "type": bench},
                "metrics": [{"type": "pass@1", "value": float(value), "name": f"pass@1 ({ev['label']})"}],
                "source": {"name": "klear evaluate", "url": ev_uri}}
               for ev_uri, ev in sorted((evaluations or {}).items()) for bench, value in sorted(ev["scores"].items())]
    if results:
        header["model-index"] = [{"name": uri, "results": results}]
    header = {key: value for key, value in header.items() if value is not None}
    stage = escape(record.stage or "unknown")
    # Values from manifests are escaped text (never in code spans, where entities would show literally); the digest,
    # a hex string of this module's own, is the one code span.
    body = [f"# {escape(uri)}", "",
            f"A {stage} model of the Klear-Reasoner recipe, published {escape(manifest.created)}; content digest "
            f"`{digest}` (the sha256 over its manifest's file checksums; this card is not part of it).", "",
            "## Recipe", "", f"Klear-Reasoner (arXiv 2508.07629), {stage} stage, preset "
            f"{escape(describe_preset(record.preset) or 'not recorded')}.", "",
            "## Base model", "", escape(base or "unknown"), "", "## Data", ""]
    body += [f"- {escape(e['uri'])} (digest {escape(e['digest'] or '-')})" for e in data] or ["- none recorded"]
    body += ["", "## Hyperparameters", "", fence(json.dumps(config, indent=2, sort_keys=True, default=str), "json"), "",
             "## Evaluation", ""]
    if results:
        body += ["| benchmark | pass@1 (%) | evaluation |", "|---|---|---|"]
        body += [f"| {escape(r['dataset']['name'])} | {r['metrics'][0]['value']:.1f} | {escape(r['source']['url'])} |"
                 for r in results]
    else:
        body.append("No evaluation of this model has been published yet.")
    body += ["", "## Training run", "", *training_run_lines(run or {}), "", "## Lineage", "", fence(lineage.render_text(steps)),
             "", fence(lineage.render_mermaid(steps), "mermaid"), ""]
    return "---\n" + yaml.safe_dump(header, sort_keys=False) + "---\n\n" + "\n".join(body)


def training_run_lines(run: Mapping[str, str]) -> list[str]:
    """The card's lines naming the tracker runs the model was trained in (values from a file in the model: escaped)."""
    lines = []
    if run.get("mlflow"):
        where = f" (experiment {escape(run['mlflow_experiment_id'])})" if run.get("mlflow_experiment_id") else ""
        page = f": {escape(run['mlflow_url'])}" if run.get("mlflow_url") else ""
        lines.append(f"- MLflow run {escape(run['mlflow'])}{where}{page}")
    if run.get("wandb"):
        lines.append(f"- W&B run {escape(run['wandb'])}")
    return lines or ["Trained without an experiment tracker (MLflow, W&B)."]


def read_training_run(uri: str) -> dict[str, str]:
    """The tracker run of the model at `uri` (tracking.read_run_record); {} and a warning when it is unreadable: the
    card is written without it."""
    try:
        return tracking.read_run_record(uri)
    except (ValueError, OSError, storage.StorageError) as exc:
        log.warning("%s: the training run's record is unreadable (%s); the card names no run", uri, exc)
        return {}


def _front_matter(text: str) -> Any:
    """The YAML header of a card (None without one); it ends at the first line "---" (yaml.safe_dump indents every
    continuation line of a value, so no value holds such a line)."""
    if not text.startswith("---\n"):
        return None
    end = text.find("\n---\n", 3)
    return yaml.safe_load(text[4:end] if end >= 0 else text[4:])


def read_evaluations(uri: str) -> dict[str, dict[str, Any]]:
    """The evaluations recorded in the card at `uri` so far ({} without a card, or with one whose header is malformed:
    logged, and the card is rewritten without them)."""
    card = storage.Uri.parse(uri).join(CARD_NAME)
    try:
        data = storage.read_bytes(card)
    except FileNotFoundError:
        return {}
    found: dict[str, dict[str, Any]] = {}
    try:
        for entry in (_front_matter(data.decode()) or {}).get("model-index", [{}])[0].get("results", []):
            metric = entry["metrics"][0]
            label = str(metric.get("name", "")).removeprefix("pass@1 (").removesuffix(")")
            scores = found.setdefault(str(entry["source"]["url"]), {"label": label, "scores": {}})["scores"]
            scores[str(entry["dataset"]["name"])] = float(metric["value"])
    except (yaml.YAMLError, LookupError, TypeError, AttributeError, ValueError) as exc:  # a hand-edited card
        log.warning("%s: the recorded evaluations are unreadable (%s: %s); the card is rewritten without them",
                    card, type(exc).__name__, exc)
        return {}
    return found


def write(uri: str, evaluation: tuple[str, str, Mapping[str, float]] | None = None) -> None:
    """(Re)write the card of the published model at `uri`, adding `evaluation` (URI, label, {bench: pass@1})."""
    manifest = storage.read_manifest(uri)
    evaluations = read_evaluations(uri)
    if evaluation is not None:
        evaluations[evaluation[0]] = {"label": evaluation[1], "scores": dict(evaluation[2])}
    text = render(uri, manifest, lineage.trace(uri), evaluations, read_training_run(uri))
    storage.write_bytes(storage.Uri.parse(uri).join(CARD_NAME), text.encode())


def write_after_publish(uri: str) -> bool:
    """`write`, for a stage whose model is already published: a card that cannot be written is a warning, never a
    failed stage (under KFP a failed task retries, and would train again). True when the card was written."""
    try:
        write(uri)
    except Exception as exc:  # noqa: BLE001 - the model is published; the card only describes it
        log.warning("the model card of %s was not written: %s", uri, exc)
        log.debug("model card failure", exc_info=True)
        return False
    return True


def evaluated_models(evaluation_uri: str, scores: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(model URI, label) for each model an evaluation scored under one of the labels `scores` has (its keys): its
    samples' `model` inputs, unchanged since they were sampled, directly or through a judge step's rows."""
    labels = {}  # sample output -> the label it was evaluated as
    for edge in lineage.step_of(evaluation_uri).inputs:
        if edge.role.startswith("samples:"):
            labels[edge.uri] = edge.role.removeprefix("samples:")
            judged = lineage.step_of(edge.uri)
            if judged.stage == "judge":
                labels |= {e.uri: labels[edge.uri] for e in judged.inputs if e.role == "samples"}
    models = []
    for step in lineage.trace(evaluation_uri, max_steps=64)[1:]:
        label = labels.get(step.uri, "")
        if step.stage == "sample" and label in scores:
            models += [(edge.uri, label) for edge in step.inputs if edge.role == "model" and not edge.changed]
    return models


def record_evaluation(evaluation_uri: str, scores: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Write an evaluation's scores into the cards of the models it evaluated that a training stage published.
    Returns the model URIs updated. The evaluation itself has been published: a model being republished, or
    unreachable, and lineage that cannot be followed are warnings, never a failed stage."""
    try:
        models = evaluated_models(evaluation_uri, scores)
    except Exception as exc:  # noqa: BLE001 - the evaluation is published; the cards only describe the models
        log.warning("no model card was updated with the scores of %s: %s", evaluation_uri, exc)
        log.debug("model card failure", exc_info=True)
        return []
    updated = []
    for model, label in models:
        try:
            if storage.read_manifest(model).meta.get("stage") not in MODEL_STAGES:
                continue
            with storage.claim_output(model):  # not while a training run republishes it
                write(model, (evaluation_uri, label, scores[label]))
            updated.append(model)
        except Exception as exc:  # noqa: BLE001 - as above
            log.warning("the model card of %s was not updated: %s", model, exc)
            log.debug("model card failure", exc_info=True)
    return updated
