"""The model card (README.md, Hugging Face model-card format) of every published model folder.

The card lies beside the manifest, not in it: it describes the model (lineage, recipe, evaluation scores) and is
rewritten when an evaluation of the model is published later, while the model's content digest (weights, config,
tokenizer, reports), which the evaluation and every KFP cache key recorded, stays what it was. Readers of the
model never need it: `fetch_published` serves the listed files, a copy of the folder to a hub carries it along.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import yaml

from klear.common import lineage, storage
from klear.common.config import describe_preset

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
           evaluations: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The card of the model published at `uri`. `evaluations`: evaluation URI -> {"label", "scores": {bench: pass@1}}."""
    meta = manifest.meta
    record = meta.get("lineage") or {}
    config = record.get("config") or {}
    inputs = meta.get("inputs") or {}
    data = [entry for entry in record.get("inputs") or [] if str(entry.get("uri")) in inputs.get("data", [])]
    base = base_model(steps)
    digest = storage.content_digest(uri)
    header: dict[str, Any] = {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["klear-reasoner", str(meta.get("stage", ""))],
        "base_model": base or None,
        "datasets": [str(entry["uri"]) for entry in data] or None,
        "klear": {"stage": meta.get("stage"), "digest": digest, "recipe": "Klear-Reasoner (arXiv 2508.07629)",
                  "preset": record.get("preset"), "code": record.get("code"), "kfp": record.get("kfp"),
                  "data": [{"uri": e["uri"], "digest": e.get("digest", "")} for e in data],
                  "hyperparameters": config},
    }
    results: list[dict[str, Any]] = [{"task": {"type": "text-generation"}, "dataset": {"name": bench, "type": bench},
                "metrics": [{"type": "pass@1", "value": float(value), "name": f"pass@1 ({ev['label']})"}],
                "source": {"name": "klear evaluate", "url": ev_uri}}
               for ev_uri, ev in sorted((evaluations or {}).items()) for bench, value in sorted(ev["scores"].items())]
    if results:
        header["model-index"] = [{"name": uri, "results": results}]
    header = {key: value for key, value in header.items() if value is not None}
    body = [f"# {uri}", "",
            f"A {meta.get('stage')} model of the Klear-Reasoner recipe, published {manifest.created}; content digest "
            f"`{digest}` (the sha256 over its manifest's file checksums; this card is not part of it).", "",
            "## Recipe", "", f"Klear-Reasoner (arXiv 2508.07629), {meta.get('stage')} stage, preset "
            f"`{describe_preset(record.get('preset')) or 'not recorded'}`.", "",
            "## Base model", "", f"`{base or 'unknown'}`", "", "## Data", ""]
    body += [f"- `{e['uri']}` (digest `{e.get('digest') or '-'}`)" for e in data] or ["- none recorded"]
    body += ["", "## Hyperparameters", "", "```json", json.dumps(config, indent=2, sort_keys=True), "```", "",
             "## Evaluation", ""]
    if results:
        body += ["| benchmark | pass@1 (%) | evaluation |", "|---|---|---|"]
        body += [f"| {r['dataset']['name']} | {r['metrics'][0]['value']:.1f} | `{r['source']['url']}` |"
                 for r in results]
    else:
        body.append("No evaluation of this model has been published yet.")
    body += ["", "## Lineage", "", "```", lineage.render_text(steps).rstrip(), "```", "", "```mermaid",
             lineage.render_mermaid(steps).rstrip(), "```", ""]
    return "---\n" + yaml.safe_dump(header, sort_keys=False) + "---\n\n" + "\n".join(body)


def read_evaluations(uri: str) -> dict[str, dict[str, Any]]:
    """The evaluations recorded in the card at `uri` so far ({} without a card)."""
    loc = storage.Uri.parse(uri)
    try:
        text = storage.read_bytes(loc.join(CARD_NAME)).decode()
    except FileNotFoundError:
        return {}
    header = yaml.safe_load(text.split("---\n", 2)[1]) if text.startswith("---\n") else {}
    found: dict[str, dict[str, Any]] = {}
    for entry in (header or {}).get("model-index", [{}])[0].get("results", []):
        metric = entry["metrics"][0]
        label = str(metric.get("name", "")).removeprefix("pass@1 (").removesuffix(")")
        found.setdefault(entry["source"]["url"], {"label": label, "scores": {}})["scores"][entry["dataset"]["name"]] = \
            metric["value"]
    return found


def write(uri: str, evaluation: tuple[str, str, Mapping[str, float]] | None = None) -> None:
    """(Re)write the card of the published model at `uri`, adding `evaluation` (URI, label, {bench: pass@1})."""
    manifest = storage.read_manifest(uri)
    evaluations = read_evaluations(uri)
    if evaluation is not None:
        evaluations[evaluation[0]] = {"label": evaluation[1], "scores": dict(evaluation[2])}
    text = render(uri, manifest, lineage.trace(uri), evaluations)
    storage.write_bytes(storage.Uri.parse(uri).join(CARD_NAME), text.encode())


def record_evaluation(evaluation_uri: str, scores: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Write an evaluation's scores into the cards of the models it evaluated (its samples' `model` inputs that a
    training stage published, unchanged since they were sampled). Returns the model URIs updated; a model being
    republished, or unreachable, is skipped with a warning: the evaluation itself has been published."""
    updated = []
    labels = {}  # sample output -> the label it was evaluated as, directly or through a judge step's rows
    for edge in lineage.step_of(evaluation_uri).inputs:
        if edge.role.startswith("samples:"):
            labels[edge.uri] = edge.role.removeprefix("samples:")
            judged = lineage.step_of(edge.uri)
            if judged.stage == "judge":
                labels |= {e.uri: labels[edge.uri] for e in judged.inputs if e.role == "samples"}
    for step in lineage.trace(evaluation_uri, max_steps=64)[1:]:
        if step.stage != "sample":
            continue
        label = labels.get(step.uri, "")
        for edge in step.inputs:
            if edge.role != "model" or label not in scores or edge.changed:
                continue
            try:
                if storage.read_manifest(edge.uri).meta.get("stage") not in MODEL_STAGES:
                    continue
                with storage.claim_output(edge.uri):  # not while a training run republishes it
                    write(edge.uri, (evaluation_uri, label, scores[label]))
                updated.append(edge.uri)
            except (storage.StorageError, OSError, ValueError) as exc:
                log.warning("the model card of %s was not updated: %s", edge.uri, exc)
    return updated
