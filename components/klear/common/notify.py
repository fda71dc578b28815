"""The exit task of a run (klear.common.outcome_component): gather the run's outcome, publish its summary, post it.

It reads what the run left: its status (KFP), on a cluster its Argo Workflow and the failed pods' logs (the
Kubernetes API, with the rights the chart's Role gives the pipeline's service account), and what it published
under `<run_root>/<run id>` (storage). What cannot be read is a note in the summary, never a failed exit task:
the run's own outcome is decided already, and a failing exit task would lose the summary too.

The webhook (a Slack-compatible incoming webhook, from the notify Secret) gets the outcome as `{"text": ...}`, with
a timeout and a bounded number of attempts. A webhook that cannot be reached or refuses is a warning in the log: a
notification channel that is down must not turn a good run red nor hide a failed run's summary. The address is a
credential (a Slack webhook's path is its secret): no log line or message shows it, only its host.
"""

from __future__ import annotations

import html
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from klear.common import outcome, storage
from klear.common.kfp_io import RUN_ID_ENV, record_output
from klear.common.lineage import TASK_ENV
from klear.common.tracking import read_run_record, redact

log = logging.getLogger("klear.notify")

# The chart's Secret of the notification settings (charts/klear-reasoner: notifications.secretName); every key
# optional, the Secret too. Its keys reach the exit task as these variables.
NOTIFY_SECRET = "klear-notify"
SECRET_KEY_TO_ENV = {"webhook-url": "KLEAR_NOTIFY_WEBHOOK", "kfp-ui-url": "KLEAR_KFP_UI_URL"}
WEBHOOK_ENV, UI_ENV = SECRET_KEY_TO_ENV["webhook-url"], SECRET_KEY_TO_ENV["kfp-ui-url"]
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"  # the tracking Secret's address: the MLflow links
WEBHOOK_TIMEOUT_S, WEBHOOK_ATTEMPTS, WEBHOOK_BACKOFF_S, RETRY_AFTER_CAP_S = 10.0, 3, 2.0, 30.0
LOG_TAIL_LINES = 200  # of a failed pod's log: where its traceback ends
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
WORKFLOW_LABEL, NODE_ANNOTATION = "workflows.argoproj.io/workflow", "workflows.argoproj.io/node-name"


# --------------------------------------------------------------------------- storage


def _tracker_runs(run: storage.Uri, name: str, files: list[str]) -> tuple[str, str, str]:
    """(mlflow run id, its MLflow link, W&B run id) of a published model, from the tracker ids it was published with
    (tracking.read_run_record) and the MLflow address (the tracking Secret's MLFLOW_TRACKING_URI, else the stage
    config's tracking_uri)."""
    ids = read_run_record(str(run.join(name)))
    mlflow_run, wandb_run = str(ids.get("mlflow") or ""), str(ids.get("wandb") or "")
    address = os.environ.get(MLFLOW_URI_ENV, "")
    if mlflow_run and not address and "report.json" in files:
        config = json.loads(storage.read_bytes(run.join(name, "report.json"))).get("config") or {}
        address = str(config.get("tracking_uri") or "")
    return mlflow_run, outcome.mlflow_link(address, mlflow_run), wandb_run


def published(run_root: str, run_id: str) -> tuple[list[outcome.RunEvaluation], list[outcome.RunModel], list[str]]:
    """What the run published under `<run_root>/<run id>`: its evaluations, its models (in the recipe's order), and
    the output folders it started but never published."""
    run = storage.Uri.parse(run_root.rstrip("/")).join(run_id)
    names = storage.list_files(run)
    done, unfinished = outcome.stage_folders(names)
    evaluations, models = [], []
    for name in done:
        files = [n.partition("/")[2] for n in names if n.startswith(f"{name}/")]
        if outcome.EVALUATION_FOLDERS.match(name):
            found = outcome.evaluation_of(name, str(run.join(name)), storage.read_manifest(run.join(name)).meta)
            if found is not None:
                evaluations.append(found)
        elif outcome.MODEL_FOLDERS.match(name):
            models.append(outcome.RunModel(name, str(run.join(name)), *_tracker_runs(run, name, files)))
    return evaluations, sorted(models, key=lambda m: outcome.model_order(m.name)), unfinished


