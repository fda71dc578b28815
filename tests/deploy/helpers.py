"""What the deploy tests share: the chart rendered with Helm's Go SDK, manifest validation against Kubernetes'
schemas (kubernetes-validate, strict) with small envelope schemas for the Kubeflow CRDs and KServe's own CRD schema
(vendored), Dockerfile parsing, and docker/lock.py loaded by path (docker/ is not a package: it would shadow the
`docker` distribution)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "klear-reasoner"
KUBERNETES_VERSION = "1.31.0"  # kubernetes-validate's newest bundled schemas; the chart needs >= 1.29
RELEASE, NAMESPACE = "klear", "team-a"
CREDENTIALS = {"s3": {"accessKeyId": "AKIAEXAMPLE", "secretAccessKey": "secret-example"}}


def load_lock_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("klear_docker_lock", ROOT / "docker" / "lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- chart


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the chart renders for `values` (NOTES.txt and empty documents left out)."""
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for name, text in sorted(files.items()) if name.endswith((".yaml", ".yml"))
            for doc in yaml.safe_load_all(text) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in matches]}"
    return matches[0]


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod specs inside a workload object (Deployment, Job, ClusterTrainingRuntime's replicated jobs)."""
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind in ("Deployment", "Job"):
        return [spec["template"]["spec"]]
    if kind == "ClusterTrainingRuntime":
        return [job["template"]["spec"]["template"]["spec"] for job in spec["template"]["spec"]["replicatedJobs"]]
    return []


# --------------------------------------------------------------------------- validation

K8S_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"{K8S_DEFINITIONS}#/$defs/{name}"}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_META = _ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")

# Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1) ClusterTrainingRuntime: the envelope (mlPolicy, a JobSet
# template of replicated batch Jobs), closed so a misspelt field fails; each Job template is checked by Kubernetes'
# own JobTemplateSpec schema. No package ships Trainer's CRD schemas (see DESIGN "Facts checked").
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ClusterTrainingRuntime": _closed({
        "apiVersion": {"const": "trainer.kubeflow.org/v1alpha1"}, "kind": {"const": "ClusterTrainingRuntime"},
        "metadata": {"allOf": [_META, {"not": {"required": ["namespace"]}}]},  # cluster-scoped
        "spec": _closed({
            "mlPolicy": _closed({
                "numNodes": {"type": "integer", "minimum": 1},
                "torch": _closed({"numProcPerNode": {"oneOf": [{"type": "integer", "minimum": 1},
                                                               {"enum": ["auto", "cpu", "gpu"]}]}}),
            }),
            "template": _closed({
                "metadata": _META,
                "spec": _closed({
                    "replicatedJobs": {"type": "array", "minItems": 1, "items": _closed({
                        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                        "replicas": {"type": "integer", "minimum": 1},
                        "template": _ref("io.k8s.api.batch.v1.JobTemplateSpec"),
                    }, ("name", "template"))},
                }, ("replicatedJobs",)),
            }, ("spec",)),
        }, ("template",)),
    }, ("apiVersion", "kind", "metadata", "spec")),
}

# LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, kubernetes-sigs/lws): the envelope as its Go types define it
# (api/leaderworkerset/v1/leaderworkerset_types.go), closed; leader and worker templates are checked by
# Kubernetes' own PodTemplateSpec schema.
CRD_SCHEMAS["LeaderWorkerSet"] = _closed({
    "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"}, "kind": {"const": "LeaderWorkerSet"},
    "metadata": _META,
    "spec": _closed({
        "replicas": {"type": "integer", "minimum": 0},
        "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
        "rolloutStrategy": {"type": "object"},
        "networkConfig": {"type": "object"},
        "leaderWorkerTemplate": _closed({
            "leaderTemplate": _ref("io.k8s.api.core.v1.PodTemplateSpec"),
            "workerTemplate": _ref("io.k8s.api.core.v1.PodTemplateSpec"),
            "size": {"type": "integer", "minimum": 1},
            "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"]},
            "subGroupPolicy": {"type": "object"},
            "volumeClaimTemplates": {"type": "array", "items": _ref("io.k8s.api.core.v1.PersistentVolumeClaim")},
        }, ("workerTemplate",)),
    }, ("leaderWorkerTemplate",)),
}, ("apiVersion", "kind", "metadata", "spec"))


