"""Command-line options the stages share (config presets and overrides, the training-stage command).

Stages import this module, never `klear.cli`: the `klear` command knows the stages through its registry of
module names, and the stages know nothing of it.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable


def add_config_arguments(parser: argparse.ArgumentParser, default_preset: str, config_class: type) -> None:
    """The config options every stage shares: a preset name or YAML file, key=value overrides, and --help-keys,
    which prints every key --set can name with its description. The presets are the names in the config class's
    presets folder, never a hand-kept list."""
    from klear.common.config import keys_text, preset_names

    presets = ", ".join(preset_names(config_class))
    parser.add_argument(
        "--config", default=default_preset, help=f"preset name ({presets}) or YAML file (default: {default_preset})"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key (--help-keys lists them)"
    )

    class HelpKeys(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
            print(keys_text(config_class))
            parser.exit()

    parser.add_argument("--help-keys", action=HelpKeys, nargs=0, help="list the config keys --set can name, and exit")


def add_training_stage(subparsers: argparse._SubParsersAction, name: str, help: str, description: str, model_help: str,
                       data_help: str, default_preset: str, config_class: type, run: Callable[..., dict]) -> None:
    """The command of a training stage (sft, gppo): model, data, output, scratch folder, config; prints a summary."""
    parser = subparsers.add_parser(name, help=help, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="URI", help=model_help)
    # extend, not store: `--data A --data B` keeps both
    parser.add_argument("--data", nargs="+", action="extend", required=True, metavar="URI", help=data_help)
    parser.add_argument("--output", required=True, metavar="URI", help="output location; checkpoints under <output>/checkpoints")
    parser.add_argument("--work-dir", default=None,
                        help=f"local scratch folder shared by the node's ranks (default: $TMPDIR/klear-{name}-<hash of --output>)")
    add_config_arguments(parser, default_preset, config_class)

    def main(args: argparse.Namespace) -> int:
        from klear.common.config import load_config

        report = run(args.model, args.data, args.output, load_config(config_class, args.config, args.overrides),
                     args.work_dir)
        if os.environ.get("RANK", "0") == "0":  # one summary per job, not per rank
            print(json.dumps({"data": {k: v for k, v in report["data"].items() if k != "skipped_examples"},
                              "training": report["training"], "metrics": report["metrics"]}))
        return 0

    parser.set_defaults(func=main)
