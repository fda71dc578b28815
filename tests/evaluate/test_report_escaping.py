"""The evaluation report.md escapes labels, notes and every table cell (the one rule of klear.common.markdown)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klear.common.markdown import escape
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


def _evaluate_with_upstream(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> tuple[str, str]:
    """`klear evaluate` on samples made from an output whose manifest meta `change` then edited in place.
    Returns report.md and the command's stderr."""
    from klear.common import lineage, storage
    from tests.commands import klear
    from tests.evaluate.helpers import publish_samples
    from tests.evaluate.test_scores import TOY, _benchmark, planted_rows

    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "prompts.jsonl").write_text('{"id": "t1", "prompt": "Compute t1."}\n')
    upstream = str(tmp_path / "curated")
    storage.publish_dir(staging, upstream, meta={"stage": "curate", "lineage": lineage.record([], None)})
    samples = str(tmp_path / "samples")
    publish_samples(planted_rows(), samples, inputs=[upstream])  # the samples' lineage names the upstream
    manifest = Path(upstream) / storage.MANIFEST_NAME
    body = json.loads(manifest.read_text())
    change(body["meta"])
    manifest.write_text(json.dumps(body))
    args = [arg for item in TOY for arg in ("--set", item)]
    done = klear("evaluate", "--samples", f"sft={samples}", "--benchmark", _benchmark(tmp_path),
                 "--output", str(tmp_path / "eval"), "--config", "tiny", *args)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return (tmp_path / "eval" / "report.md").read_text(), done.stderr


def test_a_stage_forged_upstream_of_the_samples_shows_as_text_in_report_md(tmp_path: Path) -> None:
    """The stage name closes a fence and opens HTML: report.md's lineage table and Mermaid graph show it as text."""
    from tests.common.test_markdown import FORGED_STAGE, rendered_markup

    markdown, _ = _evaluate_with_upstream(tmp_path, lambda meta: meta.update(stage=FORGED_STAGE))
    assert escape(FORGED_STAGE) in markdown  # the lineage table's cell
    assert "flowchart TD" in markdown
    _check_safe(re.sub(r"!\[[^\]]*\]\([^)]*\)", "", markdown))  # the figure links are the renderer's own
    assert [found for found in rendered_markup(markdown) if not found.startswith("image")] == []


def test_malformed_lineage_upstream_of_the_samples_is_named_in_report_md(tmp_path: Path) -> None:
    markdown, stderr = _evaluate_with_upstream(tmp_path, lambda meta: meta["lineage"].update(inputs="notalist"))
    named = f"{tmp_path}/curated/_MANIFEST.json: meta.lineage.inputs must be a list, not str 'notalist'"
    assert named in stderr
    assert escape(f"malformed lineage: {named}") in markdown  # the lineage table's settings or notes
