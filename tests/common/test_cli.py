"""The training-stage command line (klear.common.cli.add_training_stage), at the parser level."""

from __future__ import annotations

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
