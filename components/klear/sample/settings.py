"""The settings that decide what a unit's response is, and what keeps an output and its work area to one set of
them: a restart under other settings is refused, naming what changed; a work area removed after publishing is
refilled from the published output first."""

from __future__ import annotations

import logging
from typing import Any

from klear.common import storage
from klear.sample.backends.base import Backend
from klear.sample.config import SampleConfig
from klear.sample.store import ResumeMismatchError, WorkArea, current_rows

log = logging.getLogger("klear.sample")

SETTINGS_FORMAT = 1
PUBLISHED_PREFIX = "0-published"  # sorts before every writer name: the published rows win over duplicates


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
    be lost if that is interrupted. Shard names are fixed, so an interrupted import simply repeats. One part at
    a time (storage.iter_published): the pod's disk holds one part, not the output (a teacher's is tens of GB)."""
    rows = 0
    import pyarrow.parquet as pq

    manifest = storage.read_manifest(output)
    parts = sorted(rel for rel in manifest.files if rel.startswith("samples/") and rel.endswith(".parquet"))
    for i, (_, path) in enumerate(storage.iter_published(output, manifest, parts)):
        table = current_rows(pq.read_table(path))  # an output of an earlier version: as the schema is now
        area.write_table(f"{PUBLISHED_PREFIX}-{i:05d}", table)
        rows += table.num_rows
    return rows


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
