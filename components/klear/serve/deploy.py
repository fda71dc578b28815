"""Create or replace an InferenceService through the Kubernetes API and wait until it serves the model it names.

Server-side apply (field manager `klear-serve`, conflicts forced): the first apply creates the object, a later one
replaces what this manager set (a field it no longer sets is removed), whoever set it before (a `helm install` of the
chart's `serving` values, a hand edit). The wait then reads KServe's status: the Ready condition, and with a changed
spec only once that condition changed after the apply (the predictor is replaced with the Recreate strategy, so Ready
goes false while the new model loads: the Ready of the old model right after the apply does not count). A server that
cannot load the model (its container exits) fails the wait with KServe's failure info rather than at the timeout; a
copy that fails (the init container) is seen at the timeout only, which is why the step checks the model's manifest
before it applies anything (klear.serve.component).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from klear.serve.manifest import API_VERSION, KIND, MODEL_URI_ANNOTATION

log = logging.getLogger("klear.serve")

FIELD_MANAGER = "klear-serve"
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class InferenceServices(Protocol):
    """The two API calls the deploy step makes, on the InferenceServices of one namespace."""

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply; the object as stored."""
        ...

    def get(self, name: str) -> dict[str, Any] | None:
        ...


class KServeApi:
    """InferenceServices of one namespace through the API server (kubernetes' dynamic client, in-cluster config)."""

    def __init__(self, namespace: str) -> None:
        from kubernetes import client, config, dynamic
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        config.load_incluster_config()
        self.namespace = namespace
        self.client = dynamic.DynamicClient(client.ApiClient())
        try:
            self.resource = self.client.resources.get(api_version=API_VERSION, kind=KIND)
        except ResourceNotFoundError:
            raise RuntimeError(f"this cluster serves no {KIND} ({API_VERSION}): install KServe (>= 0.13) first") from None

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        stored = self.client.server_side_apply(self.resource, body=manifest, namespace=self.namespace,
                                               field_manager=FIELD_MANAGER, force_conflicts=True)
        return dict(stored.to_dict())

    def get(self, name: str) -> dict[str, Any] | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return dict(self.client.get(self.resource, name=name, namespace=self.namespace).to_dict())
        except NotFoundError:
            return None


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def applied_at(stored: Mapping[str, Any]) -> datetime | None:
    """When this manager last changed the object, by the API server's clock (its managedFields entry)."""
    entries = [e for e in stored.get("metadata", {}).get("managedFields") or [] if e.get("manager") == FIELD_MANAGER]
    times = [t for e in entries if (t := _time(e.get("time")))]
    return max(times) if times else None


def serving_state(obj: Mapping[str, Any], since: datetime | None) -> tuple[str, str]:
    """("ready", url), ("failed", why) or ("waiting", why) from an InferenceService's status. `since`: the status
    counts only once its Ready condition changed at or after that time (None: as it is)."""
    status = obj.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None:
        return "waiting", "no Ready condition yet"
    changed = _time(ready.get("lastTransitionTime"))
    if since is not None and (changed is None or changed < since):
        return "waiting", "the status still describes the server before this apply"
    model = status.get("modelStatus") or {}
    if model.get("transitionStatus") in ("BlockedByFailedLoad", "InvalidSpec"):
        failure = model.get("lastFailureInfo") or {}
        reason = ", ".join(f"{key} {failure[key]}" for key in ("reason", "message", "exitCode") if failure.get(key))
        return "failed", f"{model['transitionStatus']}: {reason or 'no failure info'}"
    if ready.get("status") == "True":
        return "ready", str(status.get("url") or "")
    return "waiting", f"{ready.get('reason') or 'not ready'}: {ready.get('message') or ''}".rstrip(": ")


def deploy(api: InferenceServices, manifest: dict[str, Any], timeout_s: float, poll_s: float = 15.0,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str:
    """Apply `manifest` and wait until it serves; returns KServe's URL of it. RuntimeError when it fails to load or
    is not ready within `timeout_s`."""
    name = manifest["metadata"]["name"]
    before = api.get(name)
    stored = api.apply(manifest)
    changed = before is None or stored["metadata"].get("generation") != before["metadata"].get("generation")
    since = (applied_at(stored) or datetime.now(UTC)) if changed else None
    log.info("%s %s %s; waiting until it is ready", "created" if before is None else "replaced" if changed else "kept",
             KIND, name)
    deadline, last = clock() + timeout_s, ""
    while True:
        current = api.get(name) or stored
        state, detail = serving_state(current, since)
        if state == "ready":
            return detail
        if state == "failed":
            model = manifest["metadata"]["annotations"].get(MODEL_URI_ANNOTATION, "")
            raise RuntimeError(f"{KIND} {name} failed to serve {model}: {detail}")
        if detail != last:
            log.info("%s %s: %s", KIND, name, detail)
            last = detail
        if clock() >= deadline:
            raise RuntimeError(f"{KIND} {name} not ready after {timeout_s:.0f} s: {detail}")
        sleep(poll_s)


def pod_namespace(default: str = "kubeflow") -> str:
    """The namespace of the pod this runs in (its service account's), else `default`."""
    try:
        with open(NAMESPACE_FILE) as fh:
            return fh.read().strip() or default
    except OSError:
        return default
