"""`make new-stage NAME=my-stage KIND=data|training [SUMMARY="..."]`: a new pipeline stage that `make test`'s layout
and pipeline tests accept as generated, so the work left is the stage's own logic.

It writes the stage's package (components/klear/my_stage/: config.py with a StageConfig and its `preset_package`,
presets/paper.yaml and presets/tiny.yaml, stage.py on its kind's skeleton, component.py with
`install_kfp_package=False` and an `Args:` line per input; a training stage also report.py), its tests folder with
a first test of the real command (tests/my_stage/), and inserts the lines every other place needs, each where the
tests look for it:

    components/klear/cli.py         COMMANDS and STAGES (the registry every test derives its lists from)
    tests/layout/test_imports.py    ALLOWED: what the package may import ({"common"}; training: and "training")
    tests/common/test_markdown.py   HOSTILE_INPUTS (data): its report shows a hostile input file name as text
    components/klear/common/lineage.py   KEY_SETTINGS: the config keys `klear lineage` shows first
    pipelines/definitions.py        its `klear-my-stage` pipeline (a `cached_stage` task; training: launched by
                                    `_launches_training` on gpus_per_node and nodes) and its PIPELINES entry
    README.md, docs/deploy.md       its row in the stage table (training: and its model input in the table of a
                                    model's names), its rerun pipeline
    docker/cpu.Dockerfile or docker/gpu.Dockerfile   its name in its image's header

A bad or taken name is refused before anything is written. The templates (pipelines/stage_templates.py) do real
work to replace: a data stage copies its input's records; a training stage trains a causal LM on a text field.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from pipelines.stage_templates import KINDS, Kind, Names, ScaffoldError

ROOT = Path(__file__).resolve().parents[1]
# --------------------------------------------------------------------------- registry lines (pure text edits)


def _block_end(text: str, opening: str, where: str) -> int:
    """The offset of the line `}` closing the block that starts at the line `opening`."""
    start = text.find(opening)
    if start < 0:
        raise ScaffoldError(f"{where}: no line starting {opening.strip()!r} (where the stage's line goes)")
    end = text.find("\n}\n", start)
    if end < 0:
        raise ScaffoldError(f"{where}: the block {opening.strip()!r} has no closing '}}' line")
    return end + 1


def insert_in_block(text: str, opening: str, line: str, where: str) -> str:
    """`line` as the last entry of the dict literal that starts at `opening`."""
    end = _block_end(text, opening, where)
    return text[:end] + line + "\n" + text[end:]


def insert_imports(text: str, lines: list[str]) -> str:
    """`lines` (`from klear.x import y`) among the module's `from klear.` imports, in isort's order."""
    existing = [m for m in re.finditer(r"^from klear\.(\S+) import (.+)$", text, re.MULTILINE)]
    if not existing:
        raise ScaffoldError("pipelines/definitions.py: no `from klear.` import to put the component's beside")
    module = re.match(r"from klear\.(\S+) import", lines[0])
    assert module
    after = [m for m in existing if m.group(1) > module.group(1)]
    at = after[0].start() if after else existing[-1].end() + 1
    return text[:at] + "".join(f"{line}\n" for line in lines) + text[at:]


def register_command(cli: str, names: Names, image: str) -> str:
    cli = insert_in_block(cli, "COMMANDS = {", f'    "{names.command}": "klear.{names.package}.stage",', "cli.py COMMANDS")
    return insert_in_block(cli, "STAGES: dict[str, Stage] = {",
                           f'    "{names.command}": Stage("{image}", ("{names.pipeline}",)),', "cli.py STAGES")


def register_layer(imports: str, names: Names, kind: Kind) -> str:
    return insert_in_block(imports, "ALLOWED: dict[str, set[str]] = {", f'    "{names.package}": {kind.layers},',
                           "tests/layout/test_imports.py ALLOWED")


def register_hostile_input(markdown_test: str, names: Names) -> str:
    return insert_in_block(markdown_test, "HOSTILE_INPUTS: dict[str, Callable[[Path], list[str]]] = {",
                           f'    "{names.command}": _named_input("{names.command}"),',
                           "tests/common/test_markdown.py HOSTILE_INPUTS")


def register_key_settings(lineage: str, names: Names, kind: Kind) -> str:
    keys = "".join(f'"{key}", ' for key in kind.key_settings).rstrip(" ")
    return insert_in_block(lineage, "KEY_SETTINGS: dict[str, tuple[str, ...]] = {",
                           f'    "{names.command}": ({keys}),', "klear/common/lineage.py KEY_SETTINGS")


def register_pipeline(definitions: str, names: Names, summary: str, kind: Kind) -> str:
    definitions = insert_imports(definitions, [
        f"from klear.{names.package}.component import OVERRIDE_KEYS as {names.keys_alias}",
        f"from klear.{names.package}.component import {names.package}"])
    anchor = "\n\nPIPELINES = {"
    if anchor not in definitions:
        raise ScaffoldError("pipelines/definitions.py: no `PIPELINES = {` (where the stage's pipeline goes)")
    definitions = definitions.replace(anchor, "\n\n" + kind.pipeline(names, summary) + anchor, 1)
    return insert_in_block(definitions, "PIPELINES = {", f'    "{names.pipeline}": {names.package}_pipeline,',
                           "pipelines/definitions.py PIPELINES")


def register_readme(readme: str, names: Names, summary: str, stages: list[str]) -> str:
    """The stage's row after the last registered stage's row of README's stage table."""
    rows = [m for m in re.finditer(r"^\| `([a-z0-9-]+)` \|.*$", readme, re.MULTILINE) if m.group(1) in stages]
    if not rows:
        raise ScaffoldError("README.md: no stage table (rows `| `stage` | ... |`) to add the stage's row to")
    at = rows[-1].end() + 1
    return readme[:at] + f"| `{names.command}` | {summary} |\n" + readme[at:]


