"""No process-wide state in klear.common's storage and config modules, and no import circle in klear.common: what a
manifest records is what its publisher was handed (klear.common.lineage), not what else the process read or loaded.

Read from the source (ast), not by importing: a registry is refused before any code could fill it."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

COMMON = Path(__file__).resolve().parents[2] / "components" / "klear" / "common"
STORAGE = COMMON / "storage"
# Modules that must hold no module-level mutable state: every module of the storage package, and the config loader.
STATELESS = sorted([*STORAGE.glob("*.py"), COMMON / "config.py"])
# Calls that make a mutable container (the last part of the called name: `collections.defaultdict` too). An
# immutable value is fine: a tuple, a frozenset, a MappingProxyType, a compiled pattern.
MUTABLE_CALLS = frozenset({"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "Counter", "deque",
                           "ChainMap", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "SimpleNamespace",
                           "local", "Queue", "SimpleQueue"})
MUTABLE_NODES = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
ALLOWED_NAMES = frozenset({"__all__"})  # the export list: read by tools, never filled at run time


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_mutable(value: ast.expr | None) -> bool:
    return isinstance(value, MUTABLE_NODES) or (isinstance(value, ast.Call) and _called_name(value) in MUTABLE_CALLS)


def module_state(source: str) -> list[str]:
    """`name (line N)` for each module-level binding of a mutable container in `source`, and for each `global`
    statement (a function rebinding module state); statements under a top-level `if`/`try`/`with` count too."""
    found: list[str] = []
    tree = ast.parse(source)
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, (ast.If, ast.Try, ast.With)):  # still module level
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(stmt for handler in getattr(node, "handlers", []) for stmt in handler.body)]
            continue
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets, value = [node.target], node.value
        else:
            continue
        names = [target.id for target in targets if isinstance(target, ast.Name)]
        if _is_mutable(value) and not set(names) <= ALLOWED_NAMES:
            found.append(f"{', '.join(names) or ast.unparse(targets[0])} (line {node.lineno})")
    found += [f"global {', '.join(node.names)} (line {node.lineno})" for node in ast.walk(tree)
              if isinstance(node, ast.Global)]
    return found


@pytest.mark.parametrize("path", STATELESS, ids=lambda path: str(path.relative_to(COMMON)))
def test_no_module_level_mutable_state(path: Path) -> None:
    found = module_state(path.read_text())
    assert not found, (f"{path.name} keeps process-wide mutable state: {'; '.join(found)}. Hand what a caller needs "
                       "to it as an argument or return value (a lineage, a config's provenance) instead")


def test_the_state_check_finds_registries_and_lets_constants_be() -> None:
    registries = ("_READS: dict[str, list[str]] = {}\n_SEEN = set()\nif True:\n    _BY = collections.defaultdict(list)\n"
                  "_CACHE = {k: 1 for k in 'ab'}\nKEYS = []\n_N = 0\ndef f():\n    global _N\n")
    assert sorted(entry.split(" (")[0] for entry in module_state(registries)) == ["KEYS", "_BY", "_CACHE", "_READS",
                                                                                  "_SEEN", "global _N"]
    constants = ("__all__ = ['a']\nLIMIT = 3\nNAMES = ('a', 'b')\nKINDS = frozenset({'x'})\n"
                 "TABLE = types.MappingProxyType({'a': 1})\n_PATTERN = re.compile('x')\nclass C:\n    seen = {}\n")
    assert module_state(constants) == []


def test_the_state_check_reads_the_storage_package() -> None:
    # A glob that matched nothing would leave the storage layer unchecked.
    assert {STORAGE / "__init__.py", STORAGE / "leases.py", STORAGE / "publish.py"} <= set(STATELESS)


def _module_of(path: Path) -> str:
    """The dotted name of a file of klear.common: its sub-packages' modules (klear.common.storage.leases) too."""
    parts = path.relative_to(COMMON).with_suffix("").parts
    return ".".join(("klear", "common", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def common_imports(path: Path, modules: set[str]) -> set[str]:
    """The klear.common modules `path` imports, anywhere in it (function-local imports too)."""
    here = _module_of(path)
    package = here if path.stem == "__init__" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from klear.common import storage`
    return {name for name in found if name in modules and name != here}


def test_klear_common_has_no_import_circle() -> None:
    paths = sorted(COMMON.rglob("*.py"))
    modules = {_module_of(path) for path in paths}
    graph = {_module_of(path): common_imports(path, modules) for path in paths}
    assert graph["klear.common.lineage"] >= {"klear.common.storage", "klear.common.config"}  # the graph is read
    assert "klear.common.storage.uri" in graph["klear.common.storage.files"]  # sub-packages' modules too
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"klear.common imports in a circle: {' -> '.join(exc.args[1])}")
    assert set(order) == modules
