"""The chart's Katib Experiment (katib.enabled): none by default; enabled, one that Katib's schema and webhook accept,
whose trials run the pipelines' own gppo command on one node with the searched value as a config override the gppo
config takes, and whose objective is a name the stage's metric lines carry."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from klear.common import tracking
from klear.gppo.config import GppoConfig
from klear.gppo.stage import STAGE
from klear.training.launch import accelerate_command
from klear.training.trainjob import OPTIONAL_S3_KEYS, S3_KEYS
from tests.deploy import katib
from tests.deploy.helpers import CHART, CREDENTIALS, KATIB_SCHEMA_FILE, NAMESPACE, RELEASE, find, merge, render, validation_errors

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

MODEL, DATA, OUTPUT = "s3://klear/runs/r1/sft", ["s3://klear/rl/math.parquet"], "s3://klear/katib/eps-high/"
VAL_DATA = ["s3://klear/bench/aime24.jsonl", "s3://klear/bench/aime25.jsonl"]
TRIAL: dict[str, Any] = {"model": MODEL, "data": DATA, "valData": VAL_DATA, "output": OUTPUT,
                         "overrides": ["max_steps=64", "val_every=16", "run_name=eps_high's trial"]}
ENABLED = merge(CREDENTIALS, {"katib": {"enabled": True, "trial": TRIAL}})
TRIAL_NAME = "klear-gppo-search-x7k2p9qd"  # as Katib names trials: <experiment>-<random>


@pytest.fixture(scope="module")
def experiment() -> dict[str, Any]:
    return find(render(ENABLED), "Experiment")


def _values() -> dict[str, Any]:
    import yaml

    return yaml.safe_load((CHART / "values.yaml").read_text())["katib"]


def _primary(run: dict[str, Any], experiment: dict[str, Any]) -> dict[str, Any]:
    containers = run["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == experiment["spec"]["trialTemplate"]["primaryContainerName"])


def test_no_experiment_unless_enabled() -> None:
    assert not [o for o in render(CREDENTIALS) if o["kind"] == "Experiment"]
    assert _values()["enabled"] is False


def test_enabled_chart_lints_clean() -> None:
    report = helm.lint(CHART, ENABLED, strict=True, namespace=NAMESPACE, kube_version="v1.31.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]


def test_experiment_passes_katib_schema_and_webhook(experiment: dict[str, Any]) -> None:
    # The CRD's own schema takes anything: the spec is checked against Katib's generated types, closed.
    vendored = json.loads(KATIB_SCHEMA_FILE.read_text())
    assert vendored["crdOpenAPIV3Schema"].get("x-kubernetes-preserve-unknown-fields") is True
    assert validation_errors(experiment) == []
    assert katib.webhook_errors(experiment) == []
    assert experiment["metadata"]["name"] == f"{RELEASE}-gppo-search"


def test_broken_experiments_are_caught(experiment: dict[str, Any]) -> None:
    misspelt = copy.deepcopy(experiment)
    misspelt["spec"]["objective"]["objectiveMetric"] = misspelt["spec"]["objective"].pop("objectiveMetricName")
    misspelt["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    errors = "\n".join(validation_errors(misspelt))
    assert "objectiveMetric" in errors and "volumeMount" in errors, errors
    orphan = copy.deepcopy(experiment)
    orphan["spec"]["trialTemplate"]["trialParameters"][0]["name"] = "eps_hi"
    orphan["spec"]["algorithm"]["algorithmName"] = "hyperopt"
    errors = "\n".join(katib.webhook_errors(orphan))
    assert "'eps_hi' is not in the trialSpec" in errors and "hyperopt" in errors, errors


def test_objective_is_a_figure_the_stage_logs(experiment: dict[str, Any]) -> None:
    objective = experiment["spec"]["objective"]
    assert objective["objectiveMetricName"] == tracking.katib_name("val/pass@1")
    logged = {tracking.katib_name(name) for name in [*tracking.SCHEME.values(), *tracking.PROGRESS_FIGURES]}
    assert set(objective["additionalMetricNames"]) <= logged
    assert objective["metricStrategies"] == [{"name": objective["objectiveMetricName"], "value": "latest"}]
    assert experiment["spec"]["metricsCollectorSpec"] == {"collector": {"kind": "StdOut"}}  # Katib's default filter


def test_trial_runs_the_pipelines_gppo_command(experiment: dict[str, Any], tmp_path: Path) -> None:
    run = katib.trial_run_spec(experiment, TRIAL_NAME, NAMESPACE, {"eps-high": "0.31"})
    assert validation_errors(run) == []  # Kubernetes' strict Job schema
    # The command as Katib's pod webhook wraps it, run by bash with printf in place of the program: the words bash
    # passes, the log in the metrics file and the completion marker Katib's collector waits for.
    metrics = tmp_path / "metrics.log"
    *shell, line = katib.wrapped_command(_primary(run, experiment), str(metrics))
    assert shell == ["bash", "-c"] and line.startswith("python ")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([*shell, "printf '%s\\0' " + line], check=True, cwd=tmp_path, env=env, timeout=60)
    argv = metrics.read_text().split("\0")[:-1]
    assert [p.read_text() for p in tmp_path.glob("*.pid")] == ["completed\n"]

    overrides = [argv[i + 1] for i, word in enumerate(argv) if word == "--set"]
    output = f"{OUTPUT.rstrip('/')}/{TRIAL_NAME}"
    assert argv == accelerate_command(STAGE, MODEL, DATA, output, "math", overrides, 8, python="python")
    # The searched value reaches the gppo config as an override it accepts, after the fixed ones.
    config = STAGE.config("math", overrides)
    assert isinstance(config, GppoConfig) and config.eps_high == 0.31
    assert config.val_data == VAL_DATA and config.max_steps == 64 and config.run_name == "eps_high's trial"
    assert overrides[-1] == "eps_high=0.31"


def test_search_space_is_valid_for_gppo(experiment: dict[str, Any]) -> None:
    (parameter,) = experiment["spec"]["parameters"]
    space = parameter["feasibleSpace"]
    for bound in (space["min"], space["max"]):
        assert STAGE.config("math", [f"eps_high={bound}"]).eps_high == float(bound)
    with pytest.raises(ValueError, match="eps_high"):  # what a search space below GPPO's range would meet
        STAGE.config("math", ["eps_high=-0.1"])


def test_trial_pod_reads_the_stage_secrets(experiment: dict[str, Any]) -> None:
    run = katib.trial_run_spec(experiment, TRIAL_NAME, NAMESPACE, {"eps-high": "0.3"})
    pod = run["spec"]["template"]
    container = _primary(run, experiment)
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert list(refs) == [*S3_KEYS, *OPTIONAL_S3_KEYS, *tracking.TRACKING_SECRET_KEYS]
    assert {k: (r["name"], r.get("optional", False)) for k, r in refs.items()} == {
        **{k: ("klear-s3", False) for k in S3_KEYS}, **{k: ("klear-s3", True) for k in OPTIONAL_S3_KEYS},
        **{k: (tracking.TRACKING_SECRET, True) for k in tracking.TRACKING_SECRET_KEYS}}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8" == container["resources"]["requests"]["nvidia.com/gpu"]
    assert pod["metadata"]["labels"] == {"klear.io/runs-untrusted-code": "true"}  # the chart's NetworkPolicy
    assert container["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize(("bad", "message"), [
    ({"trial": {**TRIAL, "model": ""}}, "katib.trial.model is required"),
    ({"trial": {**TRIAL, "valData": []}}, "katib.trial.valData is required"),
    ({"algorithm": "hyperopt"}, "algorithm"),
    ({"objective": {"metric": "val/pass@1", "type": "maximize", "strategy": "latest"}}, "metric"),
    ({"name": "a-name-longer-than-katib-allows-for-experiments"}, "name"),
    ({"parameters": [{"key": "eps_high", "type": "double", "max": "0.4"}]}, "min is required"),
])
def test_values_are_checked(bad: dict[str, Any], message: str) -> None:
    values = merge(ENABLED, {"katib": bad})
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_schema_offers_katib_algorithms_only() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    offered = schema["properties"]["katib"]["properties"]["algorithm"]["enum"]
    assert _values()["algorithm"] in offered and set(offered) <= set(katib.ALGORITHMS)
