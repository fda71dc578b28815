"""The human-readable summary of a sample run (report.md) and its KFP metrics, from report.json's content."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import markdown_report


def metric_items(report: dict[str, Any]) -> list[tuple[str, float]]:
    units, tokens, speed = report["units"], report["tokens"], report["speed"]
    items = [("prompts", report["prompts"]["count"]), ("units", units["total"]), ("rows", units["rows"]),
             ("sampled", units["sampled"]), ("failed", units["failed"]), ("resumed", units["done_before"]),
             ("completion_tokens", tokens["completion"]), ("samples_per_s", speed["samples_per_s"]),
             ("tokens_per_s", speed["tokens_per_s"]), ("elapsed_s", speed["elapsed_s"]), ("retries", speed["retries"])]
    if tokens["truncated_fraction"] is not None:
        items.append(("truncated_fraction", tokens["truncated_fraction"]))
    return [(name, float(value)) for name, value in items]


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    units, tokens, speed, backend = report["units"], report["tokens"], report["speed"], report["backend"]
    config = report["config"]
    source = backend.get("served_model") and f"endpoint {backend.get('endpoint')} ({backend['served_model']})" \
        or backend.get("model") or backend["backend"]
    state = "complete" if report["complete"] else ("published with failed units" if report["published"]
                                                   else "NOT published: too many failed units")
    lines = [
        "# Sampling",
        "",
        f"**{units['rows']} samples** of {report['prompts']['count']} prompts ({units['total']} units: "
        f"{units['done_before']} done before this run, {units['sampled']} sampled now, {units['failed']} failed) "
        f"— {state}.",
        "",
        f"Backend: {backend['backend']}, {source}. Settings hash `{report['settings_hash']}`.",
        "",
        "| setting | value |",
        "|---|---|",
    ]
    sent = report.get("settings", {}).get("sampling") or {}  # as the server received them (extra_body included)
    for key in ("n", "temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed", "system_prompt"):
        lines.append(f"| {key} | {sent.get(key, config[key])!r} |")
    lines += [
        "",
        "| figure | value |",
        "|---|---|",
        f"| prompt tokens | {tokens['prompt']} |",
        f"| completion tokens | {tokens['completion']} |",
        f"| mean completion tokens | {tokens['mean_completion']} |",
        f"| cut at max_tokens | {tokens['truncated_fraction']} |",
        f"| finish reasons | {tokens['finish_reasons']} |",
        f"| samples/s (this run) | {speed['samples_per_s']} |",
        f"| tokens/s (this run) | {speed['tokens_per_s']} |",
        f"| requests / retries | {speed['requests']} / {speed['retries']} |",
        f"| time | {speed['elapsed_s']} s |",
    ]
    if "process_cpu_s" in speed:  # reports before it was recorded have none
        lines.insert(-1, f"| CPU of this process while sampling | {speed['process_cpu_s']} s |")
    if "own_work_s" in speed:
        lines.insert(-1, f"| sampling thread's own work (shards, bookkeeping) | {speed['own_work_s']} s of "
                         f"{speed['sampling_s']} s |")
    if units.get("model_mismatch"):
        lines += ["", f"**{units['model_mismatch']} samples name another model than "
                  f"{backend.get('served_model')!r}** (allow_model_mismatch): {report.get('models')}"]
    failures = report["failures"]
    if failures["by_kind"]:
        lines += ["", "## Failed units", "", "| kind | units |", "|---|---|"]
        lines += [f"| {kind} | {count} |" for kind, count in sorted(failures["by_kind"].items())]
        lines += ["", "First failures (all are in failed/):", ""]
        # No code span around the id: entities (the escaped id) show literally inside one.
        lines += [f"- {u['id']} #{u['sample']} after {u['attempts']} attempts: {u['error_kind']}: {u['error'][:200]}"
                  for u in failures["units"][:10]]
    lines.append("")
    return "\n".join(lines)
