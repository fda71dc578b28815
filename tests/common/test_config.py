import pytest

from klear.common.config import ConfigError, load_config
from klear.curate.config import CurateConfig


def test_presets_load_and_differ() -> None:
    paper = load_config(CurateConfig, "paper")
    tiny = load_config(CurateConfig, "tiny")
    assert paper.ngram_size == tiny.ngram_size == 9
    assert paper.workers == 0 and tiny.workers == 1


def test_overrides_are_typed() -> None:
    config = load_config(CurateConfig, "tiny", ["ngram_size=13", "drop_short_matches=false"])
    assert config.ngram_size == 13
    assert config.drop_short_matches is False


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown key 'ngram_sise'"):
        load_config(CurateConfig, "tiny", ["ngram_sise=5"])


def test_wrong_type_names_field_and_value() -> None:
    with pytest.raises(ConfigError, match=r"ngram_size: .*integer.*'nine'"):
        load_config(CurateConfig, "paper", ["ngram_size=nine"])


def test_out_of_range_value() -> None:
    with pytest.raises(ConfigError, match="ngram_size"):
        load_config(CurateConfig, "paper", ["ngram_size=0"])


def test_yaml_file_errors_name_the_file(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("ngram_size: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid YAML"):
        load_config(CurateConfig, str(bad))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("batch_size: -3\n")
    with pytest.raises(ConfigError, match=r"wrong.yaml.*batch_size"):
        load_config(CurateConfig, str(wrong))


def test_unknown_preset_and_bad_override_syntax() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'huge'.*paper, tiny"):
        load_config(CurateConfig, "huge")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(CurateConfig, "tiny", ["ngram_size"])
