"""The evaluation report a person reads: report.md and a self-contained report.html (figures inlined as base64),
both rendered from report.json's content. The KFP UI shows the Markdown (without figures) and the HTML."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from klear.common.markdown import escape, fence

__all__ = ["flatten", "math_modes_table", "render_html", "render_markdown", "summary_table"]

Table = tuple[list[str], list[list[str]]]


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _score(block: Mapping[str, Any] | None) -> str:
    if not block:
        return "not sampled"
    stderr = block.get("stderr")
    return f"{block['pass@1']:.1f} ± {stderr:.1f}" if stderr is not None else f"{block['pass@1']:.1f}"


def flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested settings as (dotted key, JSON-ish value) rows; lists of scalars stay one value."""
    if isinstance(value, Mapping) and value:
        rows: list[tuple[str, str]] = []
        for key, item in value.items():
            rows += flatten(item, f"{prefix}{key}.")
        return rows
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return [(prefix.rstrip("."), text)]


def summary_table(report: Mapping[str, Any]) -> Table:
    """Benchmarks down, labels and the paper's rows across: pass@1 ± standard error (percent)."""
    labels = report["labels"]
    paper = report.get("paper", {})
    headers = ["benchmark", "k", "problems", *labels, *paper]
    rows = []
    for name, protocol in report["settings"]["protocol"].items():
        blocks = [report["models"][label]["benchmarks"].get(name) for label in labels]
        problems = next((b["problems"] for b in blocks if b), protocol.get("problems", 0))
        rows.append([protocol["title"], str(protocol["k"]), str(problems), *[_score(b) for b in blocks],
                     *[_num(values.get(name)) for values in paper.values()]])
    return headers, rows


def math_modes_table(report: Mapping[str, Any]) -> Table | None:
    """Math pass@1 ± stderr under each judging mode of judge.report_modes, the run's own first, beside Table 1;
    None when only one mode was judged."""
    modes = report.get("math_modes") or {}
    other = modes.get("other") or {}
    names = sorted({mode for by_mode in other.values() for mode in by_mode})
    if not names:
        return None
    paper = report.get("paper", {})
    headers = ["model", "benchmark", f"{modes['mode']} (scores above)", *names, *paper]
    rows = []
    for label in report["labels"]:
        for name, block in report["models"][label]["benchmarks"].items():
            if block["kind"] != "math":
                continue
            rows.append([label, block["title"], _score(block), *[_score(other.get(label, {}).get(m, {}).get(name))
                                                                   for m in names],
                         *[_num(values.get(name)) for values in paper.values()]])
    return headers, rows


def detail_table(report: Mapping[str, Any], label: str) -> Table:
    model = report["models"][label]
    ks = sorted({k for b in model["benchmarks"].values() for k in b["pass@k"] if k != "1"}, key=int)  # 1: pass@1
    headers = ["benchmark", "pass@1", "stderr", *[f"pass@{k}" for k in ks], "truncated", "mean tokens", "verdicts"]
    rows = []
    for b in model["benchmarks"].values():
        verdicts = ", ".join(f"{v} {n}" for v, n in b["verdicts"].items())
        rows.append([b["title"], _num(b["pass@1"]), _num(b["stderr"]), *[_num(b["pass@k"].get(k)) for k in ks],
                     f"{100 * b['truncated']:.1f}%", _num(b["mean_response_tokens"], 0), verdicts])
    return headers, rows


def _protocol_table(report: Mapping[str, Any]) -> Table:
    """Per benchmark: what was run and how it was judged (judging mode, prompt template, sampling extras, execution
    rules), beside the paper's Table 1 values; a gap to Table 1 reads against these."""
    paper = report.get("paper", {})
    headers = ["benchmark", "name", "kind", "k (avg@k)", "window (days, inclusive)", "problems", "judging", "prompt",
               "sampling", "execution", *[f"Table 1: {row}" for row in paper]]
    rows = [[p["title"], name, p["kind"], str(p["k"]), " .. ".join(p["window"]) if p.get("window") else "-",
             str(p.get("problems", 0)), str(p.get("judging") or "-"), str(p.get("prompt") or "-"),
             str(p.get("sampling_extras") or "-"), str(p.get("execution") or "-"),
             *[_num(values.get(name)) for values in paper.values()]]
            for name, p in report["settings"]["protocol"].items()]
    return headers, rows


