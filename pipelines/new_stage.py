"""`make new-stage NAME=my-stage KIND=data [SUMMARY="..."]`: a new pipeline stage that `make test`'s layout and
pipeline tests accept as generated, so the work left is the stage's own logic.

It writes the stage's package (components/klear/my_stage/: config.py with a StageConfig and its `preset_package`,
presets/paper.yaml and presets/tiny.yaml, stage.py on the `klear.common.data_stage.DataStage` skeleton, component.py
with `install_kfp_package=False` and an `Args:` line per input), its tests folder with a first test of the real
command (tests/my_stage/), and inserts the lines every other place needs, each where the tests look for it:

    components/klear/cli.py         COMMANDS and STAGES (the registry every test derives its lists from)
    tests/layout/test_imports.py    ALLOWED: what the package may import ({"common"})
    tests/common/test_markdown.py   HOSTILE_INPUTS: its report shows a hostile input file name as text
    components/klear/common/lineage.py   KEY_SETTINGS: the config keys `klear lineage` shows first
    pipelines/definitions.py        its `klear-my-stage` pipeline (a `cached_stage` task) and its PIPELINES entry
    README.md, docs/deploy.md, docker/cpu.Dockerfile   its row, its rerun pipeline, its image's header

A bad or taken name is refused before anything is written. The template stage copies its input's records to
records.jsonl: replace that with the stage's work. Training stages (TrainingStage, a GPU image, a launcher) are
not generated yet: KIND=training is refused with the steps to follow by hand (README "Adding a stage").
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
KINDS = ("data",)


class ScaffoldError(ValueError):
    """A name or repository the scaffold cannot add a stage to; the message says why and where."""


@dataclass(frozen=True)
class Names:
    command: str  # word-count: the `klear` subcommand, meta.stage, the STAGES key
    package: str  # word_count: klear.word_count, tests/word_count
    config_class: str  # WordCountConfig
    keys_alias: str  # WORD_COUNT_KEYS: its OVERRIDE_KEYS as imported by pipelines/definitions.py
    pipeline: str  # klear-word-count

    @classmethod
    def of(cls, command: str) -> Names:
        if not NAME.match(command):
            raise ScaffoldError(f"stage name {command!r}: lower-case words joined by '-', e.g. word-count")
        package = command.replace("-", "_")
        if keyword.iskeyword(package):
            raise ScaffoldError(f"stage name {command!r}: {package} is a Python keyword")
        camel = "".join(part.capitalize() for part in command.split("-"))
        return cls(command, package, f"{camel}Config", f"{package.upper()}_KEYS", f"klear-{command}")


# --------------------------------------------------------------------------- the stage's own files


def stage_files(names: Names, summary: str) -> dict[str, str]:
    """Path (from the repository root) -> text of every new file of a data stage."""
    n = names
    package = f"components/klear/{n.package}"
    return {
        f"{package}/__init__.py": f'"""{n.command}: {summary}"""\n',
        f"{package}/config.py": f'''"""Config of the {n.command} stage."""

from __future__ import annotations

import pydantic

from klear.common.config import StageConfig


class {n.config_class}(StageConfig):
    preset_package = "klear.{n.package}"

    max_records: int = pydantic.Field(0, ge=0, description="records read at most, in input order; 0 = all")
''',
        f"{package}/presets/paper.yaml": f"# {n.command} as the recipe runs it.\nmax_records: 0\n",
        f"{package}/presets/tiny.yaml": "# CPU demo and tests: the same rules on a few records.\nmax_records: 1000\n",
        f"{package}/stage.py": f'''"""Entry point of the {n.command} stage.

    klear {n.command} --input URI [URI ...] --output URI [--config paper|tiny|FILE]

Reads the records of every input in order (JSONL, Parquet, a published output) and publishes

    records.jsonl            the records read, up to max_records
    report.json, report.md   counts

