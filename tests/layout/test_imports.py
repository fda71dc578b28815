"""The package's layers, checked from the source so they stay true as stages are added.

Dependencies point one way: every stage -> common; training stages -> training; stages that judge samples ->
verifiers and judge (never judge -> a stage that judges: the consumer hands the judge its settings and problems);
the `klear` command -> stages only through its registry of module names (no import); pipelines -> stage
components. What runs in the CPU image (TORCH_FREE, from the stage registry `klear.cli.STAGES`) is importable
without torch.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

from klear.cli import STAGES, stage_package

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "components" / "klear"

# Sub-package -> the sub-packages it may import. A new stage adds its line here, on purpose. An edge is one way: a
# package never lists one that lists it (test_layers_point_one_way), so a library stage (judge, sample) never
# imports a stage that uses it; such a stage hands the library what it needs instead (its config's section, its
# problems: see klear.judge.config.judge_config and evaluate's evaluation_problems step).
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "testsets": set(),
    "training": {"common"},
    "verifiers": {"common"},
    "curate": {"common", "testsets"},
    "sample": {"common"},
    "demo": {"common", "testsets"},
    "sft": {"common", "training"},
    # evaluate: validation during RL runs the evaluation's own protocol and judge on the policy.
    "gppo": {"common", "training", "verifiers", "evaluate"},
    # Knows no consumer: sft-data, rl-filter and evaluate hand a judge step their `judge` section (and evaluate its
    # problems) through their own components.
    "judge": {"common", "verifiers"},
    "sft_data": {"common", "judge"},
    # testsets: the shipped benchmarks are its default decontamination sets, as for curate.
    "rl_filter": {"common", "judge", "curate", "testsets"},
    # sample: `klear evaluate --model` samples first; testsets: the shipped math sets are its default benchmarks.
    # verifiers: the report states the judging rules the verifier settings give.
    "evaluate": {"common", "judge", "sample", "testsets", "verifiers"},
    # serve: the InferenceService of a published model, its copy and its deploy step; not a data stage.
    "serve": {"common"},
    "cli": {"common"},
    # register: reads published models and evaluations (manifests, cards, lineage) and writes to model registries.
    "register": {"common"},
    # plan: a tool that loads every stage's config (config modules only) and checks them together; torch-free.
    # training: the attention implementation the GPU image resolves (hf_model.resolve_attention; torch imported
    # only inside its functions).
    "plan": {"common", "cli", "curate", "sample", "judge", "sft_data", "sft", "rl_filter", "gppo", "evaluate",
             "training"},
}
# Packages that only exist in the training (GPU) image.
TRAINING_ONLY = ("torch", "transformers", "trl", "deepspeed", "accelerate", "vllm")
# What the CPU image imports: the base, the verifiers, the command, every stage registered on the CPU image, sample
# (importable alone: evaluate imports it, and its endpoint backend needs no torch) and serve (its copy and deploy step).
TORCH_FREE = tuple(sorted({"common", "verifiers", "cli", "sample", "plan", "serve"}
                          | {stage_package(command) for command, stage in STAGES.items() if stage.image == "cpu"}))


def _klear_imports(path: Path) -> set[str]:
    """Absolute `klear.*` module names imported anywhere in the file (module level or inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module == "klear":  # `from klear import testsets`
                found.update(f"klear.{alias.name}" for alias in node.names)
    return {name for name in found if name == "klear" or name.startswith("klear.")}


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _owner(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_every_subpackage_has_declared_dependencies() -> None:
    # Folders too: a new stage's package is declared before its first module lands.
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    owners = ({_owner(p) for p in _modules()} | folders) - {"__init__"}
    assert owners <= set(ALLOWED), f"declare the layer of {sorted(owners - set(ALLOWED))} in ALLOWED"


def layer_violations(owner: str, imported: set[str], allowed: dict[str, set[str]]) -> list[str]:
    """Why each `klear.*` module `owner` imports is against the layers (a sub-package `owner` may not import)."""
    wrong = []
    for module in sorted(imported):
        target = _subpackage(module)
        if target is not None and target != owner and target not in allowed[owner]:
            wrong.append(f"{owner} imports {module}")
    return wrong


_HOW_TO_FIX = ("\nA package imports only what its ALLOWED line in tests/layout/test_imports.py lists. Do not add a "
               "stage that uses this package to its line (the layers point one way): have that stage hand over what "
               "is needed (a config section, a problems file, a callable) as an argument or a step's output.")


def test_imports_point_one_way() -> None:
    wrong = []
    for path in _modules():
        owner = _owner(path)
        if owner == "__init__":
            continue
        wrong += [f"{path.relative_to(ROOT)}: {why}" for why in layer_violations(owner, _klear_imports(path), ALLOWED)]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong) + _HOW_TO_FIX


def layer_cycle(allowed: dict[str, set[str]]) -> list[str]:
    """A cycle of packages allowed to import each other in turn ([] = none): the layers must form a DAG."""
    try:
        graphlib.TopologicalSorter(allowed).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_layers_point_one_way() -> None:
    """No packages may import each other, directly or in a ring: the edge a new reach-up would need is refused
    here too, so it cannot be slipped in by adding the consumer to the library's ALLOWED line."""
    cycle = layer_cycle(ALLOWED)
    assert not cycle, "packages allowed to import each other in turn: " + " -> ".join(cycle) + _HOW_TO_FIX


def test_a_new_reach_up_is_reported(tmp_path: Path) -> None:
    """A judge module importing a stage that uses the judge (its config, at module level or inside a function)
    fails the check, naming the module; one importing only its own layers passes."""
    module = tmp_path / "stage.py"
    module.write_text("from klear.common import storage\nfrom klear.judge.io import fingerprint\n"
                      "def config_of():\n    from klear.sft_data.config import SftDataConfig\n"
                      "    import klear.evaluate.benchmarks\n")
    assert layer_violations("judge", _klear_imports(module), ALLOWED) == [
        "judge imports klear.evaluate.benchmarks", "judge imports klear.sft_data.config"]
    module.write_text("from klear.common import storage\nfrom klear.verifiers import math_verifier\n")
    assert layer_violations("judge", _klear_imports(module), ALLOWED) == []
    # Allowing it back would make judge and sft_data import each other: the one-way check refuses that.
    assert set(layer_cycle({**ALLOWED, "judge": ALLOWED["judge"] | {"sft_data"}})) == {"judge", "sft_data"}
    assert {"common", "evaluate"} <= set(layer_cycle({**ALLOWED, "common": {"evaluate"}}))  # a ring through them


def test_nothing_in_the_package_imports_pipelines() -> None:
    offenders = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "pipelines" or n.startswith("pipelines.") for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_pipeline_definitions_use_stage_components_and_common_only() -> None:
    """The DAGs wire components; runners (run_local, demo) may call stages' code directly."""
    wrong = []
    for path in (ROOT / "pipelines" / "definitions.py", ROOT / "pipelines" / "compile.py"):
        for module in _klear_imports(path):
            parts = module.split(".")
            if parts[1:2] == ["common"] or parts[-1] == "component":
                continue
            wrong.append(f"{path.name}: {module}")
    assert not wrong, wrong


def test_no_two_classes_share_a_name() -> None:
    """One name per thing: `except X` and a test's `pytest.raises(X)` mean one class wherever X is imported from."""
    defined: dict[str, list[str]] = {}
    for path in _modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in defined.items() if len(paths) > 1} == {}