def _sources_table(report: Mapping[str, Any]) -> Table:
    headers = ["label", "samples", "made by", "recorded sampling", "prompts", "check"]
    rows = []
    for label, sources in report["settings"]["samples"].items():
        for s in sources:
            recorded = s.get("sampling")
            shown = ", ".join(f"{k}={v}" for k, v in recorded.items()) if recorded else "unknown"
            prompts = (s.get("prompts") or {}).get("check", "not checked")  # the rows' prompts vs the protocol's
            rows.append([label, s["uri"], s.get("stage") or "file", shown, prompts, s["check"]])
    return headers, rows


def _files_table(report: Mapping[str, Any]) -> Table:
    headers = ["benchmark file", "rows", "math rows", "LiveCodeBench rows", "problems used"]
    rows = [[f["uri"], str(f["rows"]), str(f["math"]), str(f["code"]), str(f["used"])]
            for f in report["settings"]["benchmark_files"]]
    return headers, rows


def _settings_rows(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    s = report["settings"]
    rows = flatten(s["sampling"], "sampling.") + flatten(s["official_extras"], "official_extras.")
    rows += [("settings_check", s["settings_check"]), ("math prompt", s["math_template"]),
             ("code prompt", s["code_prompt"]), ("math judging", s["math_judging"]), ("code judging", s["code_judging"])]
    rows += flatten(s["scoring"], "scoring.") + flatten(s["judge"], "judge.")
    return rows


# --------------------------------------------------------------------------- Markdown


def _md_table(table: Table) -> list[str]:
    headers, rows = table
    lines = ["| " + " | ".join(escape(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return lines


def _lead(report: Mapping[str, Any]) -> str:
    return (f"Models: {', '.join(report['labels'])}. pass@1 is avg@k in percent (the mean over problems of the fraction "
            f"of its first k samples that are correct), ± the standard error over problems. "
            f"{report['settings']['scoring']['selection']}")


def _lineage_table(report: Mapping[str, Any]) -> Table:
    """Each step from the scored samples back to the source prompts (klear.common.lineage), nearest first."""
    rows = [[step["stage"] or "source", step["uri"], (step["digest"] or "-")[:12],
             json.dumps(step["settings"], sort_keys=True, default=str),
             ", ".join(f"{e['role']}: {e['uri']}" + (" (changed since)" if e["changed"] else "") for e in step["inputs"]),
             step.get("note") or ""]  # a source's, or what of its manifest's lineage is malformed
            for step in report.get("lineage", {}).get("steps", [])]
    return ["stage", "output", "digest", "key settings", "made from", "note"], rows


def render_markdown(report: Mapping[str, Any], with_figures: bool = True) -> str:
    # Every value from data goes through the one escaping rule (klear.common.markdown): tables cell by cell.
    lines = ["# Evaluation", "", escape(_lead(report)), "", "## Scores", "", *_md_table(summary_table(report)), ""]
    modes = math_modes_table(report)
    if modes is not None:
        lines += ["## Math judging modes", "", *_md_table(modes), ""]
    for label in report["labels"]:
        model = report["models"][label]
        lines += [f"## {escape(label)}", ""]
        if model["benchmarks"]:
            lines += [*_md_table(detail_table(report, label)), ""]
        if model["not_sampled"]:
            lines += [f"Not sampled (no sample of any of their problems): {escape(', '.join(model['not_sampled']))}.",
                      ""]
    if report["notes"]:
        lines += ["## Notes", "", *[f"- {escape(note)}" for note in report["notes"]], ""]
    lines += ["## Protocol", "", *_md_table(_protocol_table(report)), "", "## Settings", "",
              *_md_table((["setting", "value"], [list(r) for r in _settings_rows(report)])), "",
              "## Samples", "", *_md_table(_sources_table(report)), "",
              "## Benchmark files", "", *_md_table(_files_table(report)), ""]
    if report.get("lineage"):  # the Mermaid labels are plain words (klear.common.lineage), in a fence none can close
        lines += ["## Lineage", "", *_md_table(_lineage_table(report)), "", fence(report["lineage"]["mermaid"], "mermaid"),
                  ""]
    figures = report["figures"]
    if with_figures:
        lines += ["## Figures", "", f"![scores]({figures['scores']})", "", f"![pass counts]({figures['pass_counts']})", ""]
        lines += [f"![lengths {escape(label)}]({quote(name)})" for label, name in figures["lengths"].items()] + [""]
    else:
        lines += ["Figures (scores with error bars, response lengths, per-problem pass counts): in the HTML report.", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- HTML

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #1b1b1b; }
h1 { margin-top: 0; } h2 { margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f2f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #eee; margin: 8px 0; }
.lead { max-width: 980px; } code { background: #f4f4f4; padding: 0 3px; }
"""


def _html_table(table: Table, numeric_from: int = 1) -> str:
    headers, rows = table
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    numeric = ' class="num"'
    body = "".join("<tr>" + "".join(
        f"<td{numeric if i >= numeric_from else ''}>{html.escape(c)}</td>" for i, c in enumerate(row))
        + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _problems_table(problems: Sequence[Mapping[str, Any]]) -> Table:
    headers = ["label", "benchmark", "problem", "correct", "k", "truncated", "mean tokens", "difficulty", "date"]
    rows = [[p["label"], p["benchmark"], p["id"], str(p["correct"]), str(p["k"]), str(p["truncated"]),
             _num(p["mean_completion_tokens"], 0), p.get("difficulty") or "", p.get("contest_date") or ""]
            for p in problems]
    return headers, rows


def render_html(report: Mapping[str, Any], figures_dir: Path, problems: Sequence[Mapping[str, Any]] = ()) -> str:
    """One self-contained page: every table of report.md, the figures as data: URIs, the per-problem counts."""
    figures = report["figures"]
    parts = [f"<h1>Evaluation</h1><p class='lead'>{html.escape(_lead(report))}</p>",
             "<h2>Scores</h2>", _html_table(summary_table(report)),
             _img(figures_dir / figures["scores"], "scores with error bars beside the paper's Table 1")]
    modes = math_modes_table(report)
    if modes is not None:
        parts += ["<h2>Math judging modes</h2>", _html_table(modes, numeric_from=2)]
    for label in report["labels"]:
        model = report["models"][label]
        parts.append(f"<h2>{html.escape(label)}</h2>")
        if model["benchmarks"]:
            parts.append(_html_table(detail_table(report, label)))
        if model["not_sampled"]:
            parts.append(f"<p>Not sampled (no sample of any of their problems): "
                         f"{html.escape(', '.join(model['not_sampled']))}.</p>")
        if label in figures["lengths"]:
            parts.append(_img(figures_dir / figures["lengths"][label], f"response lengths of {label}"))
    parts += ["<h2>Per-problem pass counts</h2>", _img(figures_dir / figures["pass_counts"], "per-problem pass counts")]
    if problems:
        parts.append(f"<details><summary>All {len(problems)} problem rows</summary>"
                     f"{_html_table(_problems_table(problems), numeric_from=3)}</details>")
    if report["notes"]:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in report["notes"]) + "</ul>")
    parts += ["<h2>Protocol</h2>", _html_table(_protocol_table(report), numeric_from=3),
              "<h2>Settings</h2>", _html_table((["setting", "value"], [list(r) for r in _settings_rows(report)]), 9),
              "<h2>Samples</h2>", _html_table(_sources_table(report), 9),
              "<h2>Benchmark files</h2>", _html_table(_files_table(report))]
    if report.get("lineage"):
        parts += ["<h2>Lineage</h2>", _html_table(_lineage_table(report), 9),
                  "<p>The chain as a Mermaid flowchart (<code>klear lineage URI --format mermaid</code> prints it):</p>",
                  f"<pre class='mermaid'>{html.escape(report['lineage']['mermaid'])}</pre>"]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>Klear evaluation</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>\n")
