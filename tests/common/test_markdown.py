"""Untrusted text in report.md (the Markdown summary the Kubeflow UI renders) shows as text: no HTML, no link,
no cell break. The one escaping rule, then the reports of real commands fed a hostile value."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from klear.common.markdown import escape, escaped, fence, markdown_report
from tests.commands import data_stages, jsonl, klear, training_stages

HOSTILE = "<img src=x onerror=alert(1)>|x"
# A stage name forged in an upstream manifest that closes a code fence and opens HTML (issue #31).
FORGED_STAGE = "curate\n```\n<img src=x onerror=alert(7)>\n```"
ANSWER = "<think>\nTwo and two.\n</think>\n\n$\\boxed{4}$"


def _check_safe(markdown: str) -> None:
    """No raw HTML from data, and every table row has its header's number of cells."""
    assert "<" not in markdown, [line for line in markdown.splitlines() if "<" in line]
    header_cells = None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            header_cells = None
            continue
        cells = line.count("|")
        if header_cells is None:
            header_cells = cells
        assert cells == header_cells, f"a row with {cells} pipes under a header with {header_cells}: {line}"


def rendered_markup(markdown: str) -> list[str]:
    """What a CommonMark renderer (markdown-it, the parser behind rich) turns into HTML or links rather than text,
    and any "<" in a Mermaid block (Mermaid renders its labels' markup): [] when none."""
    from markdown_it import MarkdownIt

    found = []
    tokens = MarkdownIt("commonmark").parse(markdown)
    while tokens:
        token = tokens.pop()
        if token.type in ("html_block", "html_inline", "link_open", "image"):
            found.append(f"{token.type}: {token.content or token.attrGet('href') or token.attrGet('src')}")
        if token.type == "fence" and token.info == "mermaid" and "<" in token.content:
            found.append(f"mermaid: {token.content}")
        tokens += token.children or []
    return found


def fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """(info, content) of every fenced code block, as a CommonMark renderer reads them."""
    from markdown_it import MarkdownIt

    return [(t.info, t.content) for t in MarkdownIt("commonmark").parse(markdown) if t.type == "fence"]


@pytest.mark.parametrize("text", ["plain", FORGED_STAGE, "````\n<b>x</b>\n`````", "`", "a ``` b\n```"])
def test_no_line_of_fenced_text_closes_its_fence(text: str) -> None:
    markdown = f"before\n\n{fence(text, 'json')}\n\n<after>"
    assert fenced_blocks(markdown) == [("json", text + "\n")]
    assert rendered_markup(markdown) == ["html_block: <after>"]  # the checker sees markup outside the fence


@pytest.mark.parametrize(("text", "shown"), [
    (HOSTILE, "&lt;img src=x onerror=alert(1)&gt;&#124;x"),
    ("[click](javascript:alert(1))", "&#91;click&#93;(javascript:alert(1))"),
    ("a\\|b", "a&#92;&#124;b"),
    ("two\nlines", "two lines"),
    ("`code` & more", "&#96;code&#96; &amp; more"),
    ("plain_text-1.5%", "plain_text-1.5%"),
])
def test_escape(text: str, shown: str) -> None:
    assert escape(text) == shown


def test_escaped_values_survive_repr() -> None:
    """A renderer may print a dict or a quoted value: the escapes must not depend on backslashes."""
    value = escaped({"a|b": ["x|y\\", 3, None, True]})
    assert value == {"a&#124;b": ["x&#124;y&#92;", 3, None, True]}
    assert "|" not in repr(value) and "\\" not in repr(value)


def test_a_declared_renderer_sees_only_escaped_strings() -> None:
    @markdown_report
    def render(report: dict[str, Any], suffix: str = "") -> str:
        return f"| {report['id']} | {report['n']:.1f} |{suffix}"

    assert render({"id": HOSTILE, "n": 2}, suffix="!") == "| &lt;img src=x onerror=alert(1)&gt;&#124;x | 2.0 |!"


def _judge(tmp_path: Path) -> list[str]:
    """An id matching no problem leads the report."""
    samples = jsonl(tmp_path / "s.jsonl", [{"id": pid, "sample": 0, "response": ANSWER, "finish_reason": "stop"}
                                            for pid in ("p0", HOSTILE)])
    return ["judge", "--samples", samples, "--problems", jsonl(tmp_path / "p.jsonl", [{"id": "p0", "answer": "4"}])]


def _sample(tmp_path: Path) -> list[str]:
    """The settings table shows the system prompt sent."""
    prompts = jsonl(tmp_path / "prompts.jsonl", [{"id": HOSTILE, "prompt": "What is 2+2?", "response": ANSWER}])
    return ["sample", "--prompts", prompts, "--set", "backend=records", "--set", f"system_prompt={HOSTILE}"]


def _sft_data(tmp_path: Path) -> list[str]:
    """Sources head table rows."""
    samples = jsonl(tmp_path / "s.jsonl", [{"id": "p0", "sample": 0, "prompt": "2+2?", "response": ANSWER,
                                            "finish_reason": "stop", "source": HOSTILE,
                                            "record": {"id": "p0", "answer": "4"}}])
    return ["sft-data", "--samples", samples]