# KServe's InferenceService (serving.kserve.io/v1beta1): the openAPIV3Schema of its CRD as KServe v0.20.0 ships it
# (config/crd/full/serving.kserve.io_inferenceservices.yaml, sha256 57c3bf13f77de946...758fcff; its one version's
# schema.openAPIV3Schema dumped as JSON, keys sorted, gzip: 22 KB for 636 KB), whole and unchanged. Made strict when
# loaded, as the API server's strict field validation is: an object that lists its properties takes no others unless
# the CRD keeps unknown fields there (x-kubernetes-preserve-unknown-fields); metadata is Kubernetes' ObjectMeta.
KSERVE_SCHEMA = Path(__file__).with_name("kserve-v0.20.0-inferenceservice-schema.json.gz")


def strict_crd_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's structural schema with additionalProperties false wherever the API server would drop unknown fields."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: strict_crd_schema(sub) for name, sub in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict_crd_schema(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = strict_crd_schema(out["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [strict_crd_schema(sub) for sub in out[key]]
    return out


def _inference_service_schema() -> dict[str, Any]:
    schema = strict_crd_schema(json.loads(gzip.decompress(KSERVE_SCHEMA.read_bytes())))
    schema["properties"]["metadata"] = _META
    schema["properties"]["kind"] = {"const": "InferenceService"}
    schema["properties"]["apiVersion"] = {"const": "serving.kserve.io/v1beta1"}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


CRD_SCHEMAS["InferenceService"] = _inference_service_schema()


def _registry() -> Any:
    from referencing import Registry, Resource

    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION}-local-strict"
    definitions = json.loads((folder / "_definitions.json").read_text())
    return Registry().with_resource(K8S_DEFINITIONS, Resource.from_contents(definitions))


def validation_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema error of one manifest: Kubernetes' strict schema for built-in kinds, CRD_SCHEMAS for Kubeflow's."""
    import kubernetes_validate
    from jsonschema import Draft202012Validator

    kind = obj.get("kind")
    if kind in CRD_SCHEMAS:
        validator = Draft202012Validator(CRD_SCHEMAS[kind], registry=_registry())
        return sorted(f"{kind}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                      for e in validator.iter_errors(obj))
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{kind} {obj['metadata'].get('name')}: {'.'.join(map(str, e.path))}: {e.message}"]
    return []


# --------------------------------------------------------------------------- Dockerfiles


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        pending += " " + stripped.rstrip("\\").strip() if raw.rstrip().endswith("\\") else " " + stripped
        if not raw.rstrip().endswith("\\"):
            keyword, _, args = pending.strip().partition(" ")
            out.append(Instruction(keyword.upper(), args.strip(), start))
            pending = ""
    return out


def shell_commands(instruction: Instruction) -> list[list[str]]:
    """The simple commands of a RUN (split at &&, ||, ;), each as argv."""
    return [shlex.split(part) for part in re.split(r"&&|\|\||;", instruction.args) if part.strip()]


def pip_installs(instructions: list[Instruction]) -> list[tuple[Instruction, list[str]]]:
    found = []
    for ins in instructions:
        if ins.keyword != "RUN":
            continue
        for argv in shell_commands(ins):
            words = [w for w in argv if "=" not in w or w.startswith("-")]  # drop VAR=value prefixes
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":
                    found.append((ins, words[i:]))
                elif words[i:i + 3] == ["-m", "pip", "install"]:
                    found.append((ins, words[i + 1:]))
    return found


# --------------------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore matching (Go filepath.Match plus `**`); a pattern also matches everything below."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(f"^{out}(?:/.*)?$")


def dockerignored(path: str, rules: list[str]) -> bool:
    """Whether the build context leaves `path` out: the last matching rule wins, `!` re-includes."""
    excluded = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        if _pattern_regex(pattern.strip("/")).match(path):
            excluded = not negate
    return excluded


def dockerignore_rules(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
