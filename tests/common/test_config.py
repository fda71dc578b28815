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


# --- strict numbers: YAML `true` is not 1, `.inf` is not a number of epochs (every stage config) ---

from klear.gppo.config import GppoConfig  # noqa: E402
from klear.sft.config import SftConfig  # noqa: E402


@pytest.mark.parametrize(
    ("cls", "override", "field"),
    [
        (CurateConfig, "ngram_size=true", "ngram_size"),
        (CurateConfig, "progress_seconds=false", "progress_seconds"),
        (SftConfig, "num_epochs=true", "num_epochs"),
        (SftConfig, "per_device_batch_size=true", "per_device_batch_size"),
        (GppoConfig, "max_steps=true", "max_steps"),
        (GppoConfig, "reward.budget_s=true", "reward"),  # a plain pydantic section inside a stage config
        (GppoConfig, "verifier.timeout_s=true", "verifier"),
    ],
)
def test_booleans_are_not_numbers(cls: type, override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"{field}.*boolean"):
        load_config(cls, None, [override])


@pytest.mark.parametrize(
    ("cls", "override", "field"),
    [
        (SftConfig, "num_epochs=.inf", "num_epochs"),
        (SftConfig, "learning_rate=.nan", "learning_rate"),
        (SftConfig, "num_epochs=inf", "num_epochs"),  # text that pydantic would parse as a float
        (CurateConfig, "progress_seconds=.inf", "progress_seconds"),
        (GppoConfig, "num_epochs=.inf", "num_epochs"),
        (GppoConfig, "reward.budget_s=.inf", "reward"),
        (GppoConfig, "reward.timeout_reward=-.inf", "reward"),
    ],
)
def test_numbers_must_be_finite(cls: type, override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"{field}.*finite"):
        load_config(cls, None, [override])


def test_booleans_still_fill_boolean_fields() -> None:
    assert load_config(GppoConfig, None, ["reward.official_format_penalties=true", "dual_clip=10"]).dual_clip == 10.0
    assert load_config(SftConfig, None, ["num_epochs=2", "learning_rate=1e-4"]).num_epochs == 2.0


@pytest.mark.parametrize("value", ["0", "-5", "-2"])
def test_gppo_max_steps_is_positive_or_minus_one(value: str) -> None:
    with pytest.raises(ConfigError, match="max_steps"):
        load_config(GppoConfig, None, [f"max_steps={value}"])
    assert load_config(GppoConfig, None, ["max_steps=-1"]).max_steps == -1
    assert load_config(GppoConfig, None, ["max_steps=3"]).max_steps == 3


# --- YAML aliases: a few hundred bytes must not expand to gigabytes ---

def _laughs(depth: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, depth + 1)]
    return "\n".join(lines) + f"\nngram_size: *a{depth}\n"


def test_billion_laughs_config_file_is_refused_fast(tmp_path) -> None:
    import time

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs(8))
    start = time.monotonic()
    with pytest.raises(ConfigError, match="alias") as caught:
        load_config(CurateConfig, str(bomb))
    assert time.monotonic() - start < 1 and len(str(caught.value)) < 600


def test_aliases_in_overrides_are_refused_fast() -> None:
    import time

    value = "{" + ", ".join([f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}" if i else '"lol"'] * 9) + "]" for i in range(9)]) + "}"
    start = time.monotonic()
    with pytest.raises(ConfigError, match="alias") as caught:
        load_config(CurateConfig, None, [f"ngram_size={value}"])
    assert time.monotonic() - start < 1 and len(str(caught.value)) < 600
    with pytest.raises(ConfigError, match="alias"):
        load_config(CurateConfig, None, ["prompt_field=&x problem"])  # an anchor alone is refused too


def test_error_messages_quote_values_briefly() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(CurateConfig, None, ["ngram_size=" + "x" * 100_000, "y" * 50_000 + "=1"])
    assert len(str(caught.value)) < 1000 and "ngram_size" in str(caught.value) and "unknown key" in str(caught.value)


def test_a_boolean_for_a_text_field_keeps_pydantics_message() -> None:
    with pytest.raises(ConfigError, match=r"prompt_field: Input should be a valid string \(got True\)"):
        load_config(CurateConfig, None, ["prompt_field=true"])


