"""config_origins: where each resolved key of a stage config came from (class default, preset, file of a `base`
chain, override), as `klear plan` prints it; origins_lines renders that for a person."""

from pathlib import Path

import pytest

from klear.common.config import ConfigError, StageConfig, config_origins, load_config, origins_lines
from klear.evaluate.config import EvaluateConfig
from klear.gppo.config import GppoConfig
from klear.sft.config import SftConfig

SFT_PAPER = "preset 'paper' (klear.sft/presets/paper.yaml)"
GPPO_MATH = "preset 'math' (klear.gppo/presets/math.yaml)"
EVALUATE_PAPER = "preset 'paper' (klear.evaluate/presets/paper.yaml)"


def test_a_preset_key_reads_the_preset_and_an_unset_key_the_default() -> None:
    config, origins = config_origins(SftConfig, "paper")
    assert origins["learning_rate"] == SFT_PAPER  # paper.yaml: learning_rate: 8.0e-5
    assert origins["seed"] == "default"  # paper.yaml does not set it
    assert config.seed == SftConfig.model_fields["seed"].default


def test_every_leaf_key_is_named_once_sections_flattened() -> None:
    config, origins = config_origins(GppoConfig, "math")
    assert origins["reward.budget_s"] == GPPO_MATH  # a section's key the preset sets
    assert origins["reward.workers"] == "default"  # the same section's key it does not
    assert "reward" not in origins and "verifier" not in origins  # a section is no leaf of its own
    leaves = {name for name, field in GppoConfig.model_fields.items() if name not in ("reward", "verifier")}
    leaves |= {f"reward.{name}" for name in type(config.reward).model_fields}
    leaves |= {f"verifier.{name}" for name in type(config.verifier).model_fields}
    assert set(origins) == leaves


def test_no_source_reads_default_everywhere() -> None:
    _, origins = config_origins(SftConfig)
    assert set(origins.values()) == {"default"}


def test_a_base_chain_names_the_level_that_set_each_key(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("base: paper\nlearning_rate: 1.0e-4\nnum_epochs: 2\n")
    top = tmp_path / "top.yaml"
    top.write_text("base: base.yaml\nnum_epochs: 3\n")
    config, origins = config_origins(SftConfig, str(top))
    assert config.num_epochs == 3 and config.learning_rate == 1e-4
    assert origins["num_epochs"] == str(top)  # the top file changes the base's value
    assert origins["learning_rate"] == str(base)  # only the base sets it (over the preset)
    assert origins["max_length"] == SFT_PAPER  # only the preset at the bottom sets it
    assert origins["seed"] == "default"
    assert config == load_config(SftConfig, str(top))


def test_a_section_merged_over_a_base_names_each_key_of_it(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("base: math\nreward: {workers: 2}\n")
    top = tmp_path / "top.yaml"
    top.write_text("base: base.yaml\nreward: {budget_s: 12.0}\n")
    config, origins = config_origins(GppoConfig, str(top))
    assert (config.reward.workers, config.reward.budget_s) == (2, 12.0)
    assert origins["reward.budget_s"] == str(top)  # the top file changes the preset's 30.0
    assert origins["reward.workers"] == str(base)
    assert origins["verifier.math_workers"] == GPPO_MATH
    assert origins["reward.timeout_reward"] == "default"


def test_an_override_reads_as_the_override() -> None:
    config, origins = config_origins(SftConfig, "paper", ["num_epochs=7"])
    assert config.num_epochs == 7
    assert origins["num_epochs"] == "override num_epochs=7"
    assert origins["learning_rate"] == SFT_PAPER


def test_a_section_sub_key_override_names_only_that_key() -> None:
    config, origins = config_origins(EvaluateConfig, "paper", ["sampling.max_tokens=1024"])
    assert config.sampling.max_tokens == 1024
    assert origins["sampling.max_tokens"] == "override sampling.max_tokens=1024"
    assert origins["sampling.temperature"] == EVALUATE_PAPER  # the same section, not overridden
    assert origins["sampling.n"] == "default"
    assert origins["judge.verifier.think_end"] == EVALUATE_PAPER  # a section in a section


def test_an_override_of_a_whole_section_replaces_its_preset_keys() -> None:
    # `key={...}` sets the section whole: keys the preset set and the override does not are defaults again.
    config, origins = config_origins(GppoConfig, "math", ["reward={workers: 3}"])
    assert config.reward.workers == 3
    assert origins["reward.workers"] == "override reward={workers: 3}"
    assert config.reward.budget_s == GppoConfig.model_fields["reward"].default.budget_s
    assert origins["reward.budget_s"] == "default"


def test_an_override_inside_a_mapping_of_named_items_names_both() -> None:
    # benchmarks is one value (a mapping of named items, replaced whole by a config): the preset's, changed.
    config, origins = config_origins(EvaluateConfig, "paper", ["benchmarks.aime24.k=8"])
    assert config.benchmarks["aime24"].k == 8
    assert origins["benchmarks"] == f"{EVALUATE_PAPER} + override benchmarks.aime24.k=8"


def test_a_later_override_of_the_same_key_wins() -> None:
    config, origins = config_origins(SftConfig, "paper", ["num_epochs=7", "num_epochs=9"])
    assert config.num_epochs == 9
    assert origins["num_epochs"] == "override num_epochs=9"


@pytest.mark.parametrize(
    ("cls", "source", "overrides"),
    [
        (SftConfig, "paper", []),
        (GppoConfig, "math", ["reward.budget_s=5", "learning_rate=2e-6"]),
        (EvaluateConfig, "release", ["sampling.max_tokens=1024", "benchmarks.aime24.k=8"]),
        (EvaluateConfig, "tiny", []),
        (SftConfig, None, ["num_epochs=1"]),
    ],
)
def test_the_config_is_load_configs(cls: type[StageConfig], source: str | None, overrides: list[str]) -> None:
    config, _ = config_origins(cls, source, overrides)
    assert config == load_config(cls, source, overrides)


@pytest.mark.parametrize(
    ("source", "overrides"),
    [("paper", ["num_epochs=nine"]), ("huge", []), ("paper", ["num_epochs"]), ("paper", ["seed.x=1"])],
)
def test_errors_are_load_configs(source: str, overrides: list[str]) -> None:
    with pytest.raises(ConfigError) as expected:
        load_config(SftConfig, source, overrides)
    with pytest.raises(ConfigError) as got:
        config_origins(SftConfig, source, overrides)
    assert str(got.value) == str(expected.value)


def test_origins_lines_give_key_value_and_origin_in_declaration_order() -> None:
    config, origins = config_origins(EvaluateConfig, "paper", ["sampling.system_prompt=" + "x" * 500])
    lines = origins_lines(config, origins)
    assert len(lines) == len(origins)
    assert lines[0].startswith("benchmarks = {")  # EvaluateConfig's first field, not alphabetical
    assert 'sampling.max_tokens = 32768  (preset \'paper\' (klear.evaluate/presets/paper.yaml))' in lines
    assert 'math_template = "{problem}"  (preset \'paper\' (klear.evaluate/presets/paper.yaml))' in lines
    assert "sampling.n = 16  (default)" in lines
    long = next(line for line in lines if line.startswith("sampling.system_prompt = "))
    # The value (500 x's, quoted) and the origin (the override) are each clipped to 200 characters.
    assert long.startswith('sampling.system_prompt = "' + "x" * 199 + '... (502 characters)  (override ')
    assert long.endswith("  (override sampling.system_prompt=" + "x" * 168 + "... (532 characters))")
