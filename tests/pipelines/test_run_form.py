"""What the Kubeflow UI shows of the compiled pipelines: every input described, every override parameter listing the
keys it can set (from the config classes), loops and conditions by name, display names, the recipe's outputs; and
`klear <stage> --help-keys`, the same keys on the command line."""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

import pytest
import yaml

from klear.cli import STAGES
from klear.common.config import config_keys, document_overrides
from klear.evaluate.config import EvaluateConfig
from klear.gppo.config import GppoConfig
from klear.sample.config import SampleConfig
from pipelines import definitions as recipe_definitions
from pipelines.compile import compile_all
from tests.commands import klear

# Components KFP itself generates (a loop's, a condition's or an exit handler's body, an importer): their inputs are
# not ours to describe.
GENERATED = re.compile(r"^comp-(for-loop|condition|exit-handler|importer)(-\d+)?$")
KFP_NAMES = re.compile(r"^(for-loop|condition|exit-handler)-\d+$")


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("compiled")
    compile_all(out)
    return {path.stem: next(yaml.safe_load_all(path.read_text())) for path in sorted(out.glob("*.yaml"))}


def _inputs(definitions: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {**(definitions.get("parameters") or {}), **(definitions.get("artifacts") or {})}


def test_every_input_of_every_component_and_pipeline_is_described(specs: dict[str, dict[str, Any]]) -> None:
    undescribed, counted = [], 0
    for name, spec in specs.items():
        places = [(f"{name} (run form)", spec["root"].get("inputDefinitions", {}))]
        places += [(f"{name}: {comp}", c.get("inputDefinitions", {})) for comp, c in spec["components"].items()
                   if not GENERATED.match(comp)]
        for where, definitions in places:
            for key, value in _inputs(definitions).items():
                counted += 1
                if not value.get("description"):
                    undescribed.append(f"{where}: {key}")
    assert counted > 1000
    assert not undescribed, ("inputs without a description: add an `Args:` line for each to the docstring of its "
                             "component (components/klear/<stage>/component.py) or pipeline (pipelines/definitions.py):"
                             "\n" + "\n".join(undescribed))


@pytest.mark.parametrize(("pipeline", "parameter", "config"), [
    ("klear-reasoner", "gppo_math_overrides", GppoConfig), ("klear-reasoner", "gppo_code_overrides", GppoConfig),
    ("klear-reasoner", "teacher_overrides", SampleConfig), ("klear-reasoner", "evaluate_overrides", EvaluateConfig),
    ("klear-gppo-math", "overrides", GppoConfig), ("klear-evaluate", "sample_overrides", SampleConfig),
])
def test_override_parameters_list_their_keys_with_descriptions(specs: dict[str, dict[str, Any]], pipeline: str,
                                                               parameter: str, config: type) -> None:
    text = specs[pipeline]["root"]["inputDefinitions"]["parameters"][parameter]["description"]
    for key, description in config_keys(config):
        assert f"{key}: {description}" in text, key
    assert "eps_high: ε_h: upper clip bound" in text if config is GppoConfig else True


def test_every_override_parameter_lists_keys(specs: dict[str, dict[str, Any]]) -> None:
    bare = [f"{name}: {key}" for name, spec in specs.items()
            for key, value in spec["root"]["inputDefinitions"]["parameters"].items()
            if key.endswith("overrides") and "Keys: " not in value["description"]]
    assert not bare, ("override parameters that do not list their keys: decorate their pipeline with "
                      "@_run_form(overrides=<the component's OVERRIDE_KEYS>) in pipelines/definitions.py: "
                      + ", ".join(bare))


def test_shared_parameters_are_described_once() -> None:
    """A description the rerun pipelines share lives in SHARED_ARGS / POD_ARGS, not copied into their docstrings."""
    shared = {*recipe_definitions.SHARED_ARGS.values(), *(text for pod in recipe_definitions.POD_ARGS.values() for text in pod.values())}
    tree = ast.parse(inspect.getsource(recipe_definitions))
    copies = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.endswith("_pipeline"):
            for entry in re.split(r"\n\s{8}(?=[a-z_]+: )", ast.get_docstring(node, clean=False) or ""):
                name, _, text = entry.strip().partition(": ")
                if " ".join(text.split()) in shared:
                    copies.append(f"{node.name}: {name}")
    assert not copies, f"Args lines that repeat SHARED_ARGS/POD_ARGS word for word (delete them): {copies}"


def test_an_undescribed_parameter_is_refused_at_import() -> None:
    def rerun(samples_uri: str, run_root: str, plan_cluster: str = "") -> None:
        del samples_uri, run_root, plan_cluster

    rerun.__doc__ = "Rerun.\n\n    Args:\n        run_root: Where.\n    "
    with pytest.raises(TypeError, match="'samples_uri' in its Args: section"):
        recipe_definitions._run_form()(rerun)
    rerun.__doc__ = "Rerun.\n\n    Args:\n        samples_uri: The samples.\n    "
    described = recipe_definitions._run_form()(rerun).__doc__
    assert f"plan_cluster: {recipe_definitions.SHARED_ARGS['plan_cluster'][:40]}" in described
    assert "samples_uri: The samples." in described and "run_root: Object-storage root" in described


def test_loops_and_conditions_show_by_name(specs: dict[str, dict[str, Any]]) -> None:
    shown = [task["taskInfo"]["name"] for spec in specs.values()
             for dag in [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]
             for task in dag["tasks"].values()]
    assert [name for name in shown if KFP_NAMES.match(name)] == []
    assert "sample-slices-teacher" in shown and "judge-slices-reference" in shown and "evaluate-code" in shown


def test_pipelines_have_display_names_and_the_recipe_its_outputs(specs: dict[str, dict[str, Any]]) -> None:
    assert all(spec["pipelineInfo"].get("displayName") for spec in specs.values())
    outputs = specs["klear-reasoner"]["root"]["dag"]["outputs"]["artifacts"]
    assert {key: value["artifactSelectors"][0]["outputArtifactKey"] for key, value in outputs.items()} == {
        "model": "model", "report": "report"}


def test_document_overrides_names_a_missing_entry() -> None:
    doc = "Run.\n\n    Args:\n        overrides: config overrides.\n            More.\n        other: x.\n"
    assert document_overrides(doc, {"overrides": "a: b"}).split("\n")[5] == "            Keys: a: b"
    with pytest.raises(ValueError, match="no Args entry for 'missing'"):
        document_overrides(doc, {"missing": "a"})


# Every stage of the registry, and the tools that take a config.
@pytest.mark.parametrize("command", [*STAGES, "reward", "verify-code"])
def test_help_keys_lists_every_key_with_its_description(command: str) -> None:
    result = klear(command, "--help-keys")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(": " in line for line in lines), (
        f"klear {command} --help-keys: keys without a description (give each its pydantic.Field(description=...)): "
        f"{[line for line in lines if ': ' not in line]}")
    if command in ("gppo", "reward"):
        assert any(line.startswith("reward.budget_s: wall-clock budget of one rollout's reward") for line in lines)
