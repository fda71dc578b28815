"""Entry point of the sample stage: n responses per prompt, from a model or an endpoint, exactly once.

    klear sample --prompts URI [URI ...] --output URI [--model URI | --endpoint URL --served-model NAME]
                 [--work URI] [--slice I/N | --merge] [--config paper|tiny|FILE] [--set key=value ...]

Prompts: curate's output (its prompts/), or JSONL/Parquet/datasets sources (URI#prompt=FIELD&id=FIELD); every
prompt needs a unique id. Backends: an OpenAI-compatible endpoint (--endpoint; key from $OPENAI_API_KEY or
the variable `api_key_env` names), vLLM offline (--model on a GPU), transformers (--model on CPU), or the
responses the records already hold (--set backend=records).

Work is kept per unit (prompt id, sample index) in shards under the work area (default <output>.work),
under a hash of the settings that decide what is sampled; a restart, on any pod, samples only the missing
units, and a restart under other settings is refused. When every unit is done (or failures stay within
max_failed_fraction) the stage publishes, manifest last:

    samples/part-*.parquet   one row per (prompt, sample): id, sample, prompt, response, reasoning, final,
                             finish_reason, prompt_tokens, completion_tokens, model, source, record, seed,
                             attempts, prompt_hash, messages (rows in prompt order, then sample index: the same
                             rows in the same order however many slices, pods or restarts sampled them)
    failed/part-*.parquet    units that failed every attempt: id, sample, error_kind, error, attempts
    report.json, report.md   settings, backend, versions, counts, failures by kind, tokens, speed

Each samples/ part is uploaded as soon as it is written and deleted locally (the manifest still goes last), so
publishing holds a part or two on local disk, not the output; a publish cut short leaves no manifest (readers
refuse the output) and the next run replaces what it uploaded.

Over many pods: `--slice I/N` samples only the prompts whose id hashes into slice I of N (units.slice_of) into
the work area every slice of the run shares, records the slice's failed units in <work>/slices/I-of-N/ and
publishes nothing (one pod per slice: its lease is that folder). `--merge`, with the same flags, samples
nothing: it publishes once every unit is in a shard or recorded as failed by a slice, and refuses, naming the
missing units, before that.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from klear.common import storage
from klear.common.data_stage import DataStage
from klear.common.records import ParquetShardWriter
from klear.common.slices import add_slice_arguments, work_beside
from klear.sample.config import SampleConfig
from klear.sample.coordinator import (
    Assembled,
    choose,
    choose_backend,
    make_requests,
    map_large_allocations,
    positions_of,
    release_freed_memory,
    sample_units,
    sigterm_as_exit,
    start_engine,
    write_in_order,
)
from klear.sample.merge import SampleFailedError, build_report, failure_message, finish, publish_samples, run_merge, run_slice
from klear.sample.progress import Progress, ProgressLogger
from klear.sample.prompts import load_prompts
from klear.sample.report import render_markdown
from klear.sample.settings import open_work_area
from klear.sample.store import FAILED_SCHEMA, WorkArea, failed_row
from klear.sample.units import Plan, parse_slice, pending_positions, units_digest

log = logging.getLogger("klear.sample")
STAGE = DataStage("sample", SampleConfig, render_markdown)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sample", help="n responses per prompt from a model or endpoint, exactly once",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", nargs="+", action="extend", required=True, metavar="URI",
                        help="prompt sources: curate outputs or files, URI[#prompt=FIELD&id=FIELD]; repeatable")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    parser.add_argument("--model", metavar="URI", help="model folder (published or plain Hugging Face)")
    parser.add_argument("--endpoint", metavar="URL", help="OpenAI-compatible API root, e.g. http://teacher:8000/v1")
    parser.add_argument("--served-model", metavar="NAME", help="the model name the endpoint serves")
    parser.add_argument("--work", metavar="URI", help="work area for resumable shards (default: <output>.work)")
    add_slice_arguments(parser, "sample", "prompt",
                        "sample nothing: publish the slices' units once every unit is in a shard or failed")
    STAGE.add_main(parser, lambda args, config: run(args.prompts, args.output, config, model=args.model,
                                                    endpoint=args.endpoint, served_model=args.served_model,
                                                    work=args.work, slice_spec=args.slice_spec, merge=args.merge),
                   lambda report: {"units": report["units"], "speed": report["speed"]})


def run(prompts: Sequence[str], output: str, config: SampleConfig, model: str | None = None,
        endpoint: str | None = None, served_model: str | None = None, work: str | None = None,
        slice_spec: str | None = None, merge: bool = False) -> dict[str, Any]:
    """Sample every missing unit and publish `output`; returns the report. Raises SampleFailedError (after
    keeping what completed) when more units failed than max_failed_fraction allows.

    `slice_spec` "I/N": sample only the prompts of slice I of N into the work area, publish nothing (run_slice);
    `merge`: sample nothing, publish what the slices sampled once every unit is done or failed (run_merge)."""
    started = time.monotonic()
    # Arrow's default pool (mimalloc) keeps freed buffers resident: the work area's keys and the merge's buckets
    # would stay in RSS after use. The system allocator returns them (tens of millions of units at paper scale).
    pa.set_memory_pool(pa.system_memory_pool())
    map_large_allocations()  # and each large buffer as soon as it is freed, not when the heap is next trimmed
    if slice_spec is not None and merge:
        raise ValueError("--slice and --merge exclude each other: slices sample, the merge publishes")
    part = parse_slice(slice_spec) if slice_spec is not None else None
    kind = choose_backend(config.backend, model, endpoint)
    # In seconds, before any work: a bad output or work location, one that is (inside) an input or the other.
    work_uri = str(work or work_beside(storage.Uri.parse(output)))
    checked = STAGE.check(output, {"prompts": prompts, "model": model}, work=work_uri, role="--output", config=config)
    out = checked.uri
    assert checked.work is not None
    area = WorkArea(checked.work)
    area.check_own()
    items = load_prompts(prompts, config, with_shipped=kind == "records")
    if config.max_prompts:
        items = items[: config.max_prompts]
    counts = [min(config.n, len(p.shipped)) for p in items] if kind == "records" else [config.n] * len(items)
    digest_of_units = units_digest(items, counts)
    if part is not None:  # a slice plans its own prompts' units
        return run_slice(part, prompts, out, area, config, kind, items, counts, digest_of_units, model, endpoint,
                         served_model, started)
    plan = Plan.of(items, counts)
    if merge:
        n_prompts = len(items)
        del items  # the merge needs the plan's arrays only: the prompts' columns go before the keys are read
        return run_merge(checked, area, config, kind, n_prompts, plan, digest_of_units, served_model, prompts, started)
    total = plan.total
    with contextlib.ExitStack() as stack:
        # One writer per output: a second run (a retried pod while the first still runs) fails here, at once.
        publication = stack.enter_context(checked.open())
        backend, settings, digest, published = start_engine(stack, kind, config, model, endpoint, served_model, out, area)
        if published is not None and published["units_digest"] == digest_of_units and published["failed"] == 0:
            # A retried task whose first try had published: the output is already this run's.
            log.info("%s already holds all %d units of this run under these settings; nothing to do", out, total)
            return dict(orjson.loads(storage.read_bytes(out.join("report.json"))))
        open_work_area(out, area, settings, digest, published)

        chosen = choose(plan, area.scan())
        pending = pending_positions(plan, chosen.positions)
        release_freed_memory()  # the scan's keys: sampling reuses nothing of them
        done_before = total - len(pending)
        log.info("%d prompts, %d units; %d done in %s (%d shards), %d to sample with %s", len(items), total,
                 done_before, area, len(chosen.shards), len(pending), kind)
        requests = make_requests(items, plan, pending, config.unit_seed_base())
        del chosen, pending
        progress = Progress(total=total, done_before=done_before)
        with ProgressLogger(progress, config.progress_seconds, log), sigterm_as_exit():
            failed = sample_units(backend, area, requests, config, progress) if requests else []
        progress.finish()
        log.info("sampling done; progress: %s", progress.line())

        failed_rows = [failed_row(c) for c in failed]
        too_many = len(failed) > config.max_failed_fraction * total
        staging = publication.staging
        failed_writer = ParquetShardWriter(staging / "failed", "part", FAILED_SCHEMA, 100_000)
        failed_writer.write(pa.Table.from_pylist(failed_rows, schema=FAILED_SCHEMA))
        failed_writer.close()
        assembled, duplicates = Assembled(), 0
        if not too_many:
            chosen = choose(plan, area.scan())
            duplicates = chosen.duplicates
            assembled = write_in_order(area, chosen, staging, config.rows_per_part, ship=publication.ship)
            failed_at = positions_of(plan, [(c.request.prompt.id, c.request.sample, c.request.prompt.hash)
                                            for c in failed])
            missing = pending_positions(plan, np.concatenate([chosen.positions, failed_at]))
            if len(missing):  # every unit is either in a shard or failed in this run; anything else is a bug
                raise RuntimeError(f"internal error: {len(missing)} units neither sampled nor failed, e.g. "
                                   f"{plan.keys(missing[:3])}")
        report = build_report(
            prompts=prompts, output=str(out), work=str(area), backend=backend, config=config, settings=settings,
            digest=digest, n_prompts=len(items), total=total, done_before=done_before, progress=progress,
            failed=failed_rows, assembled=assembled, elapsed=time.monotonic() - started,
            scan_duplicates=duplicates, published=not too_many)
        if too_many:  # the report goes beside the kept units in the work area; the output stays as it was
            publication.write_report(report)
            for name in ("report.json", "report.md", "failed/part-00000.parquet"):
                storage.upload_file(staging / name, area.uri.join(name))
            raise SampleFailedError(failure_message(failed_rows, total, config, progress.ok + done_before, area))
        publish_samples(publication, report, settings, digest, assembled.rows, len(failed), digest_of_units)
    finish(area, config, f"published {out}: {assembled.rows} rows, {len(failed)} failed units", started)
    return report


def iter_rows(output: str) -> Iterator[dict[str, Any]]:
    """The published samples of an output, row by row (for tests and small consumers)."""
    import pyarrow.parquet as pq

    with storage.fetch_published(output) as (local, manifest):
        for rel in sorted(manifest.files):
            if rel.startswith("samples/") and rel.endswith(".parquet"):
                yield from pq.read_table(local / rel).to_pylist()
