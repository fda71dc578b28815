"""Every place a stage must appear, checked against the one registry (`klear.cli.COMMANDS` and `STAGES`).

A new stage that forgets a place fails here, not at run time (an image without its presets fails only with
"unknown preset"). README "Adding a stage" lists the places; the import layers are in test_imports.py and the
compiled pipelines in tests/pipelines/test_pipelines.py.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from klear.cli import COMMANDS, RECIPE_PIPELINE, STAGES, stage_package
from klear.common.lineage import KEY_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "components" / "klear"
IMAGE_CONSTANT = {"cpu": "CPU_IMAGE", "gpu": "GPU_IMAGE"}


def _module_path(module: str) -> Path:
    return ROOT / "components" / Path(*module.split(".")).with_suffix(".py")


def _defines(path: Path, name: str) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == name for node in ast.parse(path.read_text()).body)


def _component_calls(path: Path) -> list[ast.Call]:
    """Every `@dsl.component(...)` of a module."""
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "component"]


def _component_images(path: Path) -> list[str]:
    """The `base_image=` constant of every `@dsl.component(...)` in a component module."""
    return [kw.value.id for call in _component_calls(path) for kw in call.keywords
            if kw.arg == "base_image" and isinstance(kw.value, ast.Name)]


def test_every_command_module_exists_and_registers_a_parser() -> None:
    missing = [f"{command}: {module}" for command, module in COMMANDS.items()
               if not _module_path(module).is_file() or not _defines(_module_path(module), "add_parser")]
    assert not missing, f"COMMANDS names modules that do not exist or define no add_parser: {missing}"


@pytest.mark.parametrize("command", sorted(STAGES))
def test_every_stage_is_a_command_with_a_component_and_presets(command: str) -> None:
    package = command.replace("-", "_")
    assert command in COMMANDS, (f'stage {command} is not in COMMANDS: add "{command}": "klear.{package}.stage" '
                                 "to components/klear/cli.py (make new-stage writes every line a stage needs)")
    folder = PACKAGE / stage_package(command)
    where = folder.relative_to(ROOT)
    assert COMMANDS[command] == f"klear.{folder.name}.stage", f"{command}: the entry point is klear.<stage>.stage"
    missing = [f"{where}/{name}" for name in ("__init__.py", "stage.py", "config.py", "component.py")
               if not (folder / name).is_file()]
    assert not missing, f"stage {command}: create {missing} (README \"Adding a stage\")"
    assert sorted((folder / "presets").glob("*.yaml")), f"{where}/presets/ holds no preset: add paper.yaml and tiny.yaml"
    images = _component_images(folder / "component.py")
    assert images, f"{folder}/component.py defines no @dsl.component with a base_image"
    expected = IMAGE_CONSTANT[STAGES[command].image]
    assert set(images) == {expected}, f"{folder}/component.py uses {images}; klear.cli.STAGES says {expected}"


def test_components_run_on_the_images_own_kfp() -> None:
    """The images carry kfp (pinned in their locks): a component that pip-installs it at start needs the network,
    which the chart's pods do not have, and may get another version."""
    wrong = [f"{path.relative_to(ROOT)}:{call.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
             for call in _component_calls(path)
             if not any(kw.arg == "install_kfp_package" and isinstance(kw.value, ast.Constant) and kw.value.value is False
                        for kw in call.keywords)]
    assert not wrong, f"add install_kfp_package=False to the @dsl.component(...) at {wrong}"


@pytest.mark.parametrize("command", sorted(STAGES))
def test_every_stage_has_its_tests_folder(command: str) -> None:
    folder = ROOT / "tests" / stage_package(command)
    assert sorted(folder.glob("test_*.py")), (f"stage {command}: no tests/{folder.name}/test_*.py; add the folder "
                                              "(with __init__.py) and a test of the real command")


@pytest.mark.parametrize("command", sorted(STAGES))
def test_every_stage_names_its_key_settings_for_the_lineage(command: str) -> None:
    """`klear lineage` shows each step's key settings first: config fields of the stage, from KEY_SETTINGS."""
    import importlib

    assert command in KEY_SETTINGS, (f'stage {command}: add "{command}": ("<config key>", ...) to KEY_SETTINGS in '
                                     "components/klear/common/lineage.py")
    package = stage_package(command)
    module = importlib.import_module(f"klear.{package}.config")  # not the stage module: sft's imports torch
    (config_class,) = [value for value in vars(module).values() if isinstance(value, type) and value.__module__ ==
                       module.__name__ and getattr(value, "preset_package", "") == f"klear.{package}"]
    unknown = [key for key in KEY_SETTINGS[command] if key not in config_class.model_fields]
    assert KEY_SETTINGS[command] and not unknown, (
        f"KEY_SETTINGS[{command!r}] in components/klear/common/lineage.py names {unknown or 'nothing'}: "
        f"name fields of {config_class.__name__}")


