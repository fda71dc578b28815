"""Entry point of the evaluate stage: scores of saved generations on AIME, HMMT and LiveCodeBench, with a report.

    klear evaluate --samples [LABEL=]URI [...] --output URI [--benchmark URI ...] [--config PRESET|FILE]
    klear evaluate --model [LABEL=]URI --output URI [--sample-output URI] [--benchmark URI ...] [--config ...]
    klear evaluate-prompts --output URI [--benchmark URI ...] [--config ...]
    klear evaluate-problems --output URI [--benchmark URI ...] [--config ...]

Samples are rows of `klear sample` (published outputs or Parquet/JSONL files); `--samples sft=URI rl=URI` puts
models side by side (unlabeled: "model"; one label may have several sources, e.g. its math and its code samples).
Problems, gold answers and tests come from the `--benchmark` files, joined on `id`, never from the sample rows:
math sets (`id`, `benchmark`, `problem`, `answer`; the shipped AIME24/AIME25/HMMT25 when no math set is given)
and LiveCodeBench `code_generation_lite` JSONL (`question_id` is the id), which fall into the code benchmarks by
`contest_date` (day level, both ends included; problems outside every window are not scored).

Each problem counts its first k samples by sample index (k of its benchmark: 64 for AIME/HMMT, 8 for
LiveCodeBench in the paper preset); fewer is an error naming the problems. Judging is klear.judge's: math on the
last \\boxed{} after </think>, code as LiveCodeBench does (public + private tests, stop at the first failure,
6 s per test, correct only if all pass); truncated responses are wrong. Samples whose recorded sampling settings
differ from the protocol (a judge output's: those of the samples it judged), or whose rows were asked other prompts
than the protocol's template gives, are refused (settings_check=warn reports them instead). `--model` (or `--endpoint`)
samples first through klear.sample (one output per (kind, k) group under --sample-output, default
<output>.samples), then scores; scoring never samples. Publishes, manifest last:

    report.json         {"benchmarks": {name: {k, problems, pass@1, stderr, pass@k, truncated, ...}}, "models": {label:
                        ...}, "settings": {...every setting...}, "notes": [...]}
    report.md, report.html (self-contained), scores.png, pass_counts.png, lengths-<label>.png
    problems.parquet    per label, benchmark and problem: correct of k, truncated, tokens, verdicts
    judged.parquet      per judged sample: label, id, sample, correct, verdict, passed, total, finish_reason, tokens

`evaluate-prompts` publishes the prompts the protocol samples (`<kind>-k<k>.jsonl`, with a sample-stage config
`sampling-<kind>-k<k>.yaml` each), for pipelines that run the sample stage as its own step. `evaluate-problems`
publishes the problems evaluate judges against (`problems.jsonl`: id, answer, tests, fn_name, as klear.judge reads
them back), for a judge step in front of evaluate (`klear judge --problems URI` with the config's judge section):
evaluate then takes its verdicts as they are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from klear.common import lineage, model_card, storage
from klear.common.config import ConfigError
from klear.common.data_stage import DataStage
from klear.common.sample_rows import file_tables
from klear.evaluate import plots
from klear.evaluate.benchmarks import BenchmarkSet, load_benchmarks
from klear.evaluate.config import EvaluateConfig
from klear.evaluate.modes import mode_scores
from klear.evaluate.paper import TABLE1
from klear.evaluate.report import render_html, render_markdown
from klear.evaluate.samples import LocalSource, SampleError, SampleSource, open_source, parse_sample_specs, read_keys, read_rows
from klear.evaluate.scoring import ProblemScore, SampleScore, Selection, score_benchmarks, select_samples
from klear.judge import Judge, Judgement
from klear.judge.io import JUDGE_COLUMNS, ScoreStore, fingerprint, references_key, settings_key
from klear.judge.modes import ModeComparison
from klear.judge.problems import problem_from_row, problem_row
from klear.sample.config import SampleConfig
from klear.verifiers.config import VerifierConfig

__all__ = ["check_sampling", "judge_problem_rows", "prompt_groups", "run", "sample_overrides", "sample_then_run",
           "write_problems", "write_prompts"]

log = logging.getLogger("klear.evaluate")
STAGE = DataStage("evaluate", EvaluateConfig, render_markdown)
PROMPTS_STAGE = DataStage("evaluate-prompts", EvaluateConfig)  # report.json only
PROBLEMS_STAGE = DataStage("evaluate-problems", EvaluateConfig)  # report.json only

SELECTION_RULE = ("Each problem counts its first k samples by sample index; more are ignored (counted in the notes), "
                  "fewer is an error.")
SCORING = {
    "selection": SELECTION_RULE,
    "pass@1": "percent: mean over problems of (correct of the first k) / k (avg@k)",
    "stderr": "percent: sample standard deviation (n-1) of the per-problem fractions / sqrt(problems)",
    "pass@k": "percent: mean over problems of 1 - C(k-c, j)/C(k, j), unbiased estimator, j = powers of two <= k",
    "truncated": "fraction of the scored samples with finish_reason length (scored wrong)",
}
CODE_PROMPT = "LiveCodeBench's generic chat prompt: ### Question / ### Format (starter code, or stdin) / ### Answer"
JUDGED_SCHEMA = pa.schema([
    ("label", pa.string()), ("id", pa.string()), ("sample", pa.int64()), ("correct", pa.bool_()),
    ("verdict", pa.string()), ("passed", pa.int32()), ("total", pa.int32()), ("extracted", pa.string()),
    ("finish_reason", pa.string()), ("completion_tokens", pa.int64()),
])
PROBLEMS_SCHEMA = pa.schema([
    ("label", pa.string()), ("benchmark", pa.string()), ("id", pa.string()), ("k", pa.int32()),
    ("correct", pa.int32()), ("pass_rate", pa.float64()), ("truncated", pa.int32()),
    ("mean_completion_tokens", pa.float64()), ("verdicts", pa.string()), ("difficulty", pa.string()),
    ("platform", pa.string()), ("contest_date", pa.string()),
])


class ProtocolMismatchError(ValueError):
    """Saved samples taken under other sampling settings than the protocol's."""


