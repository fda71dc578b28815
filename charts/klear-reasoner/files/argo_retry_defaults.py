"""Make Argo retry the deleted pods of retried tasks: set `spec.templateDefaults.retryStrategy` in the workflow
controller's `workflowDefaults`, keeping every other setting of its ConfigMap.

    python argo_retry_defaults.py --retry-strategy FILE --namespace NS --configmap NAME   # update it in the cluster
    python argo_retry_defaults.py --retry-strategy FILE --from-file CONFIGMAP.yaml         # print the updated ConfigMap

Why: KFP's Argo compiler turns `set_retry` into a `retryStrategy` with a limit and a backoff but no `retryPolicy`
(backend/src/v2/compiler/argocompiler/container.go), which Argo reads as OnFailure: a container that exits non-zero
is retried, a pod that is deleted (preemption, node drain, spot reclaim: node phase Error, "pod deleted") is not.
Argo applies `templateDefaults` to each template as a strategic merge patch in which the template's own fields win
(workflow/controller/operator.go, mergedTemplateDefaultsInto), so the chart's {limit: 0, retryPolicy: Always} gives a
retried task its own limit and backoff with errors covered, and any other template a strategy that never retries.

Run by the chart's hook Job (argoRetryDefaults.enabled). Idempotent; the controller reloads its ConfigMap when it
changes. The whole `retryStrategy` default is replaced (KFP 2.17's manifests ship {limit: '2', retryPolicy: OnError},
which would stop retried tasks from retrying failed containers); other keys and other defaults stay as they are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

POLICIES = ("Always", "OnFailure", "OnError", "OnTransientError")  # Argo's RetryPolicy values


class _BlockDumper(yaml.SafeDumper):
    """Multi-line values (the ConfigMap's settings) as `|` blocks, readable when printed or committed."""


_BlockDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def check_strategy(strategy: Any, source: str) -> dict[str, Any]:
    """The retryStrategy to set, refused when it would retry templates that have no retries of their own."""
    if not isinstance(strategy, dict):
        raise SystemExit(f"{source}: a retryStrategy must be a mapping, got {strategy!r}")
    # A default without a limit is an unlimited retry of every template that has no strategy of its own.
    if str(strategy.get("limit", "")).strip() != "0":
        raise SystemExit(f"{source}: retryStrategy.limit must be 0 (templates without set_retry must not retry), "
                         f"got {strategy.get('limit')!r}")
    if strategy.get("retryPolicy") not in POLICIES:
        raise SystemExit(f"{source}: retryStrategy.retryPolicy must be one of {', '.join(POLICIES)}, "
                         f"got {strategy.get('retryPolicy')!r}")
    return strategy


def _mapping(text: str | None, where: str) -> dict[str, Any]:
    value = yaml.safe_load(text) if text else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SystemExit(f"{where} is not a YAML mapping")
    return value


def _child(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise SystemExit(f"{where}.{key} is not a mapping")
    return value


def set_retry_default(data: dict[str, str], strategy: dict[str, Any], where: str) -> tuple[str, str, Any]:
    """(key, new text, the retryStrategy default it replaces) for the ConfigMap `data` of Argo's controller.

    Argo reads either one `config` key holding the whole configuration or one key per setting
    (config/controller.go, parseConfigMap); KFP's manifests use the latter."""
    if "config" in data:
        key = "config"
        config = _mapping(data["config"], f"{where}: data.config")
        defaults = _child(config, "workflowDefaults", f"{where}: data.config")
        path, root = f"{where}: data.config.workflowDefaults", config
    else:
        key = "workflowDefaults"
        defaults = root = _mapping(data.get(key), f"{where}: data.workflowDefaults")
        path = f"{where}: data.workflowDefaults"
    template_defaults = _child(_child(defaults, "spec", path), "templateDefaults", f"{path}.spec")
    replaced = template_defaults.get("retryStrategy")
    template_defaults["retryStrategy"] = strategy
    return key, yaml.safe_dump(root, sort_keys=False), replaced


def update_in_cluster(namespace: str, name: str, strategy: dict[str, Any]) -> str:
    from kubernetes import client, config

    config.load_incluster_config()
    api = client.CoreV1Api()
    configmap = api.read_namespaced_config_map(name, namespace)
    key, text, replaced = set_retry_default(configmap.data or {}, strategy, f"ConfigMap {namespace}/{name}")
    if replaced == strategy:
        return f"ConfigMap {namespace}/{name}: retryStrategy default already {strategy}"
    configmap.data = {**(configmap.data or {}), key: text}
    # A replace carries the resourceVersion read above: a concurrent writer makes it fail (the Job retries)
    # instead of being overwritten.
    api.replace_namespaced_config_map(name, namespace, configmap)
    return f"ConfigMap {namespace}/{name}: retryStrategy default {replaced} -> {strategy}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--retry-strategy", type=Path, required=True, help="YAML file holding the retryStrategy")
    parser.add_argument("--namespace", default="kubeflow", help="namespace of Argo's workflow controller")
    parser.add_argument("--configmap", default="workflow-controller-configmap")
    parser.add_argument("--from-file", type=Path, help="a ConfigMap manifest to update and print instead")
    args = parser.parse_args(argv)

    strategy = check_strategy(yaml.safe_load(args.retry_strategy.read_text()), str(args.retry_strategy))
    if args.from_file is None:
        print(update_in_cluster(args.namespace, args.configmap, strategy), flush=True)
        return 0
    configmap = _mapping(args.from_file.read_text(), str(args.from_file))
    data = configmap.get("data") or {}
    key, text, replaced = set_retry_default(data, strategy, str(args.from_file))
    configmap["data"] = {**data, key: text}
    yaml.dump(configmap, sys.stdout, Dumper=_BlockDumper, sort_keys=False)
    print(f"retryStrategy default {replaced} -> {strategy}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
