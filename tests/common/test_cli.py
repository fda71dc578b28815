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


@pytest.mark.parametrize(("command", "spec", "expected"), [
    ("judge", "0/99999999999999999999", "expected I/N with N at most 100000 slices"),
    ("judge", "0/100001", "expected I/N with N at most 100000 slices"),
    ("judge", "0_0/1_0", "expected I/N in digits with 0 <= I < N, e.g. 0/4"),  # int() read it as 0/10
    ("judge", "\uff10/4", "expected I/N in digits with 0 <= I < N, e.g. 0/4"),  # a fullwidth 0
    ("judge", " 1/4", "expected I/N in digits with 0 <= I < N, e.g. 0/4"),
    ("sample", "1_0/2_0", "expected I/N in digits with 0 <= I < N, e.g. 0/4"),
])
def test_a_slice_is_ascii_digits_within_bounds(tmp_path, command: str, spec: str, expected: str) -> None:
    """`--slice I/N` of the real command, refused before any input is read, naming the flag and the value."""
    from tests.commands import klear

    inputs = ["--samples", str(tmp_path / "none")] if command == "judge" else [
        "--prompts", str(tmp_path / "none"), "--endpoint", "http://127.0.0.1:9/v1", "--served-model", "m"]
    done = klear(command, *inputs, "--output", str(tmp_path / "out"), "--slice", spec)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"klear {command}: error: --slice {spec!r}: {expected}"
