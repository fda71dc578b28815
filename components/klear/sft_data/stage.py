"""Entry point of the sft-data stage: teacher samples -> SFT chat records, by difficulty and correctness.

    klear sft-data --samples URI --output URI [--reference URI] [--tokenizer URI] [--config paper|tiny|FILE]

`--samples`: the teacher's samples (output of `klear sample`, or of `klear judge` to skip judging again).
Each response is judged against its problem (from the sample's `record`): correct / incorrect, or unlabelled
when the problem has neither an answer nor tests. `--reference`: samples of a reference model (paper: Qwen3-8B);
its pass rate over the first k samples labels each prompt easy (>= easy_threshold) or hard. The policy decides
what is kept (keep_all, drop_incorrect_on_easy, drop_incorrect); truncated responses (finish_reason length, no
</think>) are always dropped, and so are records longer than max_length tokens of `--tokenizer`. Publishes

    records/part-*.parquet   {"messages": [the conversation the teacher answered (system prompt and earlier
                             turns included), assistant "<think>...</think>\\n\\nfinal"]} plus id,
                             sample, source, difficulty, correct, reference_pass_rate, tokens, verdict
    report.json, report.md   counts per source x difficulty x correctness, what each policy keeps, lengths
    token_lengths.png        length distribution of the usable responses

atomically (manifest last); `klear sft --data <output>` reads the records.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from klear.common import storage
from klear.common import tokenizer as common_tokenizer
from klear.common.data_stage import DataStage
from klear.common.records import ParquetShardWriter, unwrap_record
from klear.common.sample_rows import MESSAGES_TYPE, prompt_text, response_parts
from klear.judge import Judge
from klear.judge.io import SampleInputError, iter_judged
from klear.judge.plots import histogram_png
from klear.judge.rates import histogram
from klear.sft_data.config import SftDataConfig
from klear.sft_data.policy import POLICIES, correctness, difficulty, keeps, reference_pass_rate, truncated
from klear.sft_data.report import render_markdown

log = logging.getLogger("klear.sft_data")
STAGE = DataStage("sft-data", SftDataConfig, render_markdown)

RECORD_SCHEMA = pa.schema([
    ("messages", MESSAGES_TYPE), ("id", pa.string()), ("sample", pa.int64()), ("source", pa.string()),
    ("difficulty", pa.string()), ("correct", pa.bool_()), ("reference_pass_rate", pa.float64()),
    ("tokens", pa.int64()), ("verdict", pa.string()),
])
# `answer`: the final text of rows written before its rename to `final` (response_parts reads either).
_COLUMNS = ("id", "sample", "prompt", "response", "reasoning", "final", "answer", "finish_reason", "record", "source",
            "completion_tokens", "messages")


class SftDataError(ValueError):
    """Input that yields no SFT data, or a tokenizer that cannot measure it; the message says which."""


# --------------------------------------------------------------------------- tokenizer


def load_tokenizer(uri: str, chat_template: str) -> Any:
    """The target model's tokenizer with the chat template SFT renders conversations with (the loader of sft)."""
    with storage.localize(uri) as local:
        return common_tokenizer.load_tokenizer(local, uri, chat_template, SftDataError)


def count_tokens(tokenizer: Any, conversations: Sequence[list[dict[str, str]]]) -> list[int]:
    """Length in tokens of each conversation as SFT renders it (the chat template included)."""
    if not conversations:
        return []
    out = tokenizer.apply_chat_template(list(conversations), tokenize=True, return_dict=True)
    return [len(ids) for ids in out["input_ids"]]


# --------------------------------------------------------------------------- difficulty


def reference_difficulty(uri: str, judge: Judge, config: SftDataConfig) -> tuple[dict[str, float | None], dict[str, Any]]:
    """Per prompt id, the reference model's pass rate over its first k judged samples (None: not judgeable)."""
    judged: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    samples = 0
    for rows in iter_judged(uri, judge, batch_rows=config.batch_size, columns=("id", "sample", "response", "finish_reason", "record")):
        for row in rows:
            samples += 1
            pid = str(row["id"])
            if correctness(row.get("kind"), row.get("correct")) is None:
                judged.setdefault(pid, [])
            else:
                judged[pid].append((int(row["sample"]), bool(row["correct"])))
    if samples == 0:
        raise SampleInputError(f"reference {uri} holds no sample rows: nothing published")
    rates = {pid: reference_pass_rate(pairs, config.reference_samples) for pid, pairs in judged.items()}
    short = sum(0 < len(pairs) < config.reference_samples for pairs in judged.values())
    return rates, {"uri": uri, "samples": samples, "prompts": len(rates),
                   "prompts_with_fewer_than_k": short, "k": config.reference_samples,
                   "pass_rate_histogram": histogram([r for r in rates.values() if r is not None])}


