"""Presets that build on other presets (`base:`), and configs read from storage URIs.

preset_values.json holds every shipped preset's keys as they were written out in full, before presets named a
base: the loaded configs must stay exactly those.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from klear.common import storage
from klear.common.config import ConfigError, StageConfig, load_config, merge, preset_names
from klear.gppo.config import GppoConfig
from tests.judge.samples import boxed, math_record, publish_samples, sample_row

EXPECTED: dict[str, dict[str, dict]] = json.loads((Path(__file__).parent / "preset_values.json").read_text())


def _config_class(package: str) -> type[StageConfig]:
    module = importlib.import_module(f"{package}.config")
    found = [v for v in vars(module).values()
             if isinstance(v, type) and issubclass(v, StageConfig) and v.preset_package == package]
    assert len(found) == 1, f"{package}.config: expected one config class with presets, found {found}"
    return found[0]


@pytest.mark.parametrize(("package", "name"), [(p, n) for p, presets in EXPECTED.items() for n in presets])
def test_every_preset_loads_as_it_did_when_written_out_in_full(package: str, name: str) -> None:
    cls = _config_class(package)
    assert name in preset_names(cls)
    loaded = load_config(cls, name).model_dump(mode="json")
    assert loaded == cls.model_validate(EXPECTED[package][name]).model_dump(mode="json")


def test_the_paper_values_are_written_once() -> None:
    presets = Path(__file__).resolve().parents[2] / "components" / "klear" / "gppo" / "presets"
    code = [line for line in (presets / "code.yaml").read_text().splitlines() if line and not line.startswith("#")]
    assert code[0] == "base: math" and len(code) < 15
    assert (presets / "tiny-code.yaml").read_text().count("\n") < 5


def test_sections_merge_while_lists_and_named_items_replace() -> None:
    from klear.evaluate.config import EvaluateConfig

    base = {"only": ["a", "b"], "benchmarks": {"a": {"k": 1}, "b": {"k": 2}},
            "sampling": {"top_p": 0.9, "engine_kwargs": {"x": 1}}}
    changes = {"only": ["c"], "benchmarks": {"c": {"k": 3}}, "sampling": {"max_tokens": 8, "engine_kwargs": {"y": 2}}}
    assert merge(base, changes, EvaluateConfig) == {
        "only": ["c"], "benchmarks": {"c": {"k": 3}},
        "sampling": {"top_p": 0.9, "max_tokens": 8, "engine_kwargs": {"y": 2}}}
    assert base["sampling"] == {"top_p": 0.9, "engine_kwargs": {"x": 1}}  # the base is not changed


def test_a_file_builds_on_a_file_that_builds_on_a_preset(tmp_path: Path) -> None:
    (tmp_path / "mid.yaml").write_text("base: math\nlearning_rate: 3.0e-7\nreward:\n  budget_s: 45.0\n")
    (tmp_path / "top.yaml").write_text("base: mid.yaml\nsave_steps: 4\nverifier:\n  math_workers: 2\n")
    config = load_config(GppoConfig, str(tmp_path / "top.yaml"), ["eps_high=0.3"])
    math = load_config(GppoConfig, "math")
    assert (config.learning_rate, config.save_steps, config.eps_high) == (3.0e-7, 4, 0.3)
    assert config.reward.budget_s == 45.0 and config.verifier.math_workers == 2
    assert config.verifier.math_timeout_s == math.verifier.math_timeout_s  # untouched keys of a section stay
    assert config.model_dump(exclude={"learning_rate", "save_steps", "eps_high", "reward", "verifier"}) == \
        math.model_dump(exclude={"learning_rate", "save_steps", "eps_high", "reward", "verifier"})


def test_a_loop_of_bases_is_refused_naming_the_chain(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: c.yaml\n")
    (tmp_path / "c.yaml").write_text("base: a.yaml\nsave_steps: 3\n")
    with pytest.raises(ConfigError, match=r"loop: .*a\.yaml -> .*b\.yaml -> .*c\.yaml -> .*a\.yaml"):
        load_config(GppoConfig, str(tmp_path / "a.yaml"))
    (tmp_path / "self.yaml").write_text("base: self.yaml\n")
    with pytest.raises(ConfigError, match=r"loop: .*self\.yaml -> .*self\.yaml"):
        load_config(GppoConfig, str(tmp_path / "self.yaml"))


def test_an_unknown_base_is_named_with_the_config_naming_it(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text("base: maths\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: base 'maths': unknown preset 'maths' for GppoConfig; "
                                          r"presets: code, demo-math, math"):
        load_config(GppoConfig, str(tmp_path / "run.yaml"))
    (tmp_path / "gone.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"gone\.yaml: base 'nowhere\.yaml': config file not found: .*nowhere"):
        load_config(GppoConfig, str(tmp_path / "gone.yaml"))
    (tmp_path / "odd.yaml").write_text("base: [math]\n")
    with pytest.raises(ConfigError, match=r"odd\.yaml: base: expected a preset name, file or URI, got \['math'\]"):
        load_config(GppoConfig, str(tmp_path / "odd.yaml"))


def test_config_on_s3_builds_on_another_on_s3(s3_bucket: str) -> None:
    storage.write_bytes(f"{s3_bucket}/configs/math.yaml", b"base: math\nlearning_rate: 2.0e-7\n")
    storage.write_bytes(f"{s3_bucket}/configs/run.yaml", b"base: math.yaml\nsave_steps: 5\n")
    config = load_config(GppoConfig, f"{s3_bucket}/configs/run.yaml")
    assert (config.learning_rate, config.save_steps, config.task) == (2.0e-7, 5, "math")
    with pytest.raises(ConfigError, match=r"config file not found: s3://.*/configs/none\.yaml"):
        load_config(GppoConfig, f"{s3_bucket}/configs/none.yaml")


def test_klear_judge_reads_its_config_from_s3(s3_bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    from klear.cli import main

    config = f"{s3_bucket}/configs/judge.yaml"
    storage.write_bytes(config, b"base: tiny\nchunk_size: 7\nverifier:\n  math_timeout_s: 2\n")
    rows = [sample_row("m1", k, boxed(a), math_record("m1", "12")) for k, a in enumerate(["12", "13"])]
    samples = publish_samples(rows, f"{s3_bucket}/samples")
    assert main(["judge", "--samples", samples, "--output", f"{s3_bucket}/judged", "--config", config]) == 0
    report = json.loads(storage.read_bytes(f"{s3_bucket}/judged/report.json"))
    tiny = load_config(_config_class("klear.judge"), "tiny").model_dump(mode="json")
    assert report["config"] == {**tiny, "chunk_size": 7, "verifier": {**tiny["verifier"], "math_timeout_s": 2}}
    assert report["totals"]["correct"] == 1
    # The config is an input of the run: an output over it is refused before any work.
    capsys.readouterr()
    assert main(["judge", "--samples", samples, "--output", f"{s3_bucket}/configs", "--config", config]) == 2
    assert f"contains input {config}" in capsys.readouterr().err
    assert storage.read_bytes(config).startswith(b"base: tiny")
