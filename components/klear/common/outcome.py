"""The outcome of a pipeline run, as its exit task reports it: pure parts (the exit task's I/O is klear.common.notify).

What a run's exit task knows, and from where:
  status       KFP's PipelineTaskFinalStatus of the exit handler's group: its state only. kfp.local 2.17 says
               SUCCEEDED or FAILED with the message "Task <group> failed."; KFP's backend (2.14-2.17) the group's
               execution state (COMPLETE, FAILED, CANCELED; RUNNING when a ParallelFor inside never reported its own,
               kubeflow/pipelines#13321) and no error at all (kubeflow/pipelines#11975). Neither names the task that
               failed.
  Workflow     on a cluster, the run's Argo Workflow: every task's pod node with its phase and Argo's message, and
               the task's display name in its driver's `task` input (KFP's Argo compiler: a container task `<key>`
               is a driver step `<key>-driver` and an `executor` pod under `<key>`). The failed pods' logs give the
               error itself (`error_line`).
  storage      what the run published, by the storage convention `<run_root>/<run id>/<stage>`: evaluations (their
               manifests hold the headline scores), models (sft, gppo-*) with the tracker ids kept in their
               checkpoints, and outputs started but never published (files, no manifest). A stage KFP served from an
               earlier run's cache published nothing in this run's folder: it shows as absent, never as an error.

Two renderings of one Outcome: the Markdown summary the Kubeflow UI shows (every value from data escaped,
klear.common.markdown) and a Slack-compatible webhook payload (mrkdwn, under Slack's limits).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from klear.common.markdown import escape
from klear.common.tracking import REDACTED, public_address, redact

SUCCEEDED, FAILED, CANCELLED, UNKNOWN = "succeeded", "failed", "cancelled", "unknown"
# PipelineTaskFinalStatus.state as kfp.local (SUCCEEDED/FAILED) and KFP's backend (MLMD execution states) spell it.
_STATES = {"SUCCEEDED": SUCCEEDED, "COMPLETE": SUCCEEDED, "CACHED": SUCCEEDED, "FAILED": FAILED,
           "CANCELED": CANCELLED, "CANCELLED": CANCELLED}
# Argo node phases.
_ARGO_STATES = {"Succeeded": SUCCEEDED, "Failed": FAILED, "Error": FAILED}
_FAILED_PHASES = ("Failed", "Error")
MODEL_FOLDERS = re.compile(r"^(sft|gppo-[\w-]+)$")  # where the training stages publish (sft, gppo-math, gppo-code)
EVALUATION_FOLDERS = re.compile(r"^evaluate(-(?!prompts)[\w-]+)?$")  # evaluate, evaluate-code; not its prompts
MESSAGE_LIMIT = 500  # characters of one error in the summary and the message
SLACK_TEXT_LIMIT = 3000  # Slack truncates `text` past 40,000 and renders a section's text up to 3,000 characters
_ICONS = {SUCCEEDED: "✅", FAILED: "❌", CANCELLED: "⚠️", UNKNOWN: "❔"}
# The last line of a Python traceback ("ValueError: ...", "klear.x.SomeError: ..."), or a KFP launcher failure.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")
_LOG_PREFIX = re.compile(r"^(?:\d{4}-\d\d-\d\dT[\d:.]+Z\s+)?(?:[IWEF]\d{4} [\d:.]+\s+\d+\s+[\w.]+:\d+\]\s*)?")


@dataclass(frozen=True)
class FailedTask:
    """A task whose last attempt failed: its name as the Kubeflow UI shows it, the error (its log's exception line,
    else Argo's message) and Argo's message (e.g. "OOMKilled (exit code 137)")."""

    task: str
    error: str = ""
    reason: str = ""


@dataclass(frozen=True)
class FailedNode:
    """A failed pod of the run's Workflow, before its log is read."""

    node: str  # Argo's node name (the pod's `workflows.argoproj.io/node-name` annotation)
    task: str
    reason: str


@dataclass(frozen=True)
class RunEvaluation:
    """A published evaluation: its folder, location and headline pass@1 per model label and benchmark."""

    name: str
    uri: str
    labels: tuple[str, ...]
    scores: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class RunModel:
    """A model a training stage published, with its tracker runs (from its newest checkpoint's tracking_run.json)."""

    name: str
    uri: str
    mlflow_run: str = ""
    mlflow_link: str = ""
    wandb_run: str = ""


@dataclass
class Outcome:
    pipeline: str
    run_id: str
    state: str
    status_message: str = ""  # what the status said of an error, when it said something
    failed: list[FailedTask] = field(default_factory=list)
    evaluations: list[RunEvaluation] = field(default_factory=list)
    models: list[RunModel] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # output folders with files and no manifest
    run_link: str = ""  # the run in the Kubeflow UI
    notes: list[str] = field(default_factory=list)  # what could not be looked at, said once


# --------------------------------------------------------------------------- state


def status_state(state: str | None) -> str:
    """succeeded, failed, cancelled or unknown, from PipelineTaskFinalStatus.state as either runner spells it."""
    return _STATES.get((state or "").strip().upper(), UNKNOWN)


def run_state(status: str | None, group_phase: str = "", failed: Sequence[FailedTask] = ()) -> str:
    """The run's state: failed when a task's last attempt failed; else the group's Argo phase (read from the
    Workflow: final when the exit task runs, unlike the status on KFP 2.17, which may still say RUNNING); else the
    status."""
    if failed:
        return FAILED
    return _ARGO_STATES.get(group_phase, "") or status_state(status)


def status_message(error_message: str | None, group: str) -> str:
    """The status's error message, unless it says no more than kfp.local's "Task <group> failed."."""
    message = (error_message or "").strip()
    return "" if message in ("", f"Task {group} failed.") else message


# --------------------------------------------------------------------------- the Workflow


def _task_specs(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Argo node path of each task (`<parent>.<key>`) -> its display name, from its driver step's `task` input."""
    names = {}
    for node in nodes.values():
        path = str(node.get("name", ""))
        if not path.endswith("-driver"):
            continue
        for parameter in (node.get("inputs") or {}).get("parameters") or []:
            if parameter.get("name") == "task":
                try:
                    shown = json.loads(parameter.get("value") or "{}").get("taskInfo", {}).get("name", "")
                except (json.JSONDecodeError, AttributeError):
                    shown = ""
                if shown:
                    names[path.removesuffix("-driver")] = str(shown)
    return names


def _attempt_of(name: str) -> str:
    """A node name without its retry suffix: `x.executor(1)` -> `x.executor`."""
    return re.sub(r"\(\d+\)$", "", name)


def failed_nodes(workflow: Mapping[str, Any]) -> list[FailedNode]:
    """The pods of the run's Workflow whose task failed for good: a retried task whose later attempt succeeded is not
    one. Each with its task's display name (its key in the DAG when no driver step names it) and Argo's message;
    in the order they finished."""
    nodes: Mapping[str, Mapping[str, Any]] = (workflow.get("status") or {}).get("nodes") or {}
    shown = _task_specs(nodes)
    attempts: dict[str, list[Mapping[str, Any]]] = {}
    for node in nodes.values():
        if node.get("type") == "Pod":
            attempts.setdefault(_attempt_of(str(node.get("name", ""))), []).append(node)
    found = []
    for path, tries in attempts.items():
        if any(t.get("phase") == "Succeeded" for t in tries):
            continue
        failed = [t for t in tries if t.get("phase") in _FAILED_PHASES]
        if not failed:
            continue
        last = max(failed, key=lambda t: str(t.get("finishedAt") or ""))
        parent, _, step = path.rpartition(".")
        key = parent if step == "executor" else path.removesuffix("-driver")  # an executor pod, or a driver step
        task = shown.get(key) or key.rpartition(".")[2] or path
        found.append((str(last.get("finishedAt") or ""), FailedNode(str(last.get("name", "")), task,
                                                                     str(last.get("message") or ""))))
    return [node for _, node in sorted(found, key=lambda item: item[0])]


def group_phase(workflow: Mapping[str, Any], group: str) -> str:
    """The Argo phase of the exit handler's group (its DAG node, named by the status's task name)."""
    nodes: Mapping[str, Mapping[str, Any]] = (workflow.get("status") or {}).get("nodes") or {}
    phases = [str(n.get("phase") or "") for n in nodes.values() if n.get("displayName") == group]
    return phases[0] if len(phases) == 1 else ""


def error_line(log: str) -> str:
    """The error in a failed task's log: the last line that is a Python exception ("ValueError: ..."), else the
    last non-empty line; "" for an empty log. Log prefixes (timestamps, glog headers) are dropped."""
    lines = [_LOG_PREFIX.sub("", line).strip() for line in log.splitlines()]
    lines = [line for line in lines if line]
    for line in reversed(lines):
        if _EXCEPTION.match(line):
            return clip(line)
    return clip(lines[-1]) if lines else ""


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# --------------------------------------------------------------------------- what the run published


def evaluation_of(name: str, uri: str, meta: Mapping[str, Any]) -> RunEvaluation | None:
    """An evaluation from its manifest's meta (evaluate publishes `labels` and the headline `scores`: label ->
    benchmark -> pass@1); None when the meta holds no scores."""
    scores = meta.get("scores")
    if not isinstance(scores, Mapping) or not scores:
        return None
    labels = [str(label) for label in meta.get("labels") or scores]
    table = {str(label): {str(b): float(v) for b, v in (values or {}).items() if isinstance(v, (int, float))}
             for label, values in scores.items() if isinstance(values, Mapping)}
    return RunEvaluation(name, uri, tuple(label for label in labels if label in table), table)


def model_order(name: str) -> tuple[int, str]:
    """Models in the recipe's order: SFT, math RL, code RL, then any other."""
    recipe = ("sft", "gppo-math", "gppo-code")
    return (recipe.index(name) if name in recipe else len(recipe), name)


def mlflow_link(tracking_uri: str, run_id: str) -> str:
    """The MLflow UI page of a run (its direct route, `#/runs/<id>`, which finds the experiment), or ""."""
    base = public_address(tracking_uri.strip())
    return f"{base}/#/runs/{urllib.parse.quote(run_id, safe='')}" if base and run_id else ""


def kfp_run_link(ui_url: str, run_id: str) -> str:
    """The run's page in the Kubeflow Pipelines UI (`<ui>/#/runs/details/<run id>`), or "" without a UI address."""
    base = public_address(ui_url.strip())
    return f"{base}/#/runs/details/{urllib.parse.quote(run_id, safe='')}" if base and run_id else ""


def stage_folders(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """Of a run folder's files (relative paths), its published outputs (a manifest at the folder's root) and those
    started but never published (files, no manifest), each sorted; the work areas are not a run's."""
    folders: dict[str, bool] = {}
    for name in names:
        folder, _, rest = name.partition("/")
        if rest:
            folders[folder] = folders.get(folder, False) or rest == "_MANIFEST.json"
    return sorted(f for f, done in folders.items() if done), sorted(f for f, done in folders.items() if not done)


# --------------------------------------------------------------------------- Markdown


def _number(value: float) -> str:
    return f"{value:.1f}"


def _score_rows(evaluation: RunEvaluation) -> list[str]:
    benchmarks = list(dict.fromkeys(b for label in evaluation.labels for b in evaluation.scores[label]))
    rows = ["| model | " + " | ".join(escape(b) for b in benchmarks) + " |",
            "|---|" + "---|" * len(benchmarks)]
    for label in evaluation.labels:
        values = evaluation.scores[label]
        rows.append(f"| {escape(label)} | "
                    + " | ".join(_number(values[b]) if b in values else "-" for b in benchmarks) + " |")
    return rows


def _link(text: str, url: str) -> str:
    # Our own links (tracking.public_address output): percent-encode what would end the Markdown link target.
    return f"[{escape(text)}]({urllib.parse.quote(url, safe=':/?#=&%@+,;~')})"


def render_markdown(outcome: Outcome) -> str:
    """The run's summary for the Kubeflow UI: the state, what failed and why, the scores, the report, the models and
    their tracker runs; a part the run did not produce is left out."""
    title = {SUCCEEDED: "succeeded", FAILED: "failed", CANCELLED: "was cancelled", UNKNOWN: "ended (state unknown)"}
    lines = [f"# {_ICONS[outcome.state]} {escape(outcome.pipeline)}: run {title[outcome.state]}", "",
             f"Run {escape(outcome.run_id)}" + (f": {_link('open it in Kubeflow', outcome.run_link)}"
                                                 if outcome.run_link else "") + "."]
    if outcome.failed or outcome.status_message:
        lines += ["", "## What failed", ""]
        for task in outcome.failed:
            line = f"- **{escape(task.task)}**"
            if task.error:
                line += f": {escape(task.error)}"
            if task.reason and task.reason != task.error:
                line += f" ({escape(task.reason)})"
            lines.append(line)
        if outcome.status_message:
            lines.append(f"- The run's status: {escape(outcome.status_message)}")
    elif outcome.state == FAILED:
        lines += ["", "## What failed", "", "The run's status names no task; the run's graph shows the failed one."]
    for evaluation in outcome.evaluations:
        lines += ["", f"## Evaluation: {escape(evaluation.name)}", "", "pass@1 (%):", "", *_score_rows(evaluation),
                  "", f"Report: {escape(evaluation.uri)}/report.html (and report.md, report.json)"]
    if outcome.models:
        lines += ["", "## Models", ""]
        for model in outcome.models:
            line = f"- **{escape(model.name)}**: {escape(model.uri)}"
            if model.mlflow_link:
                line += f"; MLflow run {_link(model.mlflow_run, model.mlflow_link)}"
            elif model.mlflow_run:
                line += f"; MLflow run {escape(model.mlflow_run)}"
            if model.wandb_run:
                line += f"; W&B run {escape(model.wandb_run)}"
            lines.append(line)
    if outcome.unfinished:
        lines += ["", "## Outputs started, not published", "",
                  "Files without a manifest (a stage that stopped before publishing; a retry resumes from them): "
                  + ", ".join(escape(name) for name in outcome.unfinished) + "."]
    if outcome.notes:
        lines += ["", "## Not looked at", "", *(f"- {escape(note)}" for note in outcome.notes)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- Slack


def slack_escape(text: str) -> str:
    """Text as Slack mrkdwn shows it literally: &, <, > as entities (Slack's own rule); no control characters."""
    text = re.sub(r"[\x00-\x1f]", " ", str(text))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    return "`" + slack_escape(text).replace("`", "'") + "`"


def _slack_link(url: str, text: str) -> str:
    return f"<{url.replace('|', '%7C').replace('>', '%3E')}|{slack_escape(text).replace('|', '/')}>"


def slack_lines(outcome: Outcome) -> list[str]:
    """The message, one line per fact, most important first (the cut for Slack's limit drops the last ones)."""
    words = {SUCCEEDED: "succeeded", FAILED: "failed", CANCELLED: "was cancelled", UNKNOWN: "ended (state unknown)"}
    head = f"{_ICONS[outcome.state]} *{slack_escape(outcome.pipeline)}* run {_code(outcome.run_id)} {words[outcome.state]}"
    lines = [head + (f" ({_slack_link(outcome.run_link, 'open in Kubeflow')})" if outcome.run_link else "")]
    for task in outcome.failed:
        detail = task.error or task.reason
        lines.append(f"*Failed:* {slack_escape(task.task)}" + (f": {_code(clip(detail, 300))}" if detail else ""))
    if outcome.status_message:
        lines.append(f"*Status:* {slack_escape(clip(outcome.status_message, 300))}")
    for evaluation in outcome.evaluations:
        for label in evaluation.labels:
            scores = " · ".join(f"{slack_escape(b)} {_number(v)}" for b, v in evaluation.scores[label].items())
            lines.append(f"*{slack_escape(evaluation.name)}* ({slack_escape(label)}, pass@1 %): {scores}")
        lines.append(f"*Report:* {_code(evaluation.uri + '/report.html')}")
    for model in outcome.models:
        line = f"*Model {slack_escape(model.name)}:* {_code(model.uri)}"
        if model.mlflow_link:
            line += f" · {_slack_link(model.mlflow_link, 'MLflow run')}"
        lines.append(line)
    if outcome.unfinished:
        lines.append("*Not published:* " + ", ".join(slack_escape(name) for name in outcome.unfinished))
    return lines


def slack_payload(outcome: Outcome, limit: int = SLACK_TEXT_LIMIT) -> dict[str, Any]:
    """`{"text": ...}` in Slack mrkdwn (accepted by Slack's incoming webhooks and by those of Mattermost, Rocket.Chat
    and Discord's /slack endpoint), at most `limit` characters: whole lines, then how many were left out."""
    room = limit - 60  # for the note of what was left out
    lines = [clip(line, room) for line in slack_lines(outcome)]
    text = "\n".join(lines)
    if len(text) > limit:
        kept: list[str] = []
        for line in lines:
            if len("\n".join([*kept, line])) > room:
                break
            kept.append(line)
        text = "\n".join([*kept, f"… {len(lines) - len(kept)} more line(s) in the run's summary"])
    return {"text": text, "mrkdwn": True}


# --------------------------------------------------------------------------- the webhook address


def redact_address(text: str, address: str) -> str:
    """`text` without the webhook address: the whole URL, and its path and query (a Slack webhook's path is its
    credential), become ***; what tracking.redact removes goes too."""
    address = address.strip()
    if address:
        parts = urllib.parse.urlsplit(address)
        secrets = {address, address.rstrip("/"), parts.path + (f"?{parts.query}" if parts.query else ""), parts.query}
        for secret in sorted((s for s in secrets if len(s) > 1), key=len, reverse=True):
            text = text.replace(secret, REDACTED)
            text = text.replace(urllib.parse.unquote(secret), REDACTED)
    return redact(text)


def address_host(address: str) -> str:
    """What a log may say of the webhook: its scheme and host."""
    parts = urllib.parse.urlsplit(address.strip())
    return f"{parts.scheme}://{parts.hostname}" if parts.hostname else "(an address without a host)"