# --------------------------------------------------------------------------- settings


def check_sampling(recorded: Mapping[str, Any] | None, protocol: Mapping[str, Any]) -> tuple[str, list[str]]:
    """("matches", []), ("differs", [what differs]) or ("unknown", [why]) for a source's recorded sampling."""
    if recorded is None:
        return "unknown", ["no recorded sampling settings (not a klear sample output)"]
    if not recorded:
        return "unknown", ["imported responses (backend records): no sampling settings"]
    differ = [f"{key}={recorded[key]!r} (protocol {want!r})" for key, want in protocol.items()
              if key in recorded and recorded[key] != want]
    if differ:
        return "differs", differ
    missing = [key for key in protocol if key not in recorded]
    return ("unknown", [f"not recorded: {', '.join(missing)}"]) if missing else ("matches", [])


def _source_settings(local: LocalSource, protocol: Mapping[str, Any]) -> dict[str, Any]:
    settings = local.settings or {}
    if local.stage == "judge":  # judged samples: the settings the judge carried on from its input
        carried = local.meta.get("sample_settings")
        settings = carried if isinstance(carried, dict) else {}
    recorded = settings.get("sampling") if local.stage in ("sample", "judge") else None
    if not isinstance(recorded, dict):
        recorded = None
    state, details = check_sampling(recorded, protocol)
    check = {"matches": "matches the protocol", "differs": "DIFFERS: " + "; ".join(details),
             "unknown": "unknown: " + "; ".join(details)}[state]
    return {"uri": local.source.uri, "stage": local.stage, "state": state, "check": check,
            "sampling": recorded or None, "identity": settings.get("identity")}


PROMPT_BATCH_ROWS = 4096  # LiveCodeBench prompts are kilobytes each


def compare_prompts(rows: Iterable[tuple[str, str | None]], expected: Mapping[str, str]) -> dict[str, Any]:
    """How the prompts the rows were asked compare with the protocol's prompt of their problem: rows checked,
    rows asked something else (with the one of the smallest id), rows that recorded no prompt."""
    checked = differ = unrecorded = 0
    first: dict[str, str] | None = None
    for pid, prompt in rows:
        if prompt is None:
            unrecorded += 1
            continue
        checked += 1
        if prompt != expected[pid]:
            differ += 1
            if first is None or pid < first["id"]:  # the example does not depend on the rows' order
                first = {"id": pid, "prompt": prompt, "protocol": expected[pid]}
    return {"checked": checked, "differ": differ, "not_recorded": unrecorded, "first_difference": first}


