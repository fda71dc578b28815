"""Reading the released code (Kwai-Klear/KlearReasoner) at a commit, to run its own functions for the vectors.

The release is a fork of verl with its heavy imports (ray, flash-attn, vLLM); the generators take only the
functions they need: `functions` compiles chosen top-level definitions of one file, `package` writes chosen files
as an importable package with empty `__init__`s. Both read a git directory (`fetch github:Kwai-Klear/KlearReasoner`
gives one), never a work tree, so the commit is always the one named in the vectors' provenance.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = "Kwai-Klear/KlearReasoner"
HEAD = "3422f6d36a8251cb1c86a7b943c7c815850864fd"  # the fetched snapshot's newest commit (2025-08 README updates)
# core_algos.compute_gppo_loss: "fix dual clip bug" (2025-08-13) made clip_ratio_c apply; before it, -Ã (c = 1).
DUAL_CLIP_FIXED = "e0f7bb1"
DUAL_CLIP_UNFIXED = "6dc5bb9"


def full_sha(git_dir: Path, commit: str) -> str:
    return subprocess.run(["git", "-C", str(git_dir), "rev-parse", commit], capture_output=True, text=True,
                          check=True).stdout.strip()


def source(git_dir: Path, commit: str, path: str) -> str:
    """The text of `path` at `commit`."""
    return subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def functions(git_dir: Path, commit: str, path: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The top-level functions `names` of `path` at `commit`, compiled into `namespace` (which supplies their
    imports); a name the file does not define raises KeyError."""
    tree = ast.parse(source(git_dir, commit, path))
    chosen = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names}
    missing = [n for n in names if n not in chosen]
    if missing:
        raise KeyError(f"{path}@{commit} defines no {', '.join(missing)}")
    module = ast.Module(body=[chosen[n] for n in names], type_ignores=[])
    exec(compile(module, f"{REPO}/{path}@{commit}", "exec"), namespace)  # noqa: S102 - the release's own code
    return {n: namespace[n] for n in names}


def package(git_dir: Path, commit: str, paths: list[str], into: Path) -> None:
    """Write `paths` at `commit` under `into`, each folder a package with an empty `__init__.py`, and put `into`
    first on sys.path: `import verl.utils.reward_score.math_dapo` then runs the release's module alone."""
    for path in paths:
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source(git_dir, commit, path))
        folder = target.parent
        while folder != into:
            (folder / "__init__.py").touch()
            folder = folder.parent
    if str(into) not in sys.path:
        sys.path.insert(0, str(into))


def provenance(git_dir: Path, commit: str, path: str, function: str, **extra: Any) -> dict[str, Any]:
    return {"repo": REPO, "commit": full_sha(git_dir, commit), "file": path, "function": function, **extra}
