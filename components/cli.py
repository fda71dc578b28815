"""The `klear` command: one subcommand per stage and tool.

Each module in SUBCOMMANDS defines `add_parser(subparsers)`, which registers its subcommand
and sets `func` to a callable taking the parsed arguments and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMANDS = (
    "klear.demo.generate",
    "klear.curate.stage",
    "klear.verifiers.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klear", description="Klear-Reasoner post-training pipeline stages.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def add_config_arguments(parser: argparse.ArgumentParser, default_preset: str = "paper") -> None:
    """The config options every stage shares: a preset name or YAML file, and key=value overrides."""
    parser.add_argument(
        "--config", default=default_preset, help=f"preset name (paper, tiny) or YAML file (default: {default_preset})"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one config key"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