atomically: nothing is visible as complete until the manifest is written, last.
"""

from __future__ import annotations

import argparse
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from klear.common.data_stage import DataStage
from klear.common.markdown import escape
from klear.common.records import iter_records, parse_sources, write_records
from klear.{n.package}.config import {n.config_class}

log = logging.getLogger("klear.{n.package}")


def render_markdown(report: dict[str, Any]) -> str:
    return f"# {n.command}\\n\\n{{report['records']}} records from {{', '.join(escape(i) for i in report['inputs'])}}\\n"


STAGE = DataStage("{n.command}", {n.config_class}, render_markdown)


def run(inputs: Sequence[str], output: str, config: {n.config_class}) -> dict[str, Any]:
    """Read `inputs`, publish to `output`; returns the report."""
    # A bad output fails now, not after the work; the manifest's lineage is these inputs and this config.
    checked = STAGE.check(output, {{"input": list(inputs)}}, config=config)
    located = (row for source in parse_sources(inputs) for row in iter_records(source))
    records = [row.record for row in itertools.islice(located, config.max_records or None)]
    with checked.open() as out:
        write_records(records, out.staging / "records.jsonl")
        report = {{"stage": "{n.command}", "inputs": list(inputs), "records": len(records),
                  "config": config.model_dump(mode="json")}}
        out.publish(report, {{"records": len(records)}})
    log.info("published %s: %d records", output, len(records))
    return report


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("{n.command}", help="{summary}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", action="extend", required=True, metavar="URI",
                        help="records to read, URI[#field=NAME]; repeat the flag or list several")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    STAGE.add_main(parser, lambda args, config: run(args.input, args.output, config),
                   lambda report: {{"records": report["records"]}})
''',
        f"{package}/component.py": f'''"""KFP component of the {n.command} stage: a thin wrapper around `klear.{n.package}.stage.run`."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from klear.common.config import keys_text
from klear.common.images import CPU_IMAGE
from klear.{n.package}.config import {n.config_class}

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text({n.config_class}, "; ")


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def {n.package}(
    data: Input[Dataset],
    preset: str,
    overrides: list,
    run_root: str,
    output: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    input_digest: str = "",
):
    """{summary[:1].upper() + summary[1:]}.

    Args:
        data: the records to read (imported by the pipeline).
        preset: {n.command} config preset (paper, tiny) or a YAML file path.
        overrides: {n.command} config overrides, "key=value" strings (`klear {n.command} --help-keys` lists the keys).
        run_root: where stage outputs go, `<run_root>/<run id>/{n.command}`.
        output: the published output: records.jsonl, report.json, report.md.
        summary: report.md, shown in the KFP UI.
        metrics: records read.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
    """
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.{n.package}.config import {n.config_class}
    from klear.{n.package}.stage import render_markdown, run

    target = kfp_io.output_location(run_root, "{n.command}")
    report = run([kfp_io.input_location(data)], target, load_config({n.config_class}, preset, overrides))
    kfp_io.record_output(output, target, {{"records": report["records"], "input_digest": input_digest}})
    kfp_io.publish_report(summary, render_markdown(report), metrics, [("records", report["records"])])
''',
        f"tests/{n.package}/__init__.py": "",
        f"tests/{n.package}/test_{n.package}.py": f'''"""The {n.command} stage through the real `klear {n.command}` command."""

from __future__ import annotations

import json
from pathlib import Path

from klear.common import storage
from tests.commands import jsonl, klear


def test_publishes_the_records_it_reads(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "data.jsonl", [{{"id": f"r{{i}}", "prompt": f"Compute {{i}} + {{i}}."}} for i in range(5)])
    out = tmp_path / "out"
    done = klear("{n.command}", "--input", data, "--output", str(out), "--config", "tiny", "--set", "max_records=3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {{"records": 3}}
    manifest = json.loads((out / storage.MANIFEST_NAME).read_text())
    assert manifest["meta"]["stage"] == "{n.command}" and manifest["meta"]["records"] == 3
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == ["r0", "r1", "r2"]


def test_a_bad_input_is_refused_by_name(tmp_path: Path) -> None:
    done = klear("{n.command}", "--input", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "out"))
    assert done.returncode == 2 and "missing.jsonl" in done.stderr, done.stderr[-3000:]
''',
    }


def pipeline_function(names: Names, summary: str) -> str:
    """The stage's own `klear-<stage>` pipeline: its input imported by URI, the stage a `cached_stage` task."""
    n = names
    return f'''@dsl.pipeline(name="{n.pipeline}", display_name="{n.command} (rerun)",
              description="Rerun {n.command} alone on existing records")
