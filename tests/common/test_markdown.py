"""Untrusted text in report.md (the Markdown summary the Kubeflow UI renders) shows as text: no HTML, no link,
no cell break. The one escaping rule, then the reports of real commands fed a hostile value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from klear.common.markdown import escape, escaped, markdown_report
from tests.commands import jsonl, klear

HOSTILE = "<img src=x onerror=alert(1)>|x"
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


def test_judge_report_escapes_sample_ids(tmp_path: Path) -> None:
    samples = jsonl(tmp_path / "s.jsonl", [{"id": pid, "sample": 0, "response": ANSWER, "finish_reason": "stop"}
                                            for pid in ("p0", HOSTILE)])
    problems = jsonl(tmp_path / "p.jsonl", [{"id": "p0", "answer": "4"}])
    done = klear("judge", "--samples", samples, "--problems", problems, "--output", str(tmp_path / "out"),
                  "--config", "tiny")
    assert done.returncode == 0, done.stderr[-2000:]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;&#124;x" in markdown  # shown, as text
    _check_safe(markdown)


def test_curate_report_escapes_source_names(tmp_path: Path) -> None:
    source = jsonl(tmp_path / f"{HOSTILE}.jsonl", [{"prompt": f"Compute {i} times {i} plus one, step by step."}
                                                    for i in range(3)])
    done = klear("curate", "--input", source, "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 0, done.stderr[-2000:]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "&lt;img" in markdown
    _check_safe(markdown)


def test_sft_data_report_escapes_sources(tmp_path: Path) -> None:
    samples = jsonl(tmp_path / "s.jsonl", [{"id": "p0", "sample": 0, "prompt": "2+2?", "response": ANSWER,
                                            "finish_reason": "stop", "source": HOSTILE,
                                            "record": {"id": "p0", "answer": "4"}}])
    done = klear("sft-data", "--samples", samples, "--output", str(tmp_path / "out"), "--config", "tiny")
    assert done.returncode == 0, done.stderr[-2000:]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "&lt;img" in markdown
    _check_safe(markdown)
