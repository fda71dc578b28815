"""`make new-stage` (pipelines/new_stage.py): a generated stage passes the layout and pipeline tests as generated,
and a bad or taken name is refused before anything is written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.new_stage import Names, ScaffoldError, add_stage, insert_in_block, register_image

ROOT = Path(__file__).resolve().parents[2]
# What a generated stage must pass as generated (the wheel builds of test_stages are left out: seconds each, and the
# stage's presets are plain files under the "*" glob they check), by kind: (name, package, its own checks).
SHARED_CHECKS = ["tests/layout/test_stages.py", "-k", "not wheel and not per_package_list",
                 "tests/layout/test_imports.py::test_every_subpackage_has_declared_dependencies",
                 "tests/layout/test_imports.py::test_imports_point_one_way",
                 "tests/pipelines/test_pipelines.py::test_the_pipelines_are_the_registrys",
                 "tests/pipelines/test_pipelines.py::test_every_pipeline_compiles_and_loads_back",
                 "tests/pipelines/test_pipelines.py::test_cached_tasks_key_on_the_content_of_what_they_read",
                 "tests/pipelines/test_pipelines.py::test_every_stage_task_takes_overrides_from_a_run_time_parameter",
                 "tests/pipelines/test_run_form.py::test_every_input_of_every_component_and_pipeline_is_described",
                 "tests/pipelines/test_run_form.py::test_every_override_parameter_lists_keys"]
KIND_CHECKS = {
    "data": ("word-count", "word_count", [
        "tests/common/test_markdown.py::test_every_data_stage_report_shows_hostile_text_as_text[word-count]",
        "tests/layout/test_imports.py::test_cpu_image_modules_import_without_torch[word_count]"]),
    # Its first test trains the tiny model on CPU through the real command; the README test checks its model input.
    "training": ("text-tune", "text_tune", [
        "tests/common/test_markdown.py::test_every_training_report_escapes_its_values[text-tune]",
        "tests/layout/test_stages.py::test_readme_names_every_model_input_of_a_component"]),
}


def _copy_of_the_repository(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "runs", "*.egg-info"))
    return copy


@pytest.mark.parametrize(("name", "message"), [
    ("Word_Count", "lower-case words joined by '-'"), ("word--count", "lower-case"), ("2words", "lower-case"),
    ("import", "a Python keyword"),
])
def test_a_bad_name_is_refused(name: str, message: str) -> None:
    with pytest.raises(ScaffoldError, match=message):
        Names.of(name)


def test_names_of_a_stage() -> None:
    assert Names.of("word-count") == Names("word-count", "word_count", "WordCountConfig", "WORD_COUNT_KEYS",
                                           "klear-word-count")


def test_a_taken_name_or_unknown_kind_is_refused_and_nothing_written(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    for part in ("components/klear/cli.py", "pipelines/definitions.py"):
        (copy / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / part, copy / part)
    before = {path: path.read_bytes() for path in copy.rglob("*.py")}
    with pytest.raises(ScaffoldError, match="sft-data: already a command in components/klear/cli.py"):
        add_stage(copy, "sft-data")
    with pytest.raises(ScaffoldError, match=r"not a checkout .*'README.md'"):  # found before anything is written
        add_stage(copy, "word-count")
    assert {path: path.read_bytes() for path in copy.rglob("*.py")} == before
    (copy / "tests" / "word_count").mkdir(parents=True)
    with pytest.raises(ScaffoldError, match="tests/word_count exists already"):
        add_stage(copy, "word-count")
    with pytest.raises(ScaffoldError, match="KIND=serving: the scaffold makes data or training stages"):
        add_stage(copy, "my-server", "serving")
    assert not (copy / "components" / "klear" / "word_count").exists()


def test_a_registry_edit_names_the_place_it_cannot_find() -> None:
    assert insert_in_block('X = {\n    "a": 1,\n}\n', "X = {", '    "b": 2,', "f") == 'X = {\n    "a": 1,\n    "b": 2,\n}\n'
    with pytest.raises(ScaffoldError, match=r"cli.py STAGES: no line starting 'STAGES = \{'"):
        insert_in_block("COMMANDS = {\n}\n", "STAGES = {", "x", "cli.py STAGES")
    with pytest.raises(ScaffoldError, match="docker/gpu.Dockerfile: its header has no"):
        register_image("# syntax=docker/dockerfile:1\n# An image.\n", Names.of("word-count"), "gpu")


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KIND_CHECKS))
def test_a_generated_stage_passes_the_layout_and_pipeline_tests(tmp_path: Path, kind: str) -> None:
    """The real generator into a copy of the repository, then the tests it must pass there, its own first test
    included, and the linter over what it wrote."""
    name, package, own_checks = KIND_CHECKS[kind]
    copy = _copy_of_the_repository(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{copy / 'components'}{os.pathsep}{copy}"}
    made = subprocess.run([sys.executable, "-m", "pipelines.new_stage", name, "--kind", kind, "--root", str(copy),
                           "--summary", f"a generated {kind} stage"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert (copy / f"components/klear/{package}/component.py").is_file() and "Next:" in made.stdout
    again = subprocess.run([sys.executable, "-m", "pipelines.new_stage", name, "--root", str(copy)], cwd=copy,
                           env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already a command" in again.stderr, again.stderr
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "components", "pipelines", f"tests/{package}",
                           "tests/layout"], cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    checks = [f"tests/{package}", *SHARED_CHECKS, *own_checks]
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rA", "-p", "no:cacheprovider", *checks],
                           cwd=copy, env=env, capture_output=True, text=True, timeout=900)
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    passed = {line.split()[1] for line in tests.stdout.splitlines() if line.startswith("PASSED ")}
    assert any(test.startswith(f"tests/{package}/") for test in passed), tests.stdout[-3000:]  # its own first test
    assert set(own_checks) <= passed, tests.stdout[-3000:]