# --------------------------------------------------------------------------- the cluster


def _on_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(NAMESPACE_FILE)


def cluster_failures(group: str) -> tuple[list[outcome.FailedTask], str]:
    """On a cluster: the tasks that failed for good (from the run's Workflow, each with its log's error) and the
    exit handler group's phase. Needs `get` on workflows, `get`/`list` on pods and `get` on pods/log (the chart's
    Role). Raises what the API raises; outside a cluster, ([], "")."""
    pod_name = os.environ.get(TASK_ENV, "").strip()
    if not _on_cluster() or not pod_name:
        return [], ""
    from kubernetes import client, config

    config.load_incluster_config()
    with open(NAMESPACE_FILE) as fh:
        namespace = fh.read().strip()
    core = client.CoreV1Api()
    pod = core.read_namespaced_pod(pod_name, namespace)
    owners = [o.name for o in pod.metadata.owner_references or [] if o.kind == "Workflow"]
    name = owners[0] if owners else (pod.metadata.labels or {}).get(WORKFLOW_LABEL, "")
    if not name:
        raise RuntimeError(f"pod {pod_name} belongs to no Argo Workflow")
    workflow = client.CustomObjectsApi().get_namespaced_custom_object("argoproj.io", "v1alpha1", namespace,
                                                                     "workflows", name)
    nodes = outcome.failed_nodes(workflow)
    pods = {}
    if nodes:
        for item in core.list_namespaced_pod(namespace, label_selector=f"{WORKFLOW_LABEL}={name}").items:
            pods[(item.metadata.annotations or {}).get(NODE_ANNOTATION, "")] = item.metadata.name
    failed = []
    for node in nodes:
        text = ""
        if node.node in pods:
            try:
                text = core.read_namespaced_pod_log(pods[node.node], namespace, container="main",
                                                    tail_lines=LOG_TAIL_LINES)
            except Exception as exc:  # noqa: BLE001 - a pod already gone: Argo's message stands
                log.warning("no log of %s: %s", node.task, redact(str(exc)))
        failed.append(outcome.FailedTask(node.task, outcome.error_line(text) or node.reason, node.reason))
    return failed, outcome.group_phase(workflow, group)


