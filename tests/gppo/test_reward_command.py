"""`klear reward`: one response or a JSONL of rollouts scored under a GPPO preset, with the reason; the rollouts a
real gppo run logged score again as they scored in training; malformed input is refused by file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.commands import klear

THOUGHT = "<think>\nAdd 40 and 2.\n</think>\n\n"
ADD_TESTS = [{"input": "2 3\n", "output": "5\n", "testtype": "stdin"},
             {"input": "40 2\n", "output": "42\n", "testtype": "stdin"}]
ADD_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)"


def score(*args: str) -> list[dict]:
    result = klear("reward", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def response_file(tmp_path: Path, text: str, name: str = "response.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("text", "reward", "reason"), [
    (THOUGHT + "So $\\boxed{42}$.", 1.0, "42"),
    (THOUGHT + "So $\\boxed{41}$.", -1.0, "41"),
    ("<think>\nAdd them: \\boxed{42}", -0.5, "missing </think>"),
    ("Add them.\n</think>\n\\boxed{42}", -2.0, "missing <think>"),
    ("The answer is \\boxed{42}.", -0.5, "missing </think>"),
])
def test_math_response_under_the_release_preset(tmp_path: Path, text: str, reward: float, reason: str) -> None:
    [line] = score("--config", "release-math", "--response", response_file(tmp_path, text), "--answer", "42")
    assert line["reward"] == reward and reason in line["reason"], line
    assert line["correct"] is (reward == 1.0)


def test_paper_and_release_rewards_of_one_response_differ(tmp_path: Path) -> None:
    wrong = response_file(tmp_path, THOUGHT + "So $\\boxed{41}$.")
    assert score("--config", "math", "--response", wrong, "--answer", "42")[0]["reward"] == 0.0  # paper: {0, 1}
    assert score("--config", "math", "--set", "reward.mode=official", "--response", wrong,
                 "--answer", "42")[0]["reward"] == -1.0


@pytest.mark.parametrize(("fence", "reward"), [("```python\n", 1.0), ("```py\n", -1.0), ("```\n", -1.0)])
def test_code_response_fences_under_the_release_preset(tmp_path: Path, fence: str, reward: float) -> None:
    tests = response_file(tmp_path, json.dumps(ADD_TESTS), "tests.json")
    text = THOUGHT + f"{fence}{ADD_PROGRAM}\n```\n"
    [line] = score("--config", "release-code", "--task", "code", "--response", response_file(tmp_path, text),
                   "--tests", tests)
    assert line["reward"] == reward, line
    if reward < 0:
        assert "python" in line["reason"], line  # says the block it looked for


def test_rollouts_a_gppo_run_logged_score_as_they_did_in_training(tiny_model: str, demo_files: list[str],
                                                                   tmp_path: Path, s3_bucket: str) -> None:
    """A real gppo run publishes to object storage; `--rollouts <its output>` rescores what it logged."""
    from klear.common import storage
    from klear.common.config import load_config
    from klear.gppo.config import GppoConfig
    from klear.gppo.stage import run

    config = load_config(GppoConfig, "tiny-math", ["max_steps=4", "rollout_log=4"])
    out = f"{s3_bucket}/run/gppo-math"
    run(tiny_model, demo_files[:1], out, config, work_dir=str(tmp_path / "work"))
    rows = [json.loads(line) for line in storage.read_bytes(f"{out}/logs/rollouts.jsonl").decode().splitlines()]
    assert len(rows) >= 8 and {"task", "response", "answer", "reward", "reason", "step"} <= set(rows[0])
    assert {r["step"] for r in rows} == {0, 2}  # tiny-math: a generation round per two optimizer steps
    lines = score("--config", "tiny-math", "--rollouts", out)
    assert [line["reward"] for line in lines] == [line["recorded_reward"] for line in lines] == [r["reward"] for r in rows]
    assert [line["reason"] for line in lines] == [r["reason"] for r in rows]


@pytest.mark.parametrize(("lines", "message"), [
    (['{"task": "math", "response": "x", "answer": "1"}', "{not json"], "rollouts.jsonl:2: malformed JSON"),
    (['{"task": "math", "response": "x"}'], "rollouts.jsonl:1: a math rollout needs field 'answer'"),
    (['{"task": "code", "response": "x", "tests": [{"input": "1"}]}'], "rollouts.jsonl:1: tests[0]: no 'output'"),
    (['{"task": "chess", "response": "x"}'], "rollouts.jsonl:1: field 'task' is 'chess'"),
    (['["math"]'], "rollouts.jsonl:1: expected a JSON object"),
])
def test_malformed_rollouts_are_refused_by_line_and_field(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = klear("reward", "--rollouts", str(path))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stdout == ""  # nothing scored when the input is bad


@pytest.mark.parametrize(("args", "message"), [
    (["--task", "math"], "--task math needs --answer"),
    (["--task", "code"], "--task code needs --tests FILE"),
    (["--task", "math", "--answer", "1", "--tests", "t.json"], "--tests is for --task code"),
])
def test_missing_or_contradicting_options_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    result = klear("reward", "--response", response_file(tmp_path, "x"), *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_a_missing_response_file_is_named(tmp_path: Path) -> None:
    result = klear("reward", "--response", str(tmp_path / "nope.txt"), "--answer", "1")
    assert result.returncode == 2 and "nope.txt" in result.stderr, result.stderr