def register_model_input(readme: str, names: Names, kind: Kind) -> str:
    """The component's model input in README's table of a model's names (the row of the model training starts
    from): its command's flag, its component input, its pipeline's parameter."""
    row = re.search(r"^\| the model training starts from \|.*\|$", readme, re.MULTILINE)
    if row is None:
        raise ScaffoldError("README.md: no row `| the model training starts from | ...` in the table of a model's names")
    cells = row.group(0).split("|")
    if len(cells) != 6:
        raise ScaffoldError("README.md: the row `| the model training starts from |` has not four columns")
    cells[2:5] = [f"{cells[2].rstrip()}, `{names.command} --model` ", f"{cells[3].rstrip()}, {names.package.replace('_', '-')} "
                  f"`{kind.model_input}` ", f"{cells[4].rstrip()}, `base_model_uri` ({names.pipeline}) "]
    return readme[:row.start()] + "|".join(cells) + readme[row.end():]


def register_deploy(deploy: str, names: Names, kind: Kind) -> str:
    """Its rerun pipeline in docs/deploy.md's list of single-stage pipelines, before the list's last entry."""
    entries = list(re.finditer(r"^- `klear-[a-z0-9-]+`.*$", deploy, re.MULTILINE))
    if not entries:
        raise ScaffoldError("docs/deploy.md: no list of `klear-<stage>` pipelines (\"Rerun one stage\")")
    at = entries[-1].start()
    return deploy[:at] + f"- `{names.pipeline}`: {kind.rerun_arguments};\n" + deploy[at:]


def register_image(dockerfile: str, names: Names, image: str) -> str:
    header = f"# Image of the {image.upper()} stages: "
    if header not in dockerfile:
        raise ScaffoldError(f"docker/{image}.Dockerfile: its header has no {header.strip()!r} list")
    return dockerfile.replace(header, f"{header}{names.command}, ", 1)


# --------------------------------------------------------------------------- writing


def check_free(root: Path, names: Names) -> None:
    """Refuse a name a command, package, test folder or pipeline already has."""
    cli = (root / "components" / "klear" / "cli.py").read_text()
    if re.search(rf'^    "{re.escape(names.command)}":', cli, re.MULTILINE):
        raise ScaffoldError(f"{names.command}: already a command in components/klear/cli.py")
    for taken in (root / "components" / "klear" / names.package, root / "tests" / names.package):
        if taken.exists():
            raise ScaffoldError(f"{names.command}: {taken.relative_to(root)} exists already")
    if f'"{names.pipeline}"' in (root / "pipelines" / "definitions.py").read_text():
        raise ScaffoldError(f"{names.command}: pipelines/definitions.py has a {names.pipeline} already")


def add_stage(root: Path, command: str, kind: str = "data", summary: str = "") -> list[Path]:
    """Write the stage's files and registry lines under `root`; the paths written or edited."""
    if kind not in KINDS:
        raise ScaffoldError(f"KIND={kind}: the scaffold makes {' or '.join(KINDS)} stages")
    of_kind = KINDS[kind]
    names = Names.of(command)
    check_free(root, names)
    summary = summary.strip().rstrip(".") or f"{command}: a new {kind} stage"
    stages = re.findall(r'^    "([a-z0-9-]+)": Stage\(', (root / "components/klear/cli.py").read_text(), re.MULTILINE)
    image = of_kind.image
    edits: dict[str, Callable[[str], str]] = {
        "components/klear/cli.py": lambda text: register_command(text, names, image),
        "tests/layout/test_imports.py": lambda text: register_layer(text, names, of_kind),
        "components/klear/common/lineage.py": lambda text: register_key_settings(text, names, of_kind),
        "pipelines/definitions.py": lambda text: register_pipeline(text, names, summary, of_kind),
        "README.md": lambda text: register_readme(text, names, summary, stages),
        "docs/deploy.md": lambda text: register_deploy(text, names, of_kind),
        f"docker/{image}.Dockerfile": lambda text: register_image(text, names, image),
    }
    if of_kind.hostile_input:
        edits["tests/common/test_markdown.py"] = lambda text: register_hostile_input(text, names)
    if of_kind.model_input:
        readme_row = edits["README.md"]
        edits["README.md"] = lambda text: register_model_input(readme_row(text), names, of_kind)
    # Every edit is computed before anything is written: a repository the scaffold cannot read is left as it was.
    missing = [path for path in edits if not (root / path).is_file()]
    if missing:
        raise ScaffoldError(f"{root} is not a checkout of this repository: {missing} not found")
    edited = {path: edit((root / path).read_text()) for path, edit in edits.items()}
    written = []
    for path, text in {**of_kind.files(names, summary), **edited}.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make new-stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the stage's command, e.g. word-count")
    parser.add_argument("--kind", default="data", choices=list(KINDS),
                        help="data (a CPU stage on DataStage) or training (a GPU stage on TrainingStage)")
    parser.add_argument("--summary", default="", help="one line: what the stage does (README's stage table)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this checkout)")
    args = parser.parse_args(argv)
    try:
        written = add_stage(args.root, args.name, args.kind, args.summary)
    except ScaffoldError as exc:
        print(f"make new-stage: error: {exc}", file=sys.stderr)
        return 2
    names = Names.of(args.name)
    print("\n".join(str(path.relative_to(args.root)) for path in written))
    print(f"\nNext: the stage's work in components/klear/{names.package}/stage.py (and its test), its section under "
          f"README \"Running a stage\"; to run it in the recipe, a `cached_stage({names.package}, ...)` task in "
          "klear_pipeline (pipelines/definitions.py).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
