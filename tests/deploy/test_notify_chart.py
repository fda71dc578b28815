"""The chart's part in a run reporting its outcome: the notify Secret (only the keys given, the names the exit task
reads), none without values or with a Secret of your own, values checked by the schema, and the Role's rights for
what the exit task reads on a cluster (klear.common.notify)."""

from __future__ import annotations

import re

import pytest

from klear.common.notify import NOTIFY_SECRET, SECRET_KEY_TO_ENV
from tests.deploy.helpers import CHART, CREDENTIALS, NAMESPACE, ROOT, find, merge, render, validation_errors

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

HOOK = "https://hooks.slack.com/services/T0AAA/B0BBB/xoxSECRETtoken12"


def _secrets(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == NOTIFY_SECRET]


def test_the_notify_secret_holds_the_keys_given_and_only_when_given() -> None:
    objects = render(merge(CREDENTIALS, {"notifications": {"webhookUrl": HOOK}}))
    (secret,) = _secrets(objects)
    assert secret["stringData"] == {"webhook-url": HOOK} and not validation_errors(secret)
    both = render(merge(CREDENTIALS, {"notifications": {"webhookUrl": HOOK, "kfpUiUrl": "https://kf.example.com/pipeline"}}))
    assert set(_secrets(both)[0]["stringData"]) == set(SECRET_KEY_TO_ENV)  # the keys the exit task mounts
    assert _secrets(render(CREDENTIALS)) == []
    assert _secrets(render(merge(CREDENTIALS, {"notifications": {"webhookUrl": HOOK, "existingSecret": "mine"}}))) == []


def test_the_schema_refuses_a_webhook_that_is_no_address() -> None:
    report = helm.lint(CHART, merge(CREDENTIALS, {"notifications": {"webhookUrl": "hooks.slack.com/services/T/B/x"}}),
                       strict=True, namespace=NAMESPACE, kube_version="v1.31.0")
    assert any("webhookUrl" in str(problem) for problem in [*report["errors"], *report["messages"]]), report


def test_the_role_lets_the_exit_task_read_the_workflow_and_failed_pods() -> None:
    role = find(render(CREDENTIALS), "Role")
    grants = {(group, resource): set(rule["verbs"]) for rule in role["rules"]
              for group in rule["apiGroups"] for resource in rule["resources"]}
    source = (ROOT / "components" / "klear" / "common" / "notify.py").read_text()
    # The custom objects and the core calls klear.common.notify makes.
    assert re.findall(r'"(argoproj\.io)", "v1alpha1", namespace,\s*"(\w+)"', source) == [("argoproj.io", "workflows")]
    assert grants[("argoproj.io", "workflows")] >= {"get"}
    assert {"read_namespaced_pod", "list_namespaced_pod", "read_namespaced_pod_log"} <= set(
        re.findall(r"core\.(\w+)\(", source))
    assert grants[("", "pods")] >= {"get", "list"} and grants[("", "pods/log")] >= {"get"}