def _clip(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def prompt_summary(found: Mapping[str, Any]) -> str:
    """One line for the report and errors: the protocol's prompts, which differ, or none recorded."""
    if found["differ"]:
        first = found["first_difference"]
        return (f"prompts: {found['differ']} of {found['checked']} scored rows were not asked the protocol's prompt "
                f"(e.g. {first['id']}: {_clip(first['prompt'])}, where the protocol asks {_clip(first['protocol'])})")
    if found["checked"]:
        unrecorded = f"; {found['not_recorded']} rows without a prompt" if found["not_recorded"] else ""
        return f"the protocol's prompts ({found['checked']} scored rows){unrecorded}"
    return "not recorded (the rows carry no prompt)"


def _scored_prompts(local: LocalSource, keys: Mapping[tuple[str, int], str]) -> Iterator[tuple[str, str | None]]:
    """(id, prompt) of the source's rows chosen for scoring (a key is chosen from one file: its origin)."""
    for origin, path in local.files:
        for table in file_tables(path, origin, PROMPT_BATCH_ROWS, ("id", "sample", "prompt")):
            ids, indices = table.column("id").to_pylist(), table.column("sample").to_pylist()
            prompts = table.column("prompt").to_pylist() if "prompt" in table.column_names else [None] * len(ids)
            for pid, index, prompt in zip(ids, indices, prompts):
                if keys.get((str(pid), int(index))) == origin:
                    yield str(pid), prompt if isinstance(prompt, str) else None


def _check_prompts(info: dict[str, Any], local: LocalSource, selection: Selection, expected: Mapping[str, str]) -> None:
    """Add the prompt check to a source's settings check: prompts other than the protocol's are a difference
    like a sampling setting's (the model was asked something else)."""
    found = compare_prompts(_scored_prompts(local, selection.keys), expected)
    info["prompts"] = {**found, "check": prompt_summary(found)}
    if found["differ"]:
        earlier = [info["check"].removeprefix("DIFFERS: ")] if info["state"] == "differs" else []
        info["state"], info["check"] = "differs", "DIFFERS: " + "; ".join([*earlier, info["prompts"]["check"]])


# --------------------------------------------------------------------------- judging


class _Judging:
    """Judges the chosen rows of each label, reusing scores a crashed run saved under the output."""

    def __init__(self, judge: Judge, config: EvaluateConfig, output: str, lease: storage.OutputLease):
        self.judge, self.config, self.output, self.lease = judge, config, output, lease
        self.judged = self.reused = 0  # judged here, and taken from saved scores or a judge step's verdicts
        self.references: str | None = None  # references_key of the benchmarks' problems, once a judge output asks
        # judge.report_modes: the math samples judged again in each other mode (label -> mode -> key -> correct)
        self.modes = ModeComparison(config.judge)
        self.mode_correct: dict[str, dict[str, dict[tuple[str, int], bool]]] = defaultdict(lambda: defaultdict(dict))
        self.started = self.last_log = time.monotonic()

    def label(self, label: str, locals_: Sequence[LocalSource], selection: Selection, bench: BenchmarkSet,
              total: int) -> dict[tuple[str, int], SampleScore]:
        cfg = self.config.judge
        store = ScoreStore(self.output, f"{settings_key(cfg)}-{label}", self.lease, STAGE.name) if cfg.resume else None
        saved = store.load() if store is not None else {}
        scores: dict[tuple[str, int], SampleScore] = {}
        for local in locals_:
            given = self._verdicts_given(local, bench)
            for rows in read_rows(local, selection.keys, cfg.chunk_size, JUDGE_COLUMNS if given else ()):
                rows = [r for r in rows if selection.keys.get((str(r["id"]), int(r["sample"]))) is not None]
                problems = [bench.problems[str(r["id"])].problem for r in rows]
                prints = [fingerprint(str(r.get("response") or ""), r.get("finish_reason"), p)
                          for r, p in zip(rows, problems)]
                results: list[Judgement | None] = [None] * len(rows)
                todo = []
                for i, (row, fp) in enumerate(zip(rows, prints)):
                    hit = saved.get((str(row["id"]), int(row["sample"])))
                    if given and row.get("verdict") is not None:
                        results[i] = Judgement(**{name: row[name] for name in JUDGE_COLUMNS})
                    elif hit is not None and hit[0] == fp:
                        results[i] = Judgement(**hit[1])
                    else:
                        todo.append(i)
                fresh = self.judge.judge([rows[i] for i in todo], [problems[i] for i in todo])
                for i, j in zip(todo, fresh):
                    results[i] = j
                if store is not None and fresh:
                    store.save([{"id": str(rows[i]["id"]), "sample": int(rows[i]["sample"]), "fingerprint": prints[i],
                                 **j.to_dict()} for i, j in zip(todo, fresh)])
                self.reused += len(rows) - len(todo)
                if self.modes.judges:
                    for mode, again in self.modes.add(rows, problems, [r for r in results if r is not None]).items():
                        self.mode_correct[label][mode].update(
                            {(str(rows[i]["id"]), int(rows[i]["sample"])): j.correct for i, j in again.items()})
                for row, result in zip(rows, results):
                    assert result is not None
                    tokens = row.get("completion_tokens")
                    scores[(str(row["id"]), int(row["sample"]))] = SampleScore(
                        str(row["id"]), int(row["sample"]), bool(result.correct), result.verdict,
                        row.get("finish_reason"), int(tokens) if tokens is not None else None, result.passed,
                        result.total, result.extracted)
                self.judged += len(todo)
                self._progress(label, len(scores), total)
        missing = set(selection.keys) - set(scores)
        if missing:  # read_keys saw them, read_rows did not: the source changed under us
            raise SampleError(f"label {label!r}: {len(missing)} chosen samples vanished between reads, e.g. "
                              f"{sorted(missing)[:3]}")
        return scores

    def _verdicts_given(self, local: LocalSource, bench: BenchmarkSet) -> bool:
        """A judge output judged under these judge settings against these very problems: its verdicts are
        taken as they are (the DAG's judge slices in front of evaluate); any other source is judged here."""
        if local.stage != "judge" or local.meta.get("settings_key") != settings_key(self.config.judge):
            return False
        if self.references is None:
            self.references = references_key({pid: item.problem for pid, item in bench.problems.items()})
        return bool(local.meta.get("references_key") == self.references)

    def _progress(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last_log >= self.config.judge.progress_seconds:
            self.last_log = now
            log.info("%s: %d of %d samples judged (%d reused), %.1f samples/s", label, done, total, self.reused,
                     self.judged / (now - self.started))


# --------------------------------------------------------------------------- the stage


def _sources(samples: Iterable[SampleSource | str]) -> list[SampleSource]:
    out: list[SampleSource] = []
    for item in samples:
        out += [item] if isinstance(item, SampleSource) else parse_sample_specs([item])
    if not out:
        raise ValueError("no samples to score: give --samples [LABEL=]URI (or --model to sample first)")
    return out


def _sample_inputs(sources: Iterable[SampleSource]) -> dict[str, list[str]]:
    """Sample sources as inputs of the manifest: role `samples:<label>` -> its URIs."""
    roles: dict[str, list[str]] = defaultdict(list)
    for source in sources:
        roles[f"samples:{source.label}"].append(source.uri)
    return dict(roles)


def run(samples: Iterable[SampleSource | str], output: str, config: EvaluateConfig, benchmarks: Sequence[str] = (),
        loaded: BenchmarkSet | None = None) -> dict[str, Any]:
    """Score saved generations and publish the report to `output`; returns report.json's content."""
    started = time.monotonic()
    sources = _sources(samples)
    checked = STAGE.check(output, {**_sample_inputs(sources), "benchmark": benchmarks}, config=config)
    bench = loaded or load_benchmarks(benchmarks, config)
    labels = list(dict.fromkeys(s.label for s in sources))
    protocol_sampling = config.protocol_sampling()
    with checked.open() as out, contextlib.ExitStack() as stack:
        opened: dict[str, list[LocalSource]] = defaultdict(list)
        for source in sources:
            opened[source.label].append(stack.enter_context(open_source(source)))
        source_info = {label: [_source_settings(local, protocol_sampling) for local in opened[label]] for label in labels}
        differing = [f"{label}: {s['uri']}: {s['check']}" for label in labels for s in source_info[label]
                     if s["state"] == "differs"]
        if differing and config.settings_check == "error":
            raise ProtocolMismatchError("samples taken under other sampling settings than the protocol's (set "
                                        "settings_check=warn to score them anyway, reported):\n" + "\n".join(differing))
        selections = {label: select_samples(label, (key for local in opened[label] for key in read_keys(local)),
                                            bench, config) for label in labels}
        expected = {pid: item.prompt for pid, item in bench.problems.items()}
        for label in labels:
            for local, info in zip(opened[label], source_info[label]):
                _check_prompts(info, local, selections[label], expected)
        asked_otherwise = [f"{label}: {s['uri']}: {s['check']}" for label in labels for s in source_info[label]
                           if s["prompts"]["differ"]]
        if asked_otherwise and config.settings_check == "error":
            raise ProtocolMismatchError("samples taken with other prompts than the protocol's template (set "
                                        "settings_check=warn to score them anyway, reported):\n"
                                        + "\n".join(asked_otherwise))
        shortfalls = [line for label in labels for line in selections[label].shortfalls]
        if shortfalls:
            raise SampleError("too few samples for the protocol (no silent smaller k):\n" + "\n".join(shortfalls))
        if not any(sel.sampled for sel in selections.values()):
            raise SampleError(f"none of the samples belong to a selected benchmark's problems "
                              f"({', '.join(config.selected())}): nothing to score")
        per_label: dict[str, dict[tuple[str, int], SampleScore]] = {}
        judge_started = time.monotonic()
        with Judge(config.judge) as judge:
            judging = _Judging(judge, config, output, out.lease)
            for label in labels:
                per_label[label] = judging.label(label, opened[label], selections[label], bench,
                                                 len(selections[label].keys))
            judging.modes.close()
            judge.check_scorer_works()
            mode_blocks = {label: {mode: mode_scores(selections[label], bench, config, correct)
                                   for mode, correct in judging.mode_correct[label].items()} for label in labels}
            judge_counts = {"workers": judge.workers, "budget_timeouts": judge.timeouts, "scorer_errors": judge.errors,
                            "judged": judging.judged, "reused": judging.reused,
                            "judge_s": round(time.monotonic() - judge_started, 3)}
        report = _publishable(out.staging, config, bench, labels, selections, per_label, source_info, judge_counts,
                              benchmarks, started, mode_blocks)
        out.publish(report, {"labels": labels, "scores": _headline(report)})
    log.info("published %s: %s", output, json.dumps(_headline(report)))
    for model in model_card.record_evaluation(output, _headline(report)):  # the DAG's last step: scores into the cards
        log.info("recorded the scores in the model card of %s", model)
    return report


def _headline(report: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    return {label: {name: round(b["pass@1"], 2) for name, b in model["benchmarks"].items()}
            for label, model in report["models"].items()}


def _publishable(staging: Path, config: EvaluateConfig, bench: BenchmarkSet, labels: list[str],
                 selections: Mapping[str, Selection], per_label: Mapping[str, Mapping[tuple[str, int], SampleScore]],
                 source_info: Mapping[str, list[dict[str, Any]]], judge_counts: dict[str, Any],
                 benchmark_uris: Sequence[str], started: float,
                 mode_blocks: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Write the output's files but the report's JSON and Markdown to `staging`; returns the report.
    `mode_blocks`: label -> other math judging mode -> benchmark -> pass@1, stderr (judge.report_modes)."""
    selected = config.selected()
    models: dict[str, Any] = {}
    problem_rows: list[ProblemScore] = []
    lengths: dict[str, dict[str, dict[str, list[int]]]] = {}
    for label in labels:
        blocks, rows, label_lengths = score_benchmarks(label, selections[label], per_label[label], bench, config)
        sel = selections[label]
        models[label] = {"benchmarks": blocks, "not_sampled": sel.not_sampled, "sources": source_info[label],
                         "beyond_k": sel.beyond_k, "unknown_rows": sel.unknown_rows, "unknown_ids": sel.unknown_ids}
        problem_rows += rows
        lengths[label] = label_lengths
    report: dict[str, Any] = {
        "stage": "evaluate",
        "primary": labels[0],
        "labels": labels,
        "benchmarks": models[labels[0]]["benchmarks"],
        "models": models,
        "paper": {row: {n: v for n, v in values.items() if n in selected} for row, values in TABLE1.items()
                  if any(n in selected for n in values)},
        "settings": _settings(config, bench, source_info, benchmark_uris),
        "notes": _notes(config, bench, labels, selections, source_info, judge_counts),
        "judge": judge_counts,
        "math_modes": {"mode": config.judge.verifier.math_mode, "other": dict(mode_blocks or {})},
        "figures": {"scores": "scores.png", "pass_counts": "pass_counts.png",
                    "lengths": {label: f"lengths-{label}.png" for label in labels}},
        "versions": {p: metadata.version(p) for p in ("klear-pipeline", "math-verify", "matplotlib")
                     if _has_distribution(p)},
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    steps = lineage.trace([s["uri"] for label in labels for s in source_info[label]])
    report["lineage"] = {"steps": [step.to_json() for step in steps], "mermaid": lineage.render_mermaid(steps)}
    titles = {name: b.title or name for name, b in selected.items()}
    plots.score_chart(staging / "scores.png", titles,
                      {label: {n: (b["pass@1"], b["stderr"]) for n, b in models[label]["benchmarks"].items()}
                       for label in labels}, report["paper"], config.plot_dpi)
    for label in labels:
        plots.length_histograms(staging / f"lengths-{label}.png", label,
                                titles, lengths[label], config.plot_dpi)
    counts: dict[str, dict[str, dict[str, int]]] = {label: defaultdict(dict) for label in labels}
    for row in problem_rows:
        counts[row.label][row.benchmark][row.id] = row.correct
    sampled_titles = {n: t for n, t in titles.items() if any(n in models[label]["benchmarks"] for label in labels)}
    plots.pass_count_chart(staging / "pass_counts.png", sampled_titles, {n: selected[n].k for n in selected}, counts,
                           config.plot_dpi)
    problems_table = [_problem_dict(r) for r in problem_rows]
    pq.write_table(pa.Table.from_pylist(problems_table, schema=PROBLEMS_SCHEMA), staging / "problems.parquet")
    judged = [{"label": label, "id": s.id, "sample": s.sample, "correct": s.correct, "verdict": s.verdict,
               "passed": s.passed, "total": s.total, "extracted": s.extracted, "finish_reason": s.finish_reason,
               "completion_tokens": s.completion_tokens}
              for label in labels for s in sorted(per_label[label].values(), key=lambda s: (s.id, s.sample))]
    pq.write_table(pa.Table.from_pylist(judged, schema=JUDGED_SCHEMA), staging / "judged.parquet")
    (staging / "report.html").write_text(render_html(report, staging, problems_table))
    return report


def _has_distribution(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def _problem_dict(row: ProblemScore) -> dict[str, Any]:
    return {"label": row.label, "benchmark": row.benchmark, "id": row.id, "k": row.k, "correct": row.correct,
            "pass_rate": row.pass_rate, "truncated": row.truncated, "mean_completion_tokens": row.mean_completion_tokens,
            "verdicts": json.dumps(row.verdicts, sort_keys=True), "difficulty": row.info.get("difficulty"),
            "platform": row.info.get("platform"), "contest_date": row.info.get("contest_date")}


def _settings(config: EvaluateConfig, bench: BenchmarkSet, source_info: Mapping[str, list[dict[str, Any]]],
              benchmark_uris: Sequence[str]) -> dict[str, Any]:
    verifier = config.judge.verifier
    protocol = {}
    for name, b in config.selected().items():
        protocol[name] = {"title": b.title or name, "kind": b.kind, "k": b.k,
                          "window": [str(b.start), str(b.end)] if b.kind == "code" else None,
                          "problems": len(bench.members.get(name, [])), **benchmark_rules(config, b.kind)}
    sampling = config.sampling_for(1).model_dump(mode="json")
    shown = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed", "max_model_len",
             "engine_kwargs", "system_prompt", "backend")
    return {
        "protocol": protocol,
        "sampling": {"n": "k of each benchmark", **{key: sampling[key] for key in shown}},
        "official_extras": config.official_extras.model_dump(mode="json"),
        "settings_check": config.settings_check,
        "math_template": config.math_template.format(problem="{problem}"),
        "math_prompt": config.math_prompt,
        "sampling_extras": config.sampling_extras,
        "code_prompt": (f"{CODE_PROMPT}; form {config.code_prompt} ("
                        f"{'stdin instruction as since 2024-12-26' if config.code_prompt == 'lcb' else 'before 2024-12-26'}"
                        f"); system turn: {config.code_system_prompt or 'none'}"),
        "math_judging": MATH_MODE_RULES["official"] if verifier.math_mode == "official" else (
                         f"strict: the last \\boxed{{}} after {verifier.think_end!r} (math-verify); required </think>: "
                         f"{verifier.require_think_end}; required box: {verifier.require_box}; conflicting boxes "
                         f"{'rejected' if verifier.reject_conflicting_boxes else 'allowed (the last one counts)'}; "
                         "truncated responses wrong"),
        "code_judging": code_judging(verifier),
        "scoring": SCORING,
        "judge": config.judge.model_dump(mode="json"),
        "benchmark_files": bench.sources,
        "benchmark_uris": list(benchmark_uris),
        "samples": {label: list(info) for label, info in source_info.items()},
    }


def code_judging(verifier: VerifierConfig) -> str:
    """The report's line on code judging: extraction, execution and comparison rules, limits (verifier.code_rules)."""
    fresh = ("each stdin test in a fresh confined process" if verifier.code_rules == "runner"
             else "each test in a fresh confined process with real stdin")
    common = (f"public + private tests; mode {verifier.code_mode}; {verifier.timeout_s:g} s per test; "
              f"{verifier.memory_mb} MB; {fresh}; correct only if every "
              f"test passes; tests per problem: {'all' if verifier.max_tests is None else verifier.max_tests}")
    if verifier.lcb_rules:
        artifacts = ("; stdin programs run as lcb_runner runs them (wrapped in a function, its mocked stdin: no "
                     "iteration, buffer.readline the first line; stdout captured without .buffer); call-based tests "
                     "in order in one process sharing one module and one Solution, as lcb_runner runs them"
                     if verifier.code_rules == "runner" else "")
        return (f"rules {verifier.code_rules} (lcb_runner): the last fenced block of the raw output, finish reason "
                "ignored; " + common + "; lines equal as text or as Decimal lists; call-based results compared with == "
                f"in-process; SystemExit ignored; ints print up to 50,000 digits; importable: "
                f"{', '.join(verifier.official_packages)} (those installed)" + artifacts)
    if verifier.code_rules == "release":
        return ("rules release (the released RL code reward): the last ```python block after the first </think>, "
                "finish reason ignored; " + common + "; stdin programs run without helper imports; output equal "
                f"after strip(); importable: {', '.join(verifier.official_packages)} (those installed)")
    return (f"rules strict: last ```python block after {verifier.think_end!r}, truncated responses wrong; " + common +
            "; output compared token by token (numbers as numbers); standard library only")


MATH_MODE_RULES = {
    "strict": "the last \\boxed{} after </think>, truncated responses wrong",
    "official": ("official: as the released judge_math.py: math-verify over the whole response (the last \\boxed{} "
                 "anywhere, else the last number), finish reason ignored"),
}


def benchmark_rules(config: EvaluateConfig, kind: str) -> dict[str, Any]:
    """How one benchmark was run and judged, for the report's protocol table: judging mode, prompt template,
    sampling extras, and (code) the execution rules."""
    verifier = config.judge.verifier
    extras = config.sampling_extras
    sampling = "paper (T, top_p only)" if extras == "paper" else (
        f"release extras (top_k {config.official_extras.top_k}, repetition_penalty "
        f"{config.official_extras.repetition_penalty:g}, seed {config.official_extras.seed})")
    if kind == "math":
        return {"judging": verifier.math_mode, "prompt": config.math_prompt, "sampling_extras": sampling,
                "execution": None}
    return {"judging": code_judging_mode(verifier), "prompt": "LiveCodeBench", "sampling_extras": sampling,
            "execution": code_execution_rules(verifier)}


def code_judging_mode(verifier: Any) -> str:
    """The code extraction rule's name (strict: the last python block after </think>)."""
    return str(getattr(verifier, "code_rules", "strict"))


def code_execution_rules(verifier: Any) -> str:
    """The sandbox rules a code benchmark ran under, in words."""
    return (f"{verifier.code_mode}, {verifier.timeout_s:g} s per test, {verifier.memory_mb} MB, tests per problem: "
            f"{'all' if verifier.max_tests is None else verifier.max_tests}")


def _notes(config: EvaluateConfig, bench: BenchmarkSet, labels: Sequence[str], selections: Mapping[str, Selection],
           source_info: Mapping[str, list[dict[str, Any]]], judge_counts: Mapping[str, Any]) -> list[str]:
    notes = []
    if bench.shipped_math:
        notes.append("No math set among the benchmark files: the shipped AIME24, AIME25 and HMMT Feb 2025 sets were "
                     "used.")
    empty = [name for name in config.selected() if not bench.members.get(name)]
    if empty:
        notes.append(f"No problems in the benchmark files for: {', '.join(empty)} (for code benchmarks: give "
                     "LiveCodeBench code_generation_lite files with --benchmark).")
    if bench.outside_windows:
        notes.append(f"{len(bench.outside_windows)} LiveCodeBench problems dated outside every configured window "
                     "were not scored.")
    for label in labels:
        sel = selections[label]
        if sel.beyond_k:
            notes.append(f"{label}: {sel.beyond_k} samples beyond their problem's first k (by sample index) were "
                         "not scored.")
        if sel.unknown_rows:
            notes.append(f"{label}: {sel.unknown_rows} sample rows of problems in no selected benchmark were not "
                         f"scored (e.g. {', '.join(sel.unknown_ids[:5])}).")
        for info in source_info[label]:
            if info["state"] != "matches":
                notes.append(f"{label}: {info['uri']}: sampling settings {info['check']}.")
    if config.official_extras.enabled:
        notes.append("The released inference script's extras are on: top_k, repetition_penalty, seed and "
                     "max_model_len as in settings.official_extras.")
    if judge_counts["budget_timeouts"] or judge_counts["scorer_errors"]:
        notes.append(f"{judge_counts['budget_timeouts']} judgements overran their budget and "
                     f"{judge_counts['scorer_errors']} scorers failed: counted wrong.")
    if judge_counts["reused"]:
        notes.append(f"{judge_counts['reused']} judgements reused from an interrupted run or a judge step's output "
                     "(same response, reference and settings).")
    return notes


# --------------------------------------------------------------------------- sampling first


def prompt_groups(bench: BenchmarkSet, config: EvaluateConfig) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Prompt rows by (kind, samples per problem): what one sample-stage run takes. A problem in several
    benchmarks is sampled once, as many times as the largest k among them."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for pid, item in bench.problems.items():
        # A system turn (code: lcb_runner's) travels as a chat; the sample rows still record the user turn as prompt.
        ask = {"messages": [{"role": "system", "content": item.system}, {"role": "user", "content": item.prompt}]} \
            if item.system else {"prompt": item.prompt}
        groups[(item.kind, bench.k_of(pid, config))].append({"id": pid, **ask, "benchmark": ",".join(item.benchmarks)})
    return dict(sorted(groups.items()))


def _write_jsonl(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    with open(path, "wb") as fh:
        for row in rows:
            fh.write(orjson.dumps(row) + b"\n")
    return path


def sample_overrides(sampling: SampleConfig) -> list[str]:
    """`key=value` overrides that give the sample stage's config the protocol's settings (n included), whatever its
    preset: what a pipeline passes to the sample component next to the prompts."""
    settings = {"n": sampling.n, **sampling.sampling_settings()}
    return [f"{key}={json.dumps(value)}" for key, value in settings.items()]


def write_prompts(output: str, config: EvaluateConfig, benchmarks: Sequence[str] = (), kind: str | None = None,
                  loaded: BenchmarkSet | None = None) -> dict[str, Any]:
    """Publish the protocol's prompts, one JSONL per (kind, k) group, each with its sample-stage config; with
    `kind`, only that kind's prompts (one k, else an error): a folder the sample stage reads as a whole."""
    checked = PROMPTS_STAGE.check(output, {"benchmark": benchmarks}, config=config)
    bench = loaded or load_benchmarks(benchmarks, config)
    groups = {key: rows for key, rows in prompt_groups(bench, config).items() if kind is None or key[0] == kind}
    if kind is not None and len(groups) > 1:
        raise ConfigError(f"{kind} benchmarks with different k ({sorted(k for _, k in groups)}): one sample run per k; "
                          "write each group with `klear evaluate-prompts` (no kind) instead")
    if kind is None and not groups:
        raise ValueError("no problems in the selected benchmarks: nothing to prompt")
    with checked.open() as out:
        staging = out.staging
        listing = {}
        for (group_kind, k), rows in groups.items():
            name = f"{group_kind}-k{k}"
            sampling = config.sampling_for(k)
            _write_jsonl(rows, staging / f"{name}.jsonl")
            (staging / f"sampling-{name}.yaml").write_text(sampling.dump_yaml())
            listing[name] = {"file": f"{name}.jsonl", "config": f"sampling-{name}.yaml", "kind": group_kind, "n": k,
                             "prompts": len(rows), "sample_overrides": sample_overrides(sampling)}
        report = {"stage": "evaluate-prompts", "kind": kind, "groups": listing, "benchmark_files": bench.sources}
        out.publish(report, {"groups": listing})
    return report


def judge_problem_rows(bench: BenchmarkSet, task: str) -> list[dict[str, Any]]:
    """The benchmarks' problems as rows of a problems file for a judge step judging every problem as `task`; each
    must read back as the very reference evaluate judges against (else the step's verdicts would not be taken),
    an error naming the problem otherwise."""
    rows = []
    for pid, item in bench.problems.items():
        row = problem_row(item.problem)
        back = problem_from_row(row, task)
        if back is None or back.reference_hash != item.problem.reference_hash:
            raise ConfigError(f"benchmark problem {pid!r} ({item.where}): judged as task {task!r} its reference would "
                              "differ from evaluate's (e.g. judge.task=math on a code problem); set judge.task=auto")
        rows.append(row)
    return rows


def write_problems(output: str, config: EvaluateConfig, benchmarks: Sequence[str] = (),
                   loaded: BenchmarkSet | None = None) -> dict[str, Any]:
    """Publish the problems evaluate judges against (`problems.jsonl`), for a judge step in front of it."""
    checked = PROBLEMS_STAGE.check(output, {"benchmark": benchmarks}, config=config)
    bench = loaded or load_benchmarks(benchmarks, config)
    rows = judge_problem_rows(bench, config.judge.task)
    if not rows:
        raise ValueError("no problems in the selected benchmarks: nothing to judge against")
    with checked.open() as out:
        _write_jsonl(rows, out.staging / "problems.jsonl")
        kinds = dict(sorted(Counter(item.kind for item in bench.problems.values()).items()))
        report = {"stage": "evaluate-problems", "problems": len(rows), "kinds": kinds,
                  "benchmark_files": bench.sources}
        out.publish(report, {"problems": len(rows), "kinds": kinds})
    return report


def sample_then_run(output: str, config: EvaluateConfig, benchmarks: Sequence[str] = (), model: str | None = None,
                    label: str = "model", sample_output: str | None = None, endpoint: str | None = None,
                    served_model: str | None = None, samples: Iterable[SampleSource | str] = ()) -> dict[str, Any]:
    """Sample the protocol's prompts from `model` (or `endpoint`) with klear.sample, then score them (with any
    other `samples`, side by side). Each (kind, k) group is one sample output under `sample_output`."""
    from klear.sample.stage import run as sample_run

    others = _sources(samples) if samples else []
    root = (sample_output or f"{output.rstrip('/')}.samples").rstrip("/")
    # Every location this command writes, checked before any work (sampling takes hours on a real model): the report
    # and the folder of sample outputs may not replace an input (the model included) nor each other; then each
    # sample output may replace only an earlier sample output.
    inputs = [*benchmarks, *([model] if model else []), *(s.uri for s in others)]
    STAGE.check(output, {"benchmark": benchmarks, "model": model, **_sample_inputs(others)},
                others=[storage.Write("--sample-output", root, "sample", published=False)], role="--output",
                config=config)
    bench = load_benchmarks(benchmarks, config)
    groups = prompt_groups(bench, config)
    targets = {key: f"{root}/{key[0]}-k{key[1]}" for key in groups}
    # Each group's sample config is made here, not loaded: the files this run's config was read from are named.
    storage.check_writes([storage.Write(f"--sample-output {Path(target).name}", target, "sample")
                          for target in targets.values()], inputs, config.provenance.files if config.provenance else ())
    sampled: list[SampleSource] = []
    with tempfile.TemporaryDirectory(prefix="klear-evaluate-prompts-") as tmp:
        for (kind, k), rows in groups.items():
            prompts = _write_jsonl(rows, Path(tmp) / f"{kind}-k{k}.jsonl")
            target = targets[(kind, k)]
            log.info("sampling %d %s prompts x %d into %s", len(rows), kind, k, target)
            sample_run([str(prompts)], target, config.sampling_for(k), model=model, endpoint=endpoint,
                       served_model=served_model)
            sampled.append(SampleSource(label, target))
    return run([*sampled, *others], output, config, benchmarks, loaded=bench)


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("evaluate", help="scores on AIME, HMMT and LiveCodeBench, with a report",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", nargs="+", action="extend", default=[], metavar="[LABEL=]URI",
                        help="saved generations (klear sample outputs or files); LABEL puts models side by side")
    parser.add_argument("--model", metavar="[LABEL=]URI", help="sample this model first (vLLM on GPU, transformers on CPU)")
    parser.add_argument("--endpoint", metavar="URL", help="sample an OpenAI-compatible endpoint first")
    parser.add_argument("--served-model", metavar="NAME", help="the model name the endpoint serves")
    parser.add_argument("--label", default="model", help="label of the --model/--endpoint samples (default: model)")
    parser.add_argument("--sample-output", metavar="URI", help="where --model samples go (default: <output>.samples)")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    parser.add_argument("--benchmark", nargs="+", action="extend", default=[], metavar="URI",
                        help="math sets and LiveCodeBench code_generation_lite files (default math: the shipped sets)")
    STAGE.add_main(parser, _sample_or_score, _headline)

    prompts = _benchmark_command(subparsers, "evaluate-prompts", "the evaluation prompts, for a separate sample step")
    PROMPTS_STAGE.add_main(prompts, lambda args, config: write_prompts(args.output, config, args.benchmark),
                           lambda report: report["groups"])
    problems = _benchmark_command(subparsers, "evaluate-problems",
                                  "the problems evaluate judges against, for a judge step")
    PROBLEMS_STAGE.add_main(problems, lambda args, config: write_problems(args.output, config, args.benchmark),
                            lambda report: report["kinds"])


def _benchmark_command(subparsers: argparse._SubParsersAction, name: str, summary: str) -> argparse.ArgumentParser:
    """A command that reads only evaluate's benchmarks and config and writes one output."""
    parser = subparsers.add_parser(name, help=summary, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    parser.add_argument("--benchmark", nargs="+", action="extend", default=[], metavar="URI",
                        help="math sets and LiveCodeBench code_generation_lite files (default math: the shipped sets)")
    return parser


def _sample_or_score(args: argparse.Namespace, config: EvaluateConfig) -> dict[str, Any]:
    if args.model or args.endpoint:
        label, model = args.label, args.model
        if model:
            parsed = parse_sample_specs([model], args.label)[0]
            label, model = parsed.label, parsed.uri
        return sample_then_run(args.output, config, args.benchmark, model=model, label=label,
                               sample_output=args.sample_output, endpoint=args.endpoint,
                               served_model=args.served_model, samples=args.samples)
    return run(args.samples, args.output, config, args.benchmark)