# Re-exports of the sample-row contract's names while it moves to klear.common (issue 22, item 2).
MOVING = {("judge/io.py", "SampleInputError"), ("sample/reasoning.py", "Parsed"), ("sample/reasoning.py", "render"),
          ("sample/reasoning.py", "from_text")}


def test_a_package_exports_only_its_own_names() -> None:
    """One import path per name: a sub-package's `__all__` does not pass on another package's function (say, a
    `klear.common` helper through `klear.judge`), which is then imported two ways."""
    defined: dict[str, set[str]] = {}  # sub-package -> names defined at module level in it
    exported: list[tuple[Path, str]] = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        names = defined.setdefault(_owner(path), set())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                    exported += [(path, e.value) for e in ast.walk(node.value) if isinstance(e, ast.Constant)]
    foreign = [f"{path.relative_to(ROOT)}: {name}" for path, name in exported
               if name not in defined[_owner(path)] and (path.relative_to(PACKAGE).as_posix(), name) not in MOVING]
    assert not foreign, "exported but defined in another package (import it from there):\n" + "\n".join(foreign)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The parser must catch both import forms, or the layering test passes vacuously."""
    sample = tmp_path / "m.py"
    sample.write_text("import klear.sft.stage\ndef f():\n    from klear import gppo\n    from klear.cli import main\n")
    assert _klear_imports(sample) == {"klear.sft.stage", "klear", "klear.gppo", "klear.cli"}


_BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not available in the CPU image")
        return None
sys.meta_path.insert(0, Block())
import importlib, pkgutil, klear
failed = []
for sub in {subpackages!r}:
    names = [f"klear.{{sub}}"]
    pkg = importlib.import_module(f"klear.{{sub}}")
    if hasattr(pkg, "__path__"):
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, f"klear.{{sub}}.")]
    for name in names:
        if name.endswith(".component") or name.split(".")[-1].startswith("_"):
            continue  # KFP wrappers need kfp; worker entry points run as scripts
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failed.append(f"{{name}}: {{exc}}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.parametrize("subpackage", TORCH_FREE)
def test_cpu_image_modules_import_without_torch(subpackage: str) -> None:
    code = _BLOCKER.format(blocked=set(TRAINING_ONLY), subpackages=[subpackage])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