def test_strictness_reaches_into_lists_dicts_and_optionals() -> None:
    from typing import Literal

    from klear.common.config import StageConfig

    class Probe(StageConfig):
        sizes: list[int] = [1]
        weights: dict[str, float] = {}
        ratio: float | None = None
        mode: Literal["a", "b"] = "a"
        flag: bool | int = False

    assert load_config(Probe, None, ["flag=true", "sizes=[2, 3]", "ratio=0.5"]).flag is True
    for override, where in [("sizes=[1, true]", r"sizes: \[1\]: a boolean"), ("ratio=true", "ratio: a boolean"),
                            ("weights={a: 1.0, b: true}", "weights: b: a boolean"),
                            ("weights={a: .nan}", "weights.*finite"), ("sizes=[1, .inf]", "sizes")]:
        with pytest.raises(ConfigError, match=where):
            load_config(Probe, None, [override])


# --- config files that are not YAML configs, through the real command: each error names the file ---


def _judge_config_error(config: str) -> str:
    """`klear judge --config CONFIG` on no samples: the config is refused first; its one error line."""
    from tests.commands import klear

    done = klear("judge", "--samples", "/nonexistent/samples", "--output", "/nonexistent/out", "--config", config)
    assert done.returncode == 2, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("klear judge: error: ")]
    return line.removeprefix("klear judge: error: ")


def test_a_binary_file_given_as_config_is_named(tmp_path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}\xa0\xa0 weights")
    assert _judge_config_error(str(weights)) == f"config file {weights} is not UTF-8 text (byte 10): not a YAML config"
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    assert _judge_config_error(str(huge)) == (f"config file {huge} has {(1 << 20) + 3} bytes, more than a config's "
                                              f"{1 << 20}: not a YAML config")


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: 2\nverifier: [1\nchunk_size: 3\n")
    assert _judge_config_error(str(bad)) == (f"{bad}: invalid YAML: expected ',' or ']', but got ':' at line 3, "
                                             "column 11 (while parsing a flow sequence at line 2, column 11)")


def test_a_config_file_that_is_not_a_mapping_is_named(tmp_path) -> None:
    """`[]`, `false` or `0` was read as an empty config: the run went on with the defaults. An empty file is one."""
    config = tmp_path / "run.yaml"
    for text, kind in (("[]\n", "list"), ("false\n", "bool"), ("0\n", "int")):
        config.write_text(text)
        assert _judge_config_error(str(config)) == f"{config}: expected a mapping of config keys, got {kind}"
    config.write_text("# nothing set\n")
    assert load_config(CurateConfig, str(config)) == load_config(CurateConfig, None)


def test_a_self_loop_through_a_file_uri_is_named(tmp_path) -> None:
    """`base: ./self.yaml` in file:///.../self.yaml: each `./` made another spelling of the same file, until
    "maximum recursion depth exceeded"."""
    (tmp_path / "self.yaml").write_text("base: ./self.yaml\n")
    me = str((tmp_path / "self.yaml").resolve())
    assert _judge_config_error(f"file://{me}") == f"config bases form a loop: {me} -> {me}"


def test_a_loop_through_mixed_spellings_is_named_from_where_it_starts(tmp_path) -> None:
    """A file:// URI, an absolute path and a relative one name the same files: the loop is found on the first
    file's second visit, and names the files once each."""
    a, b, c = (str((tmp_path / f"{name}.yaml").resolve()) for name in "abc")
    (tmp_path / "a.yaml").write_text(f"base: file://{b}\n")
    (tmp_path / "b.yaml").write_text(f"base: {c}\n")
    (tmp_path / "c.yaml").write_text("base: ./a.yaml\n")
    assert _judge_config_error(f"file://{a}") == f"config bases form a loop: {a} -> {b} -> {c} -> {a}"
    assert _judge_config_error(b) == f"config bases form a loop: {b} -> {c} -> {a} -> {b}"


def test_a_chain_of_bases_longer_than_any_loop_free_one_is_refused(tmp_path) -> None:
    for i in range(40):
        (tmp_path / f"c{i}.yaml").write_text(f"base: c{i + 1}.yaml\n")
    (tmp_path / "c40.yaml").write_text("base: paper\n")
    error = _judge_config_error(str(tmp_path / "c0.yaml"))
    assert error.startswith("config bases nest deeper than 32: ") and "c0.yaml -> " in error


def test_a_file_named_like_a_preset_is_read_by_its_path(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name without "/" or a .yaml suffix is a preset's: the error says how to read the file of that name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\xa0")
    with pytest.raises(ConfigError, match=r"unknown preset 'model.safetensors' for CurateConfig; presets: paper, tiny; "
                                          r"to read the file model.safetensors, give it as ./model.safetensors"):
        load_config(CurateConfig, "model.safetensors")