@_run_form(overrides={n.keys_alias})
def {n.package}_pipeline(data_uri: str, run_root: str, preset: str = "paper", overrides: list = [],
{" " * (len(n.package) + 14)}plan_cluster: str = "h100-80gb-x8", plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Dataset:
    """{summary[:1].upper() + summary[1:]}.

    Args:
        data_uri: The records {n.command} reads: a JSONL/Parquet file or a published output (s3://...).
        preset: {n.command} config (paper, tiny) or a YAML path.
    """
    data = _import(data_uri, dsl.Dataset, "records")
    task = cached_stage({n.package}, (data_uri,), what="{n.command} inputs", recompute=recompute, preset=preset,
                        data=data.output, overrides=overrides, run_root=run_root)
    output = _deterministic(task.set_display_name("{n.command}"), "4", "16Gi").outputs["output"]
    _plan_first("{n.pipeline}", plan_cluster, plan_gpu_quota, preset, overrides)
    return output
'''


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


def register_layer(imports: str, names: Names) -> str:
    return insert_in_block(imports, "ALLOWED: dict[str, set[str]] = {", f'    "{names.package}": {{"common"}},',
                           "tests/layout/test_imports.py ALLOWED")


def register_hostile_input(markdown_test: str, names: Names) -> str:
    return insert_in_block(markdown_test, "HOSTILE_INPUTS: dict[str, Callable[[Path], list[str]]] = {",
                           f'    "{names.command}": _named_input("{names.command}"),',
                           "tests/common/test_markdown.py HOSTILE_INPUTS")


def register_key_settings(lineage: str, names: Names) -> str:
    return insert_in_block(lineage, "KEY_SETTINGS: dict[str, tuple[str, ...]] = {",
                           f'    "{names.command}": ("max_records",),', "klear/common/lineage.py KEY_SETTINGS")


def register_pipeline(definitions: str, names: Names, summary: str) -> str:
    definitions = insert_imports(definitions, [
        f"from klear.{names.package}.component import OVERRIDE_KEYS as {names.keys_alias}",
        f"from klear.{names.package}.component import {names.package}"])
    anchor = "\n\nPIPELINES = {"
    if anchor not in definitions:
        raise ScaffoldError("pipelines/definitions.py: no `PIPELINES = {` (where the stage's pipeline goes)")
    definitions = definitions.replace(anchor, "\n\n" + pipeline_function(names, summary) + anchor, 1)
    return insert_in_block(definitions, "PIPELINES = {", f'    "{names.pipeline}": {names.package}_pipeline,',
                           "pipelines/definitions.py PIPELINES")


def register_readme(readme: str, names: Names, summary: str, stages: list[str]) -> str:
    """The stage's row after the last registered stage's row of README's stage table."""
    rows = [m for m in re.finditer(r"^\| `([a-z0-9-]+)` \|.*$", readme, re.MULTILINE) if m.group(1) in stages]
    if not rows:
        raise ScaffoldError("README.md: no stage table (rows `| `stage` | ... |`) to add the stage's row to")
    at = rows[-1].end() + 1
    return readme[:at] + f"| `{names.command}` | {summary} |\n" + readme[at:]


def register_deploy(deploy: str, names: Names) -> str:
    """Its rerun pipeline in docs/deploy.md's list of single-stage pipelines, before the list's last entry."""
    entries = list(re.finditer(r"^- `klear-[a-z0-9-]+`.*$", deploy, re.MULTILINE))
    if not entries:
        raise ScaffoldError("docs/deploy.md: no list of `klear-<stage>` pipelines (\"Rerun one stage\")")
    at = entries[-1].start()
    return deploy[:at] + f"- `{names.pipeline}`: `data_uri`;\n" + deploy[at:]


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
        raise ScaffoldError(f"KIND={kind}: the scaffold makes {', '.join(KINDS)} stages; a training stage is added by "
                            "hand on klear.training.stage.TrainingStage (README \"Adding a stage\")")
    names = Names.of(command)
    check_free(root, names)
    summary = summary.strip().rstrip(".") or f"{command}: a new data stage"
    stages = re.findall(r'^    "([a-z0-9-]+)": Stage\(', (root / "components/klear/cli.py").read_text(), re.MULTILINE)
    image = "cpu"
    edits: dict[str, Callable[[str], str]] = {
        "components/klear/cli.py": lambda text: register_command(text, names, image),
        "tests/layout/test_imports.py": lambda text: register_layer(text, names),
        "components/klear/common/lineage.py": lambda text: register_key_settings(text, names),
        "tests/common/test_markdown.py": lambda text: register_hostile_input(text, names),
        "pipelines/definitions.py": lambda text: register_pipeline(text, names, summary),
        "README.md": lambda text: register_readme(text, names, summary, stages),
        "docs/deploy.md": lambda text: register_deploy(text, names),
        f"docker/{image}.Dockerfile": lambda text: register_image(text, names, image),
    }
    # Every edit is computed before anything is written: a repository the scaffold cannot read is left as it was.
    missing = [path for path in edits if not (root / path).is_file()]
    if missing:
        raise ScaffoldError(f"{root} is not a checkout of this repository: {missing} not found")
    edited = {path: edit((root / path).read_text()) for path, edit in edits.items()}
    written = []
    for path, text in {**stage_files(names, summary), **edited}.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make new-stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the stage's command, e.g. word-count")
    parser.add_argument("--kind", default="data", help="data (a CPU stage on DataStage)")
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
