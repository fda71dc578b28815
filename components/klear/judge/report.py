"""The human-readable summary of a judge run (report.md), rendered from report.json's content."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import escape, markdown_report


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    t = report["totals"]
    lines = [
        "# Judged samples",
        "",
        f"{t['samples']} samples of {t['problems']} problems judged ({report['elapsed_s']} s, "
        f"{report['workers']} workers per task kind); {t['reused']} scores reused from an interrupted run.",
        "",
    ]
    if t["unknown_problem"]:
        lines += [f"**Warning: {t['unknown_problem']} of {t['samples']} samples match no problem** and count as wrong "
                  f"(ids such as {', '.join(report['unknown_problem_ids'][:5])}): check the problems' id field.", ""]
    lines += [
        "| task | samples | correct | accuracy | problems | mean pass rate |",
        "|---|---|---|---|---|---|",
    ]
    for kind, k in report["per_kind"].items():
        lines.append(f"| {kind} | {k['samples']} | {k['correct']} | {_pct(k['accuracy'])} | {k['problems']} | "
                     f"{_pct(k['mean_pass_rate'])} |")
    lines += _math_modes(report)
    lines += ["", "## Verdicts", "", "| task | verdict | samples |", "|---|---|---|"]
    for kind, verdicts in report["verdicts"].items():
        for verdict, n in sorted(verdicts.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {kind} | {verdict} | {n} |")
    lines += [
        "",
        f"Budget overruns (worker killed, counted wrong): {t['budget_timeout']}; scorer errors: {t['scorer_error']}; "
        f"samples of problems without answer or tests: {t['no_reference']}; samples whose id is not among the "
        f"problems: {t['unknown_problem']}.",
        "",
        "Pass rates per problem: `pass_rates/`; their histogram: `pass_rate_hist.png`.",
        "",
    ]
    return "\n".join(lines)


_MODE_RULES = {mode: escape(rule) for mode, rule in {  # template text with tags and backslashes: escaped too
    "strict": "the last \\boxed{} after </think>; truncated or without </think>: wrong",
    "official": "as the released judge_math.py: math-verify on the whole response (last box anywhere, else the last "
                "number), finish reason ignored",
}.items()}


def _math_modes(report: dict[str, Any]) -> list[str]:
    """The math judging mode, and the accuracy under each mode of `report_modes` side by side."""
    mode = report.get("math_mode")
    if mode is None:  # a report of an older run
        return []
    lines = ["", f"Math judged in mode **{mode}**: {_MODE_RULES.get(mode, mode)}."]
    modes = report.get("math_modes") or {}
    if len(modes) > 1:
        lines += ["", "| math mode | samples | correct | accuracy | rule |", "|---|---|---|---|---|"]
        for name, m in modes.items():
            lines.append(f"| {name}{' (verdicts above)' if name == mode else ''} | {m['samples']} | {m['correct']} | "
                         f"{_pct(m['accuracy'])} | {_MODE_RULES.get(name, name)} |")
    return lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
