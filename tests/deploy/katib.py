"""What Katib does with an Experiment and a trial's log, ported from its source as facts (kubeflow/katib at the commit
katib_experiment_schema.json names): how its StdOut / File collector reads metrics from a log, how a trial's value is
taken from them, what its Experiment webhook refuses, how a trial's Job is made from the template, and how the
primary container's command is wrapped so that the collector gets its output."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

# pkg/metricscollector/v1beta1/common/const.go: DefaultFilter, used when the Experiment sets no filter. Go's \w and \d
# are ASCII-only: re.ASCII below.
DEFAULT_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
UNAVAILABLE = "unavailable"  # pkg/controller.v1beta1/consts/const.go: UnavailableMetricValue
ZERO_TIME = "0001-01-01T00:00:00Z"  # time.Time{}.UTC().Format(time.RFC3339): a line without a time
METRICS_FILE = "/var/log/katib/metrics.log"  # common_types.go DefaultFilePath: where the StdOut collector's output goes
# Go's time.Parse(time.RFC3339Nano, s) accepts these (fraction optional, any number of digits).
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
# The suggestion algorithms of Katib's default install (manifests/v1beta1/installs/katib-standalone/katib-config.yaml).
ALGORITHMS = ("random", "tpe", "grid", "hyperband", "bayesianoptimization", "cmaes", "sobol", "multivariate-tpe", "enas",
              "darts", "pbt")
# pkg/controller.v1beta1/consts/const.go: TrialTemplateParamReplaceFormat(Regex), TrialTemplateMetaReplaceFormatRegex.
_PARAMETER = "${{trialParameters.{}}}"
_ANY_PARAMETER = re.compile(r"\$\{trialParameters\..+?\}")
_META = re.compile(r"\$\{trialSpec\.(.+?)\}")
_META_KEYS = ("Name", "Namespace", "Kind", "APIVersion", "Annotations", "Labels")


@dataclass(frozen=True)
class MetricLog:
    timestamp: str
    name: str
    value: str


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def parse_text_log(text: str, metrics: list[str], filters: tuple[str, ...] = (DEFAULT_FILTER,)) -> list[MetricLog]:
    """The observation log Katib reads from a TEXT log (file-metricscollector.go: parseLogsInTextFormat and
    newObservationLog): lines that contain a metric's name; the first word as the time when it is RFC 3339; every
    filter match whose name is one of `metrics` (the objective first). Without the objective: one `unavailable`."""
    patterns = [re.compile(f, re.ASCII) for f in filters]
    logs: list[MetricLog] = []
    for line in text.split("\n"):
        if not any(metric in line for metric in metrics):
            continue
        first, space, _ = line.partition(" ")
        timestamp = first if space and _RFC3339.fullmatch(first) else ZERO_TIME
        for pattern in patterns:
            for match in pattern.finditer(line):
                name, value = match.group(1).strip(), match.group(2).strip()
                if name in metrics:
                    logs.append(MetricLog(timestamp, name, value))
    if not any(log.name == metrics[0] for log in logs):
        return [MetricLog(ZERO_TIME, metrics[0], UNAVAILABLE)]
    return logs


def trial_value(logs: list[MetricLog], name: str, strategy: str) -> str:
    """A trial's value of `name` by its strategy (trial_controller_util.go: getMetrics): min or max of the values that
    parse as numbers, or the latest by time, a later log winning a tie; `unavailable` when there is none."""
    values = [log for log in logs if log.name == name]
    numbers = [log.value for log in values if _is_number(log.value)]
    if strategy in ("min", "max"):
        pick = min if strategy == "min" else max
        return pick(numbers, key=float) if numbers else UNAVAILABLE
    latest, latest_time = UNAVAILABLE, None
    for log in values:
        current = _time(log.timestamp)
        if latest_time is None or not latest_time > current:
            latest, latest_time = log.value, current
    return latest


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- the Experiment webhook


def webhook_errors(experiment: dict[str, Any]) -> list[str]:
    """What Katib's validating webhook refuses in a new Experiment (pkg/webhook/v1beta1/experiment/validator/
    validator.go: ValidateExperiment, for parameters and a trialSpec), plus the pod webhook's need of the primary
    container (pkg/webhook/v1beta1/pod/utils.go). Its name rule is checked whole (the Go regex has no `$`)."""
    errors: list[str] = []
    name, spec = experiment["metadata"]["name"], experiment["spec"]
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 40:
        errors.append(f"metadata.name {name!r}")
    counts = {key: spec.get(key) for key in ("maxTrialCount", "parallelTrialCount", "maxFailedTrialCount")}
    if counts["maxFailedTrialCount"] is not None and counts["maxFailedTrialCount"] < 0:
        errors.append("maxFailedTrialCount < 0")
    for key in ("maxTrialCount", "parallelTrialCount"):
        if counts[key] is not None and counts[key] <= 0:
            errors.append(f"{key} <= 0")
    for key in ("maxFailedTrialCount", "parallelTrialCount"):
        if counts[key] is not None and counts["maxTrialCount"] is not None and counts[key] > counts["maxTrialCount"]:
            errors.append(f"{key} > maxTrialCount")
    objective = spec.get("objective") or {}
    if objective.get("type") not in ("minimize", "maximize"):
        errors.append(f"objective.type {objective.get('type')!r}")
    if not objective.get("objectiveMetricName"):
        errors.append("objective.objectiveMetricName missing")
    if objective.get("objectiveMetricName") in objective.get("additionalMetricNames", []):
        errors.append("additionalMetricNames holds the objective")
    if (spec.get("algorithm") or {}).get("algorithmName") not in ALGORITHMS:
        errors.append(f"algorithm {spec.get('algorithm')!r} is not in katib-config")
    if spec.get("resumePolicy", "") not in ("", "Never", "LongRunning", "FromVolume"):
        errors.append(f"resumePolicy {spec['resumePolicy']!r}")
    parameters = spec.get("parameters") or []
    if not parameters:
        errors.append("spec.parameters missing")
    errors += _parameter_errors(parameters)
    errors += _template_errors(spec.get("trialTemplate") or {}, {p["name"] for p in parameters})
    return errors


def _parameter_errors(parameters: list[dict[str, Any]]) -> list[str]:
    errors = []
    for i, parameter in enumerate(parameters):
        kind, space = parameter.get("parameterType"), parameter.get("feasibleSpace") or {}
        if kind not in ("int", "double", "categorical", "discrete", "unknown"):
            errors.append(f"parameters[{i}].parameterType {kind!r}")
        if space.get("distribution", "") not in ("", "uniform", "logUniform", "normal", "logNormal", "unknown"):
            errors.append(f"parameters[{i}].feasibleSpace.distribution {space['distribution']!r}")
        if not space:
            errors.append(f"parameters[{i}].feasibleSpace missing")
        elif kind in ("int", "double") and (space.get("list") or not space.get("min") or not space.get("max")):
            errors.append(f"parameters[{i}]: {kind} needs min and max, no list")
        elif kind in ("categorical", "discrete") and any(space.get(k) for k in ("min", "max", "step")):
            errors.append(f"parameters[{i}]: {kind} takes no min, max or step")
    return errors


def _template_errors(template: dict[str, Any], parameter_names: set[str]) -> list[str]:
    errors = []
    if not template.get("primaryContainerName"):
        errors.append("trialTemplate.primaryContainerName missing")
    if not template.get("successCondition") or not template.get("failureCondition"):
        errors.append("trialTemplate.successCondition / failureCondition missing")
    if template.get("trialParameters") is None or "trialSpec" not in template:
        return errors + ["trialTemplate.trialParameters / trialSpec missing"]
    text = json.dumps(template["trialSpec"])  # Katib substitutes in the template's JSON
    names: set[str] = set()
    references: set[str] = set()
    for i, parameter in enumerate(template["trialParameters"]):
        name, reference = parameter.get("name", ""), parameter.get("reference", "")
        if not name or not reference or "{" in name or "}" in name:
            errors.append(f"trialParameters[{i}]: name and reference")
            continue
        if name in names or reference in references:
            errors.append(f"trialParameters[{i}]: {name} / {reference} repeated")
            continue
        names.add(name)
        references.add(reference)
        meta = _META.fullmatch(reference)
        if parameter_names and not meta and reference not in parameter_names:
            errors.append(f"trialParameters[{i}].reference {reference!r} is not a parameter")
        if _PARAMETER.format(name) not in text:
            errors.append(f"trialParameters[{i}].name {name!r} is not in the trialSpec")
            return errors
        text = text.replace(_PARAMETER.format(name), "test-value")
    left = _ANY_PARAMETER.findall(text)
    if left:
        errors.append(f"trialSpec placeholders without a trial parameter: {left}")
    run = json.loads(text)
    if (run.get("metadata") or {}).get("name") or (run.get("metadata") or {}).get("namespace"):
        errors.append("trialSpec sets metadata.name or namespace")
    if not run.get("apiVersion") or not run.get("kind"):
        errors.append("trialSpec without apiVersion and kind")
    if run.get("kind") == "Job":
        containers = run["spec"]["template"]["spec"]["containers"]
        if template.get("primaryContainerName") not in [c["name"] for c in containers]:
            errors.append(f"primary container {template.get('primaryContainerName')!r} not in the Job's pod")
    return errors


# --------------------------------------------------------------------------- a trial


def trial_run_spec(experiment: dict[str, Any], trial: str, namespace: str, assignments: dict[str, str]) -> dict[str, Any]:
    """The object Katib creates for one trial (pkg/controller.v1beta1/experiment/manifest/generator.go:
    GetRunSpecWithHyperParameters): each trial parameter's placeholder replaced in the template's JSON by its
    parameter's assigned value or the trial's metadata (Name, Namespace), then the trial's name and namespace set."""
    template = experiment["spec"]["trialTemplate"]
    text = json.dumps(template["trialSpec"])
    for parameter in template["trialParameters"]:
        meta = _META.fullmatch(parameter["reference"])
        value = {"Name": trial, "Namespace": namespace}[meta.group(1)] if meta else assignments[parameter["reference"]]
        text = text.replace(_PARAMETER.format(parameter["name"]), value)
    run = json.loads(text)
    run.setdefault("metadata", {}).update(name=trial, namespace=namespace)
    return run


def wrapped_command(container: dict[str, Any], metrics_file: str = METRICS_FILE) -> list[str]:
    """The primary container's command once Katib's pod webhook has wrapped it for the StdOut collector
    (utils.go: wrapWorkerContainer, getMarkCompletedCommand): a `sh -c` / `bash -c` line keeps its shell, the rest is
    joined with spaces and its output redirected into the metrics file, then a `completed` marker is written."""
    argv = list(container.get("command", [])) + list(container.get("args", []))
    shell, rest = (argv[:2], argv[2:]) if argv[0] in ("sh", "bash") and argv[1] == "-c" else (["sh", "-c"], argv)
    folder = metrics_file.rsplit("/", 1)[0]
    line = " ".join([*rest, f"1>{metrics_file} 2>&1", "&&", f"echo completed > {folder}/$$$$.pid"])
    return [*shell, line]
