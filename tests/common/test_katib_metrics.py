"""The metric lines of the training stages as Katib reads them: Katib's own default filter and line rules (ported in
tests/deploy/katib.py) over `katib_line`'s output give back every figure, its time, and the trial's value."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from klear.common import tracking
from klear.common.config import load_config, preset_names
from klear.evaluate.config import EvaluateConfig
from klear.gppo.validation import val_scores
from tests.deploy import katib

KATIB_NAME = re.compile(r"[\w|-]+", re.ASCII)  # the name group of Katib's default filter
T0 = dt.datetime(2025, 6, 1, 12, 0, 0, 250_000, tzinfo=dt.UTC)


def _logged_names() -> list[str]:
    """Every scheme name the stages log that a test can list: the renamed Trainer keys, the progress figures, and
    the validation figures of every shipped evaluate preset's benchmarks."""
    names = [*tracking.SCHEME.values(), *tracking.PROGRESS_FIGURES, "val/seconds"]
    for preset in preset_names(EvaluateConfig):
        benchmarks = load_config(EvaluateConfig, preset).benchmarks
        report = {"models": {"model": {"benchmarks": {b: {"pass@1": 1.0, "stderr": 0.1, "truncated": 0.0}
                                                      for b in benchmarks}}}}
        names += val_scores(report)
    return sorted(set(names))


def test_katib_names_are_what_the_filter_reads_and_stay_apart() -> None:
    assert tracking.katib_name("val/pass@1") == "val-pass-at-1"
    assert tracking.katib_name("train/loss") == "train-loss"
    assert tracking.katib_name("reward/mean") == "reward-mean"
    assert tracking.katib_name("val/lcb-v5/pass@1") == "val-lcb_v5-pass-at-1"
    assert tracking.katib_name("rollout/sampling/x.y z") == "rollout-sampling-x_y_z"
    names = _logged_names()
    assert "val/aime24/pass@1" in names and len(names) > 40
    katib_names = [tracking.katib_name(name) for name in names]
    assert all(KATIB_NAME.fullmatch(name) for name in katib_names), katib_names
    assert len(set(katib_names)) == len(names)  # one-to-one on what is logged


@pytest.mark.parametrize("value", [0.41, -0.5, 0.0, 1e-06, 2.5e-12, 1.5e20, 123456789.0, 1 / 3, 40.0, 7])
def test_katib_reads_every_value_whole(value: float) -> None:
    line = tracking.katib_line(12, {"train/loss": value, "val/pass@1": 40.0}, T0)
    logs = katib.parse_text_log(line, ["train-loss", "val-pass-at-1", "step"])
    assert [(log.name, float(log.value)) for log in logs] == [("step", 12.0), ("train-loss", value), ("val-pass-at-1", 40.0)]
    assert {log.timestamp for log in logs} == {"2025-06-01T12:00:00.250000Z"}


def test_latest_value_is_the_last_line_by_its_time() -> None:
    lines = [tracking.katib_line(0, {"val/pass@1": 10.0}, T0 + dt.timedelta(hours=2)),
             tracking.katib_line(4, {"val/pass@1": 30.0, "train/loss": 0.5}, T0 + dt.timedelta(hours=3)),
             tracking.katib_line(2, {"train/loss": 0.7, "val/pass@1": 20.0}, T0)]  # an earlier time, written last
    text = "\n".join(["INFO loading the model", *lines, "gppo: step 4/4 (100%), ETA 0:00:00, val/pass@1 30"])
    logs = katib.parse_text_log(text, ["val-pass-at-1", "train-loss"])
    assert katib.trial_value(logs, "val-pass-at-1", "latest") == "30.0"
    assert katib.trial_value(logs, "val-pass-at-1", "max") == "30.0"
    assert katib.trial_value(logs, "train-loss", "min") == "0.5"
    # Through a logging formatter ("2025-06-01 12:00:00,250 INFO ...") the time would be lost: Katib then has no
    # order for `latest`. The human progress line carries no Katib name at all.
    logged = katib.parse_text_log(f"2025-06-01 12:00:00,250 INFO klear.tracking: {lines[0]}", ["val-pass-at-1"])
    assert [log.timestamp for log in logged] == [katib.ZERO_TIME]
    progress = tracking.progress_line(4, 4, 60.0, 4, {"val/pass@1": 30.0})
    assert katib.parse_text_log(progress, ["val-pass-at-1"])[0].value == katib.UNAVAILABLE