# --------------------------------------------------------------------------- the stage


class _Counts:
    def __init__(self) -> None:
        # source -> difficulty -> correct / incorrect / unlabelled (usable responses: not truncated)
        self.matrix: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self.kept_matrix: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self.would_keep: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter({"truncated": 0, "too_long": 0, "policy": 0})
        self.truncated_per_source: Counter[str] = Counter()
        self.read = self.kept = 0
        self.unlabelled = 0
        self.lengths: dict[str, list[int]] = defaultdict(list)
        self.no_reference_ids: set[str] = set()
        self.reference_ids: set[str] = set()


def _label(correct: bool | None) -> str:
    return "unlabelled" if correct is None else ("correct" if correct else "incorrect")


def run(samples: str, output: str, config: SftDataConfig, reference: str | None = None,
        tokenizer: str | None = None) -> dict[str, Any]:
    """Build SFT records from the teacher `samples` and publish them to `output`; returns the report."""
    started = time.monotonic()
    tokenizer_uri = tokenizer or config.tokenizer or None
    checked = STAGE.check(output, {"samples": samples, "reference": reference, "tokenizer": tokenizer_uri},
                          config=config)
    tok = load_tokenizer(tokenizer_uri, config.chat_template) if tokenizer_uri else None  # fails before the work
    counts = _Counts()
    with checked.open() as out, Judge(config.judge) as judge:
        staging = out.staging
        levels, ref_report = reference_difficulty(reference, judge, config) if reference else ({}, None)
        writer = ParquetShardWriter(staging / "records", "part", RECORD_SCHEMA, config.rows_per_shard,
                                    dictionary_columns=("source", "difficulty", "verdict"))
        for rows in iter_judged(samples, judge, batch_rows=config.batch_size, columns=_COLUMNS):
            writer.write(_select(rows, levels, reference is not None, tok, config, counts))
        writer.close()
        if counts.read == 0:
            raise SampleInputError(f"{samples} holds no sample rows: nothing published")
        if reference and counts.no_reference_ids and not counts.reference_ids:
            shown = ", ".join(sorted(counts.no_reference_ids)[:5])
            raise SftDataError(f"none of the {len(counts.no_reference_ids)} teacher prompts of {samples} has samples "
                               f"in --reference {reference} (prompt ids such as {shown}): every difficulty would be "
                               "unknown; wrong --reference? nothing published")
        if reference and counts.no_reference_ids:
            log.warning("%d of %d teacher prompts have no samples in --reference %s (ids such as %s): their difficulty "
                        "is unknown; see report.md", len(counts.no_reference_ids),
                        len(counts.no_reference_ids) + len(counts.reference_ids), reference,
                        ", ".join(sorted(counts.no_reference_ids)[:5]))
        judge.check_scorer_works()
        if counts.kept == 0:
            raise SftDataError(f"no record of {samples} was kept ({counts.read} read, dropped {dict(counts.dropped)}): "
                               "nothing published")
        elapsed = time.monotonic() - started
        report = _report(samples, reference, tokenizer_uri, ref_report, config, counts, elapsed)
        label = "tokens (target tokenizer, chat template included)" if tok else "completion tokens (sampling model's tokenizer)"
        histogram_png(staging / "token_lengths.png", {k: v for k, v in sorted(counts.lengths.items())}, bins=30,
                      title="Length of usable teacher responses", xlabel=label)
        out.publish(report, {"records": counts.kept, "read": counts.read, "policy": config.policy})
    log.info("published %s: %d of %d teacher responses kept (%s)", output, counts.kept, counts.read, config.policy)
    return report


def conversation(row: dict[str, Any], fallback_prompt: str) -> list[dict[str, str]]:
    """The conversation the teacher answered: the row's `messages` (system prompt and earlier turns included) as
    `klear sample` recorded them, a list of {role, content} turns the sample-row reader has checked; for rows
    without them (other tools' files), the prompt as one user turn."""
    recorded = row.get("messages")
    if not recorded:
        return [{"role": "user", "content": str(row.get("prompt") or fallback_prompt)}]
    return [{"role": t["role"], "content": t["content"]} for t in recorded]