def _rl_filter(tmp_path: Path) -> list[str]:
    """Sources head table rows; a sample id among no problem is listed."""
    problems = jsonl(tmp_path / "p.jsonl", [{"id": "p0", "problem": "What is two plus two? Answer with a whole number.",
                                             "answer": "4", "source": HOSTILE}])
    samples = jsonl(tmp_path / "s.jsonl", [{"id": pid, "sample": k, "response": ANSWER, "finish_reason": "stop"}
                                            for pid in ("p0", HOSTILE) for k in range(2)])
    return ["rl-filter", "--problems", problems, "--samples", samples, "--task", "math"]


def _evaluate(tmp_path: Path) -> list[str]:
    """The notes name sample ids of no benchmark problem."""
    bench = jsonl(tmp_path / "toy.jsonl", [{"id": pid, "benchmark": "toy", "problem": f"Compute {pid}.", "answer": "4"}
                                           for pid in ("t1", "t2")])
    samples = jsonl(tmp_path / "s.jsonl", [{"id": pid, "sample": k, "response": ANSWER, "finish_reason": "stop"}
                                            for pid in ("t1", "t2", HOSTILE) for k in range(2)])
    return ["evaluate", "--samples", samples, "--benchmark", bench, "--set", "benchmarks.toy.kind=math",
            "--set", "benchmarks.toy.k=2", "--set", "benchmarks.toy.title=Toy", "--set", "only=[toy]"]


def _curate(tmp_path: Path) -> list[str]:
    """A source's name (its file's) heads a table row."""
    source = jsonl(tmp_path / f"{HOSTILE}.jsonl", [{"prompt": f"Compute {i} times {i} plus one, step by step."}
                                                    for i in range(3)])
    return ["curate", "--input", source]


def _named_input(command: str) -> Callable[[Path], list[str]]:
    """A stage whose report names its `--input` files (as `make new-stage` generates one): the file is named HOSTILE."""
    def arguments(tmp_path: Path) -> list[str]:
        return [command, "--input", jsonl(tmp_path / f"{HOSTILE}.jsonl", [{"prompt": "Compute 2 plus 2."}])]

    return arguments


# The arguments that put the hostile value into each data stage's report, by stage (make new-stage adds a line).
HOSTILE_INPUTS: dict[str, Callable[[Path], list[str]]] = {
    "curate": _curate,
    "sample": _sample,
    "judge": _judge,
    "sft-data": _sft_data,
    "rl-filter": _rl_filter,
    "evaluate": _evaluate,
}


@pytest.mark.parametrize("stage", data_stages())
def test_every_data_stage_report_shows_hostile_text_as_text(tmp_path: Path, stage: str) -> None:
    """The real command on inputs holding the hostile value: it reaches report.md, escaped, and breaks no table."""
    command = HOSTILE_INPUTS.get(stage)
    assert command is not None, (f"data stage {stage}: add the arguments that put HOSTILE into its report to "
                                 "HOSTILE_INPUTS in tests/common/test_markdown.py")
    done = klear(*command(tmp_path), "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert escape(HOSTILE) in markdown, markdown  # the value is shown, as text
    _check_safe(re.sub(r"!\[[^\]]*\]\([^)]*\)", "", markdown))  # evaluate's figure links are its own


@pytest.mark.parametrize("stage", training_stages())
def test_every_training_report_escapes_its_values(stage: str) -> None:
    """A training stage writes report.md beside the model (no command trains in seconds): its renderer, run on a
    report whose every kind of value is hostile, escapes as the data stages' do."""
    import importlib

    from klear.cli import COMMANDS

    render = importlib.import_module(COMMANDS[stage]).STAGE.render_markdown
    report = {"data": {"read": 3, "kept": 2, "tokens": 10, "skipped": {HOSTILE: 1}},
              "training": {"global_step": 1, "max_steps": 1, "resumed_from_step": 0, "epochs": 1.0,
                           "reward_timeouts": 0, "fill_ratio_min": 1.0},
              "history": [{"step": 1.0, "reward": 0.5}], "metrics": {HOSTILE: 0.5},
              "config": {"task": HOSTILE, "loss": "gppo", "eps_low": 0.2, "eps_high": 0.28, "sft_alpha": 0.1}}
    markdown = render(report)
    assert escape(HOSTILE) in markdown
    _check_safe(markdown)


def test_sample_failures_show_ids_as_text(tmp_path: Path) -> None:
    """Failed units are listed outside code spans (where the escaped entities would show literally)."""
    from klear.sample.report import render_markdown

    done = klear(*_sample(tmp_path), "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    report["failures"] = {"by_kind": {HOSTILE: 1}, "units": [
        {"id": HOSTILE, "sample": 0, "attempts": 2, "error_kind": "http", "error": f"{HOSTILE}\nsecond line"}]}
    markdown = render_markdown(report)
    assert f"- {escape(HOSTILE)} #0 after 2 attempts: http: {escape(HOSTILE)} second line" in markdown, markdown
    _check_safe(markdown)
