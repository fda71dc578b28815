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
