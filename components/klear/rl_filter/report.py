"""The human-readable summary of an rl-filter run (report.md), rendered from report.json's content."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import markdown_report

WHY = {
    "contaminated": "shares an n-gram with a test set",
    "short_match": "shorter than n words, found inside a test item",
    "duplicate": "exact duplicate of an earlier problem",
    "duplicate_id": "id seen before (its samples could not be told apart)",
    "no_answer": "no reference answer",
    "no_tests": "no test cases",
    "few_tests": "fewer test cases than min_tests",
    "no_samples": "no filter-model samples",
    "few_samples": "fewer samples than min_samples",
    "low_pass_rate": "pass rate not above keep_above",
    "too_hard": "pass rate below the band",
    "too_easy": "pass rate above the band",
}


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    t = report["totals"]
    lines = [
        "# RL data filter",
        "",
        f"{t['problems']} problems read, **{t['kept']} kept**, {t['removed']} removed. Rule: {report['rule']}.",
        "",
    ]
    orphans = report["orphan_samples"]
    if orphans["count"]:  # a join that partly failed leads the report (wrong ids, or samples of another set)
        lines += [f"**Warning: {orphans['count']} of {report['samples_read']} samples belong to no problem** and were "
                  f"not judged (ids such as {', '.join(orphans['ids'][:5])}): check the problems' id field.", ""]
    lines += [
        "| reason | problems | meaning |",
        "|---|---|---|",
        *[f"| {r} | {n} | {WHY.get(r, '')} |" for r, n in report["reasons"].items()],
        "",
        "## Per source",
        "",
        "| source | read | kept | removed by reason |",
        "|---|---|---|---|",
    ]
    for source, c in report["per_source"].items():
        why = ", ".join(f"{r} {n}" for r, n in sorted(c.items()) if r not in ("read", "kept"))
        lines.append(f"| {source} | {c.get('read', 0)} | {c.get('kept', 0)} | {why or '-'} |")
    lines += [
        "",
        "## Samples",
        "",
        f"{report['samples_read']} filter-model samples read, {report['samples_judged']} judged; "
        f"{report['samples_of_dropped_problems']} belong to problems dropped before judging; {orphans['count']} have "
        f"an id that is not among the problems (not judged{', e.g. ' + ', '.join(orphans['ids'][:5]) if orphans['ids'] else ''}). "
        f"Budget overruns: {report['judge']['budget_timeouts']}, scorer errors: {report['judge']['scorer_errors']}.",
        "",
        "Pass-rate histogram of the kept and removed problems: pass_rate_hist.png.",
        "",
    ]
    return "\n".join(lines)
