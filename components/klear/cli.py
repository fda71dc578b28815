"""The `klear` command: one subcommand per stage and tool.

Each module in COMMANDS defines `add_parser(subparsers)`, which registers its subcommands and
sets `func` to a callable taking the parsed arguments and returning an exit code. Only the module
of the command being run is imported, so `klear curate` does not pay for torch or vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Literal, NamedTuple

COMMANDS = {
    "demo-data": "klear.demo.generate",
    "curate": "klear.curate.stage",
    "sample": "klear.sample.stage",
    "tiny-model": "klear.demo.tiny_model",
    "sft": "klear.sft.stage",
    "gppo": "klear.gppo.stage",
    "judge": "klear.judge.stage",
    "sft-data": "klear.sft_data.stage",
    "rl-filter": "klear.rl_filter.stage",
    "evaluate": "klear.evaluate.stage",
    "evaluate-prompts": "klear.evaluate.stage",
    "evaluate-problems": "klear.evaluate.stage",
    "verify-math": "klear.verifiers.cli",
    "verify-code": "klear.verifiers.cli",
    "reward": "klear.gppo.reward_command",  # a tool: a GPPO reward configuration on given rollouts
    "lineage": "klear.common.lineage",  # a tool, not a stage: reads manifests only
    "register": "klear.register.stage",  # not a stage: publishes nothing, registers a published model by reference
    "plan": "klear.plan.command",  # a tool, not a stage: checks a compiled pipeline's arguments, on CPU
}


class Stage(NamedTuple):
    """Where a pipeline stage runs and which `klear-*` pipelines run it alone (see README "Adding a stage")."""

    image: Literal["cpu", "gpu"]  # the base image of its KFP component (klear.common.images)
    pipelines: tuple[str, ...]


# The pipeline stages, in the recipe's order: the one list every other place is checked against by the tests
# (import layers, torch-free modules, component images, presets in the wheel, compiled pipelines, README). A
# stage's code is the package of its command (klear.<stage>: stage.py, component.py, presets/*.yaml).
STAGES: dict[str, Stage] = {
    "curate": Stage("cpu", ("klear-curate",)),
    "sample": Stage("gpu", ("klear-sample",)),
    "judge": Stage("cpu", ("klear-judge",)),
    "sft-data": Stage("cpu", ("klear-sft-data",)),
    "sft": Stage("gpu", ("klear-sft",)),
    "rl-filter": Stage("cpu", ("klear-rl-filter",)),
    "gppo": Stage("gpu", ("klear-gppo-math", "klear-gppo-code")),
    "evaluate": Stage("cpu", ("klear-evaluate", "klear-evaluate-samples")),
}
# The pipeline of the whole recipe, besides each stage's own.
RECIPE_PIPELINE = "klear-reasoner"


def stage_package(command: str) -> str:
    """The sub-package of a command's module: `sft-data` -> `sft_data`."""
    if command not in COMMANDS:  # a stage in STAGES but not here: say where its line goes, not a bare KeyError
        raise ValueError(f"{command!r} is not in COMMANDS (components/klear/cli.py): add "
                         f'"{command}": "klear.{command.replace("-", "_")}.stage"')
    return COMMANDS[command].split(".")[1]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klear", description="Klear-Reasoner post-training pipeline stages.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = next((arg for arg in argv or () if not arg.startswith("-")), None)
    modules = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RuntimeError) as exc:
        # Known failure kinds carry messages that name the file, line, field or URI: show them plainly.
        logging.getLogger("klear").debug("failure", exc_info=True)
        print(f"klear {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
