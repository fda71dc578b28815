"""What a stage hands a judge step in front of it, instead of the judge reading that stage's config: its config's
`judge` section (settings_json -> judge_config) and, for evaluate, its problems as a problems file (problem_row)."""

from __future__ import annotations

import pytest

from klear.common.config import ConfigError, load_config
from klear.evaluate.config import EvaluateConfig
from klear.judge import JudgeConfig, problem_from_row
from klear.judge.config import judge_config, settings_json
from klear.judge.problems import Problem, problem_row
from klear.rl_filter.config import RlFilterConfig
from klear.sft_data.config import SftDataConfig


@pytest.mark.parametrize(("config_class", "overrides"), [
    (SftDataConfig, ["judge.verifier.math_timeout_s=4"]),
    (RlFilterConfig, ["judge.task=math", "judge.workers=3"]),
    (EvaluateConfig, ["judge.report_modes=[strict, official]"]),
])
def test_the_judge_takes_the_section_a_stage_hands_over(config_class: type, overrides: list[str]) -> None:
    section: JudgeConfig = load_config(config_class, "tiny", overrides).judge
    handed = judge_config(settings_json(section))
    assert handed == section and handed != load_config(JudgeConfig, "tiny")  # the stage's, not the judge's preset


def test_handed_settings_keep_where_the_stage_loaded_them_from() -> None:
    """The judge output's lineage names the handing stage's preset and section, as a loaded section would."""
    from klear.common.config import describe_preset

    handed = judge_config(settings_json(load_config(RlFilterConfig, "tiny", ["judge.task=math"]).judge))
    assert handed.provenance is not None
    assert describe_preset(handed.provenance.to_json()) == "tiny + judge.task=math, section RlFilterConfig.judge"
    assert judge_config(JudgeConfig(task="math").model_dump_json()).provenance is None  # a bare section: none known


def test_without_handed_settings_a_judge_preset_and_overrides() -> None:
    assert judge_config("", "tiny", ["task=code"]) == load_config(JudgeConfig, "tiny", ["task=code"])
    assert judge_config() == JudgeConfig()


@pytest.mark.parametrize(("settings", "preset", "overrides", "named"), [
    ('{"task": "auto"}', "tiny", [], "exclude each other"),  # overrides on top would judge otherwise
    ('{"task": "auto"}', "", ["task=math"], "exclude each other"),
    ('{"task": "physics"}', "", [], "task"),
    ('{"verifier": {"no_such_key": 1}}', "", [], "verifier.no_such_key"),
    ("task=math", "", [], "not a judge config"),
])
def test_bad_handed_settings_are_named(settings: str, preset: str, overrides: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match="judge settings") as caught:
        judge_config(settings, preset, overrides)
    assert named in str(caught.value)


@pytest.mark.parametrize("problem", [
    Problem.make("m1", "math", "\\frac{1}{2}", None, None, "aime24", "Compute it."),
    Problem.make("c1", "code", None, [{"input": "1\n", "output": "2\n", "testtype": "stdin"}], None, "lcb"),
    Problem.make("c2", "code", None, [{"input": "[1, 2]", "output": "3", "testtype": "functional"}], "add"),
    Problem.make("n1", None, None, None, None),
])
def test_a_problem_row_reads_back_as_the_same_reference(problem: Problem) -> None:
    back = problem_from_row(problem_row(problem))
    assert back == problem and back is not None and back.reference_hash == problem.reference_hash