def _select(rows: list[dict[str, Any]], levels: dict[str, float | None], have_reference: bool, tok: Any,
            config: SftDataConfig, counts: _Counts) -> dict[str, list[Any]]:
    """The kept records of one batch (columns of RECORD_SCHEMA); counts everything on the way."""
    sources: dict[str, tuple[str, str]] = {}  # id -> (source, problem prompt): one record parse per prompt
    usable = []
    for row in rows:
        counts.read += 1
        pid = str(row["id"])
        if pid not in sources:
            flat = unwrap_record({"record": row.get("record")}) or {}
            prompt = prompt_text(flat) or ""
            sources[pid] = (str(row.get("source") or flat.get("source") or "unknown"), prompt)
        source = sources[pid][0]
        text = str(row.get("response") or "")
        if truncated(response_parts(row), row.get("finish_reason")):
            counts.dropped["truncated"] += 1
            counts.truncated_per_source[source] += 1
            continue
        messages = [*conversation(row, sources[pid][1]), {"role": "assistant", "content": text}]
        usable.append((row, source, messages))
    lengths = count_tokens(tok, [m for _, _, m in usable]) if tok is not None else [None] * len(usable)
    out: dict[str, list[Any]] = {name: [] for name in RECORD_SCHEMA.names}
    for (row, source, messages), tokens in zip(usable, lengths):
        pid = str(row["id"])
        correct = correctness(row.get("kind"), row.get("correct"))
        rate = levels.get(pid)
        level = difficulty(rate, config.easy_threshold)
        if have_reference:
            (counts.reference_ids if pid in levels else counts.no_reference_ids).add(pid)
        label = _label(correct)
        counts.unlabelled += correct is None
        counts.matrix[source][level][label] += 1
        measured = tokens if tokens is not None else row.get("completion_tokens")
        if measured is not None:
            counts.lengths[label].append(int(measured))
        if tokens is not None and tokens > config.max_length:
            counts.dropped["too_long"] += 1
            continue
        for policy in POLICIES:
            counts.would_keep[policy] += keeps(policy, level, correct, config.unknown_as, config.keep_unlabelled)
        if not keeps(config.policy, level, correct, config.unknown_as, config.keep_unlabelled):
            counts.dropped["policy"] += 1
            continue
        counts.kept += 1
        counts.kept_matrix[source][level][label] += 1
        for name, value in (("messages", messages), ("id", pid), ("sample", int(row["sample"])), ("source", source),
                            ("difficulty", level), ("correct", correct), ("reference_pass_rate", rate),
                            ("tokens", tokens), ("verdict", row.get("verdict"))):
            out[name].append(value)
    return out


def _report(samples: str, reference: str | None, tokenizer: str | None, ref_report: dict[str, Any] | None,
            config: SftDataConfig, counts: _Counts, elapsed: float) -> dict[str, Any]:
    def plain(matrix: dict[str, dict[str, Counter[str]]]) -> dict[str, Any]:
        return {s: {d: dict(c) for d, c in sorted(levels.items())} for s, levels in sorted(matrix.items())}

    all_lengths = sorted(v for values in counts.lengths.values() for v in values)
    if tokenizer:
        length_note = (f"length filter ran: records over max_length={config.max_length} tokens of {tokenizer} "
                       f"(chat template '{config.chat_template}') were dropped")
    else:
        length_note = ("NO length filter ran: no --tokenizer was given, so records longer than SFT's max_length "
                       f"({config.max_length}) were not measured; `klear sft` will skip them itself. Lengths below are "
                       "the sampling model's completion tokens.")
    return {
        "stage": "sft-data",
        "samples": samples,
        "reference": reference,
        "policy": config.policy,
        "totals": {"read": counts.read, "kept": counts.kept, "dropped": dict(counts.dropped),
                   "unlabelled": counts.unlabelled},
        "would_keep": {p: counts.would_keep[p] for p in POLICIES},
        "per_source": plain(counts.matrix),
        "kept_per_source": plain(counts.kept_matrix),
        "truncated_per_source": dict(counts.truncated_per_source),
        "difficulty": ref_report or {"note": "no --reference: every prompt's difficulty is unknown "
                                              f"(treated as {config.unknown_as})"},
        "prompts_missing_from_reference": len(counts.no_reference_ids),
        "prompts_missing_from_reference_ids": sorted(counts.no_reference_ids)[:20],
        "length": {"tokenizer": tokenizer, "note": length_note, "max_length": config.max_length,
                   "count": len(all_lengths), "min": all_lengths[0] if all_lengths else None,
                   "median": all_lengths[len(all_lengths) // 2] if all_lengths else None,
                   "p95": all_lengths[int(0.95 * (len(all_lengths) - 1))] if all_lengths else None,
                   "max": all_lengths[-1] if all_lengths else None},
        "config": config.model_dump(mode="json"),
        "elapsed_s": round(elapsed, 3),
    }


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sft-data", help="SFT chat records from teacher samples, by difficulty and correctness",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", required=True, metavar="URI", help="teacher samples: output of `klear sample` or `klear judge`")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    parser.add_argument("--reference", default=None, metavar="URI", help="reference-model samples that label difficulty")
    parser.add_argument("--tokenizer", default=None, metavar="URI",
                        help="target model or tokenizer folder for the length filter (default: config key tokenizer)")
    STAGE.add_main(parser, lambda args, config: run(args.samples, args.output, config, args.reference, args.tokenizer),
                   lambda report: {**report["totals"], "would_keep": report["would_keep"]})
