"""The evaluation report.md escapes labels, notes and every table cell (the one rule of klear.common.markdown)."""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.common.test_markdown import HOSTILE, _check_safe


def test_evaluate_report_escapes_labels_and_notes(planted: dict[str, Any]) -> None:
    from klear.evaluate.report import render_markdown

    report = copy.deepcopy(planted["report"])
    old = report["labels"][0]
    report["labels"][0] = HOSTILE
    report["models"][HOSTILE] = report["models"].pop(old)
    report["figures"]["lengths"][HOSTILE] = report["figures"]["lengths"].pop(old)
    report["notes"] = [*report["notes"], f"a note naming {HOSTILE}"]
    for with_figures in (True, False):
        markdown = render_markdown(report, with_figures=with_figures)
        assert "&lt;img" in markdown
        _check_safe(re.sub(r"!\[[^\]]*\]\([^)]*\)", "", markdown))  # the figure links are the renderer's own
