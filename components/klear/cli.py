"""The `klear` command: one subcommand per stage and tool.

Each module in COMMANDS defines `add_parser(subparsers)`, which registers its subcommands and
sets `func` to a callable taking the parsed arguments and returning an exit code. Only the module
of the command being run is imported, so `klear curate` does not pay for torch or vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable

COMMANDS = {
    "demo-data": "klear.demo.generate",
    "curate": "klear.curate.stage",
    "tiny-model": "klear.demo.tiny_model",
    "sft": "klear.sft.stage",
    "gppo": "klear.gppo.stage",
    "verify-math": "klear.verifiers.cli",
    "verify-code": "klear.verifiers.cli",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klear", description="Klear-Reasoner post-training pipeline stages.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = next((arg for arg in argv or () if not arg.startswith("-")), None)
    modules = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def add_config_arguments(parser: argparse.ArgumentParser, default_preset: str = "paper", presets: str = "paper, tiny") -> None:
    """The config options every stage shares: a preset name or YAML file, and key=value overrides."""
    parser.add_argument(
        "--config", default=default_preset, help=f"preset name ({presets}) or YAML file (default: {default_preset})"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one config key"
    )


def add_training_stage(subparsers: argparse._SubParsersAction, name: str, help: str, description: str, model_help: str,
                       data_help: str, default_preset: str, config_class: type, run: Callable[..., dict]) -> None:
    """The command of a training stage (sft, gppo): model, data, output, scratch folder, config; prints a summary."""
    parser = subparsers.add_parser(name, help=help, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="URI", help=model_help)
    parser.add_argument("--data", nargs="+", required=True, metavar="URI", help=data_help)
    parser.add_argument("--output", required=True, metavar="URI", help="output location; checkpoints under <output>/checkpoints")
    parser.add_argument("--work-dir", default=None,
                        help=f"local scratch folder shared by the node's ranks (default: $TMPDIR/klear-{name}-<hash of --output>)")
    from klear.common.config import preset_names

    add_config_arguments(parser, default_preset, ", ".join(preset_names(config_class)))

    def main(args: argparse.Namespace) -> int:
        from klear.common.config import load_config

        report = run(args.model, args.data, args.output, load_config(config_class, args.config, args.overrides),
                     args.work_dir)
        if os.environ.get("RANK", "0") == "0":  # one summary per job, not per rank
            print(json.dumps({"data": {k: v for k, v in report["data"].items() if k != "skipped_examples"},
                              "training": report["training"], "metrics": report["metrics"]}))
        return 0

    parser.set_defaults(func=main)


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