# --------------------------------------------------------------------------- the webhook


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds (its date form is not used by webhooks), capped; None if absent or other."""
    try:
        return min(float(value or ""), RETRY_AFTER_CAP_S)
    except ValueError:
        return None


def post_json(address: str, payload: Mapping[str, Any], timeout_s: float = WEBHOOK_TIMEOUT_S,
              attempts: int = WEBHOOK_ATTEMPTS, backoff_s: float = WEBHOOK_BACKOFF_S,
              sleep: Callable[[float], None] = time.sleep) -> str:
    """POST `payload` as JSON; "" when accepted (2xx), else why not (redacted: never the address). Retries what may
    pass later (no answer, 429, 5xx) up to `attempts` times, waiting backoff_s, 2 x backoff_s, ... (or the server's
    Retry-After, capped); another 4xx is final."""
    body = json.dumps(payload).encode()
    problem = "no attempt made"
    for attempt in range(1, attempts + 1):
        wait: float | None = None
        request = urllib.request.Request(address, data=body, method="POST",
                                         headers={"Content-Type": "application/json; charset=utf-8"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - an http(s) address
                response.read()
            return ""
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code} {exc.reason}"
            if exc.code != 429 and exc.code < 500:
                break
            wait = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
        except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, unreachable, timed out, a bad URL
            problem = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            if isinstance(exc, ValueError):
                break
        if attempt < attempts:
            sleep(wait if wait is not None else backoff_s * 2 ** (attempt - 1))
    return outcome.redact_address(f"{problem} (after {attempt} attempt(s))", address)


def notify(address: str, payload: Mapping[str, Any], **post: Any) -> bool:
    """Post the outcome to the webhook, logging the result by host only; False when it was not accepted."""
    host = outcome.address_host(address)
    if not address.lower().startswith(("http://", "https://")):
        log.warning("the notify Secret's webhook-url is not an http(s) address; nothing posted")
        return False
    problem = post_json(address, payload, **post)
    if problem:
        log.warning("the webhook at %s did not take the run's outcome: %s", host, problem)
        return False
    log.info("posted the run's outcome to the webhook at %s", host)
    return True


# --------------------------------------------------------------------------- the exit task


def _final_outputs(run: storage.Uri, done: list[str], final_model: str, evaluation: str, model: Any,
                   report_path: str) -> None:
    """The pipeline's outputs, from storage (KFP hands no output of a task inside an ExitHandler out): the final
    model's location, the evaluation's HTML report; each a note of why it is missing when the run did not publish it."""
    why = "not published by this run (a failure before it, or KFP served it from an earlier run's cache)"
    if final_model in done:
        record_output(model, str(run.join(final_model)), {"stage": final_model})
    else:
        record_output(model, "", {"stage": final_model, "missing": why})
    os.makedirs(os.path.dirname(report_path) or ".", exist_ok=True)
    page = None
    if evaluation in done:
        try:
            page = storage.read_bytes(run.join(evaluation, "report.html"))
        except Exception as exc:  # noqa: BLE001 - the summary and the notification still go out
            why = f"published, but its report.html could not be read: {redact(str(exc))[:300]}"
    with open(report_path, "wb") as out:
        out.write(page if page is not None else (f"<!doctype html><meta charset='utf-8'><p>No evaluation report: "
                                                 f"{html.escape(evaluation)} was {html.escape(why)}.</p>\n").encode())


def report_outcome(state: str | None, group: str, error_message: str | None, pipeline: str, run_root: str,
                   summary_path: str, model: Any, report_path: str, final_model: str = "gppo-code",
                   evaluation: str = "evaluate") -> outcome.Outcome:
    """Gather the run's outcome, write its Markdown summary and the pipeline's outputs, post it to the webhook when
    the notify Secret names one. Never raises for what it cannot read or post."""
    run_id = os.environ.get(RUN_ID_ENV, "").strip() or "(no run id)"
    result = outcome.Outcome(pipeline, run_id, outcome.status_state(state),
                             status_message=outcome.status_message(error_message, group),
                             run_link=outcome.kfp_run_link(os.environ.get(UI_ENV, ""), run_id))
    try:
        failed, phase = cluster_failures(group)
        result.failed, result.state = failed, outcome.run_state(state, phase, failed)
    except Exception as exc:  # noqa: BLE001 - the summary goes on without the Workflow
        result.notes.append(f"the run's Workflow (which task failed, and why): {redact(str(exc))[:300]}")
    done: list[str] = []
    run = storage.Uri.parse(run_root.rstrip("/") or ".").join(run_id)
    try:
        result.evaluations, result.models, result.unfinished = published(run_root, run_id)
        done = [e.name for e in result.evaluations] + [m.name for m in result.models]
    except Exception as exc:  # noqa: BLE001 - e.g. the store unreachable: the state and failures still count
        result.notes.append(f"the run's outputs under {run}: {redact(str(exc))[:300]}")
    with open(summary_path, "w") as out:
        out.write(outcome.render_markdown(result))
    _final_outputs(run, done, final_model, evaluation, model, report_path)
    log.info("run %s %s", run_id, result.state)
    address = os.environ.get(WEBHOOK_ENV, "").strip()
    if address:
        notify(address, outcome.slack_payload(result))
    return result