@pytest.mark.parametrize("image", sorted(IMAGE_CONSTANT))
def test_each_image_names_its_stages(image: str) -> None:
    """The Dockerfile's header says which stages the image runs; a new stage is added there too."""
    header = re.match(r"(?:#.*\n)+", (ROOT / "docker" / f"{image}.Dockerfile").read_text())
    assert header
    missing = [c for c, s in STAGES.items() if s.image == image and not re.search(rf"\b{c}\b", header.group())]
    assert not missing, f"docker/{image}.Dockerfile's header comment does not name {missing}: add them to its list of stages"


def test_readme_and_deploy_guide_name_every_stage() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "## Adding a stage" in readme
    missing = [c for c in STAGES if f"| `{c}` |" not in readme]
    assert not missing, f"README's stage table lacks {missing}: add a row `| `stage` | what it does |` for each"
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    pipelines = [RECIPE_PIPELINE, *(p for stage in STAGES.values() for p in stage.pipelines)]
    missing = [p for p in pipelines if f"`{p}`" not in deploy]
    assert not missing, f"docs/deploy.md does not describe {missing}: add each to the list under \"Rerun one stage\""


def test_readme_names_every_model_input_of_a_component() -> None:
    """The table of a model's names across layers stays whole: a component's new model input is added to it."""
    table = (ROOT / "README.md").read_text().split("**A model's name in each layer.**")[1].split("\n\n")[1]
    missing = []
    for path in PACKAGE.glob("*/component.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for arg in node.args.args:
                    if "Input[Model]" in ast.unparse(arg.annotation or ast.Constant(None)) and (
                            f"{path.parent.name.replace('_', '-')} `{arg.arg}`" not in table):
                        missing.append(f"{path.relative_to(ROOT)}: {node.name}({arg.arg})")
    assert not missing, f"README's table of model names lacks {missing}"


# --------------------------------------------------------------------------- presets in the built wheel


def _presets_in_wheel(tmp_path: Path, pyproject: str) -> set[str]:
    """Build the package's wheel from a copy of its sources under `pyproject`; the presets it ships."""
    source = tmp_path / "src"
    shutil.copytree(PACKAGE, source / "components" / "klear",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (source / "pyproject.toml").write_text(pyproject)
    wheels = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                             "--no-index", "-w", str(wheels), str(source)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if re.fullmatch(r"klear/.+/presets/[^/]+\.yaml", name)}


def _presets_in_tree() -> set[str]:
    return {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.glob("*/presets/*.yaml")}


def test_the_wheel_ships_every_preset(tmp_path: Path) -> None:
    """What the images install: every presets/*.yaml of every sub-package, a new stage's included."""
    shipped = _presets_in_wheel(tmp_path, (ROOT / "pyproject.toml").read_text())
    stage_presets = {p for p in _presets_in_tree() if p.split("/")[1] in {stage_package(c) for c in STAGES}}
    assert len(stage_presets) >= len(STAGES)
    assert _presets_in_tree() - shipped == set(), "presets missing from the wheel: check package-data in pyproject.toml"


def test_a_per_package_list_would_miss_a_new_stage(tmp_path: Path) -> None:
    """The check above sees a forgotten package: package-data listing every stage but sft-data ships none of its."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = sorted({p.split("/")[1] for p in _presets_in_tree()} - {"sft_data"})
    listed = "".join(f'"klear.{package}" = ["presets/*.yaml"]\n' for package in packages)
    pyproject, count = re.subn(r'^"\*" = \["presets/\*\.yaml"\]\n', listed, pyproject, flags=re.MULTILINE)
    assert count == 1, 'pyproject.toml ships presets with one glob key: "*" = ["presets/*.yaml"]'
    missing = _presets_in_tree() - _presets_in_wheel(tmp_path, pyproject)
    assert missing and {p.split("/")[1] for p in missing} == {"sft_data"}
