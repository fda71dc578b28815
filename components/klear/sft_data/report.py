"""The human-readable summary of an sft-data run (report.md), rendered from report.json's content."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import markdown_report

LABELS = ("correct", "incorrect", "unlabelled")


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    t = report["totals"]
    d = t["dropped"]
    lines = [
        "# SFT data",
        "",
        f"{t['read']} teacher responses read, **{t['kept']} kept** with policy `{report['policy']}`; dropped: "
        f"{d['truncated']} truncated, {d['too_long']} too long, {d['policy']} by the policy. "
        f"{t['unlabelled']} responses are unlabelled (their problem has no answer or tests).",
        "",
    ]
    missing = report.get("prompts_missing_from_reference")
    if report["reference"] and missing:  # a join that partly failed leads the report
        lines += [f"**Warning: {missing} teacher prompts have no samples in the reference** (ids such as "
                  f"{', '.join(report.get('prompts_missing_from_reference_ids', [])[:5])}): their difficulty is "
                  "unknown; check that the reference sampled the same prompts.", ""]
    lines += [
        "## What each policy keeps",
        "",
        "| policy | records |",
        "|---|---|",
        *[f"| {p}{' (chosen)' if p == report['policy'] else ''} | {n} |" for p, n in report["would_keep"].items()],
        "",
        "## Usable responses per source, difficulty and correctness",
        "",
        "| source | difficulty | correct | incorrect | unlabelled | kept |",
        "|---|---|---|---|---|---|",
    ]
    for source, levels in report["per_source"].items():
        for level, c in levels.items():
            kept = sum(report["kept_per_source"].get(source, {}).get(level, {}).values())
            lines.append(f"| {source} | {level} | " + " | ".join(str(c.get(k, 0)) for k in LABELS) + f" | {kept} |")
    diff = report["difficulty"]
    lines += ["", "## Difficulty", ""]
    if "note" in diff:
        lines.append(diff["note"] + ".")
    else:
        lines.append(f"Reference {diff['uri']}: {diff['samples']} samples of {diff['prompts']} prompts, pass rate over "
                     f"the first k={diff['k']} samples ({diff['prompts_with_fewer_than_k']} prompts have fewer). "
                     f"{report['prompts_missing_from_reference']} teacher prompts have no reference samples "
                     "(difficulty unknown).")
    length = report["length"]
    lines += ["", "## Length", "", length["note"] + ".", "",
              f"Usable responses: {length['count']}; min {length['min']}, median {length['median']}, p95 "
              f"{length['p95']}, max {length['max']} (histogram: token_lengths.png).", ""]
    return "\n".join(lines)
