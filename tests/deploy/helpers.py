"""What the deploy tests share: the chart rendered with Helm's Go SDK, manifest validation against Kubernetes'
schemas (kubernetes-validate, strict), Kubeflow Trainer's own CRD schemas (vendored under crds/), KServe's
InferenceService CRD schema (vendored), Katib's Experiment from Katib's own generated definitions, small envelope
schemas for the other CRDs, Dockerfile parsing, and docker/lock.py loaded by path (docker/ is not a package: it would
shadow the `docker` distribution)."""

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
CRDS = Path(__file__).parent / "crds"
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


def _strict(schema: Any) -> Any:
    """A CRD's structural schema (OpenAPI v3) as JSON Schema that fails where an API server creating with
    fieldValidation=Strict fails: every object closed unless it declares additionalProperties or
    x-kubernetes-preserve-unknown-fields (the API server prunes, or with Strict refuses, any field its schema
    does not list). The x-kubernetes-* markers, formats and CEL rules are left to JSON Schema, which ignores them."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: ({name: _strict(sub) for name, sub in value.items()} if key == "properties" else _strict(value))
           for key, value in schema.items()}
    if (out.get("type") == "object" and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd_schema(path: Path, cluster_scoped: bool = False) -> dict[str, Any]:
    """The JSON Schema of one vendored CRD version (crds/*.json: its openAPIV3Schema, apiVersion and kind). The
    object's apiVersion, kind and metadata, which a CRD leaves to the API server, are checked here too."""
    crd = json.loads(path.read_text())
    schema = _strict(crd["openAPIV3Schema"])
    metadata = {"allOf": [_META, {"not": {"required": ["namespace"]}}]} if cluster_scoped else _META
    schema["properties"].update({"apiVersion": {"const": crd["apiVersion"]}, "kind": {"const": crd["kind"]},
                                 "metadata": metadata})
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return schema


# Kubeflow Trainer (trainer.kubeflow.org/v1alpha1): Trainer v2.3.0's own CRDs, descriptions removed. The project
# writes the v2.2+ API (runtimePatches), which v2.3 only added optional fields to. No package ships them.
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ClusterTrainingRuntime": crd_schema(CRDS / "trainer.kubeflow.org_clustertrainingruntimes.v2.3.0.json",
                                         cluster_scoped=True),
    "TrainJob": crd_schema(CRDS / "trainer.kubeflow.org_trainjobs.v2.3.0.json"),
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


# Katib's Experiment (kubeflow.org/v1beta1). Its CRD's openAPIV3Schema is only `type: object` with
# x-kubernetes-preserve-unknown-fields (manifests/v1beta1/components/crd/experiment.yaml): the API server takes any
# spec, and a misspelt field is silently dropped by Katib's Go decoder. So the spec is also checked against the
# OpenAPI definitions Katib generates from its Go types (pkg/apis/v1beta1/swagger.json), vendored in
# katib_experiment_schema.json with their source commit, closed like Kubernetes' strict schemas, with the enums the
# Go constants define; a batch Job trial template is checked by Kubernetes' own strict Job schema.
KATIB_SCHEMA_FILE = Path(__file__).with_name("katib_experiment_schema.json")
# Kubernetes types the Katib definitions name (swagger "v1.X") -> kubernetes-validate's definitions.
_KATIB_K8S_REFS = {"v1.ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                   "v1.Container": "io.k8s.api.core.v1.Container", "v1.HTTPGetAction": "io.k8s.api.core.v1.HTTPGetAction"}
# String enums of the Go types (pkg/apis/controller/common/v1beta1/common_types.go,
# pkg/apis/controller/experiments/v1beta1/experiment_types.go), without their "unknown" placeholders.
_KATIB_ENUMS = {
    ("v1beta1.ObjectiveSpec", "type"): ["minimize", "maximize"],
    ("v1beta1.MetricStrategy", "value"): ["min", "max", "latest"],
    ("v1beta1.CollectorSpec", "kind"): ["StdOut", "File", "TensorFlowEvent", "PrometheusMetric", "Custom", "Push"],
    ("v1beta1.ParameterSpec", "parameterType"): ["double", "int", "discrete", "categorical"],
    ("v1beta1.FeasibleSpace", "distribution"): ["uniform", "logUniform", "normal", "logNormal"],
    ("v1beta1.ExperimentSpec", "resumePolicy"): ["Never", "LongRunning", "FromVolume"],
    ("v1beta1.FileSystemPath", "kind"): ["Directory", "File"],
    ("v1beta1.FileSystemPath", "format"): ["TEXT", "JSON"],
}


def _katib_definition(definition: Any) -> Any:
    """A swagger definition as JSON Schema: refs to local $defs or to Kubernetes' definitions, objects closed."""
    if isinstance(definition, list):
        return [_katib_definition(item) for item in definition]
    if not isinstance(definition, dict):
        return definition
    out = {key: _katib_definition(value) for key, value in definition.items()}
    ref = out.get("$ref", "").removeprefix("#/definitions/")
    if ref:
        out.pop("$ref")
        if ref == "v1.unstructured.Unstructured":  # the trial template: any kind; a Job is checked below
            out["type"] = "object"
        else:
            out.update(_ref(_KATIB_K8S_REFS[ref]) if ref in _KATIB_K8S_REFS else {"$ref": f"#/$defs/{ref}"})
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def katib_experiment_schema() -> dict[str, Any]:
    vendored = json.loads(KATIB_SCHEMA_FILE.read_text())
    definitions = {name: _katib_definition(d) for name, d in vendored["definitions"].items()}
    for (name, field), values in _KATIB_ENUMS.items():
        definitions[name]["properties"][field]["enum"] = values
    job = {"if": {"properties": {"kind": {"const": "Job"}}, "required": ["kind"]},
           "then": _ref("io.k8s.api.batch.v1.Job")}
    definitions["v1beta1.TrialTemplate"]["properties"]["trialSpec"] = {"type": "object", "allOf": [job]}
    experiment = {**definitions["v1beta1.Experiment"], "required": ["apiVersion", "kind", "metadata", "spec"]}
    experiment["properties"] = {**experiment["properties"], "apiVersion": {"const": "kubeflow.org/v1beta1"},
                                "kind": {"const": "Experiment"}}
    return {"$defs": definitions, "allOf": [vendored["crdOpenAPIV3Schema"], experiment]}


CRD_SCHEMAS["Experiment"] = katib_experiment_schema()
# KServe's InferenceService (serving.kserve.io/v1beta1): the openAPIV3Schema of its CRD as KServe v0.20.0 ships it
# (config/crd/full/serving.kserve.io_inferenceservices.yaml, sha256 57c3bf13f77de946...758fcff; its one version's
# schema.openAPIV3Schema dumped as JSON, keys sorted, gzip: 22 KB for 636 KB), whole and unchanged. Made strict when
# loaded as Trainer's CRDs are (`_strict`); metadata is Kubernetes' ObjectMeta.
KSERVE_SCHEMA = Path(__file__).with_name("kserve-v0.20.0-inferenceservice-schema.json.gz")


def _inference_service_schema() -> dict[str, Any]:
    schema = _strict(json.loads(gzip.decompress(KSERVE_SCHEMA.read_bytes())))
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
