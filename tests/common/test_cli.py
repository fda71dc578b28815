"""The `klear` command line at the parser level: the training-stage command (add_training_stage), config options."""

from __future__ import annotations

import argparse

import pytest

from klear.cli import build_parser


@pytest.mark.parametrize("command", ["sft", "gppo"])
def test_repeated_data_flags_keep_every_value(command: str) -> None:
    argv = [command, "--model", "m", "--data", "A", "--data", "B", "C", "--output", "o"]
    args = build_parser(argv).parse_args(argv)
    assert args.data == ["A", "B", "C"]


def test_data_is_required() -> None:
    argv = ["sft", "--model", "m", "--output", "o"]
    with pytest.raises(SystemExit):
        build_parser(argv).parse_args(argv)


def test_config_help_lists_every_shipped_preset() -> None:
    """`--config`'s help is read from the presets folder, so a new preset (evaluate's `demo`) is never missing."""
    from pathlib import Path

    import klear
    from klear.cli import COMMANDS

    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    checked = []
    for command, parser in subcommands.items():
        config = next((a for a in parser._actions if a.dest == "config"), None)
        if config is None:
            continue
        folder = Path(klear.__file__).parent / COMMANDS[command].split(".")[1] / "presets"
        shipped = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        assert f"({shipped})" in (config.help or ""), (command, config.help)
        checked.append(command)
    assert {"evaluate", "evaluate-prompts", "sample", "sft", "gppo", "verify-math"} <= set(checked)
