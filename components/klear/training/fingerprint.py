"""What a training run is a run of: its base model, its data and the config values that change what it learns.

Every checkpoint records the fingerprint; a restart into the same output resumes only a run of the same
thing, so a model is never published having been trained partly on other data or another config.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from klear.common import storage

# Keys that change how a run is kept, logged or parallelised, not what it learns: a restart may change them.
NOT_LEARNED = frozenset({"resume", "keep_checkpoints", "save_steps", "save_minutes", "logging_steps",
                         "dataset_num_proc"})
PARTS = ("model", "data", "config")


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def config_digest(values: Mapping[str, Any]) -> str:
    return digest({key: value for key, value in values.items() if key not in NOT_LEARNED})


def data_digest(specs: Sequence[str]) -> str:
    """The sources in order: each one's field mapping (the `#...` fragment) and content, not its path, so the
    same data staged at another path (a retried pod) is the same data."""
    parts = []
    for spec in specs:
        uri, _, fields = spec.partition("#")
        parts.append((fields, storage.content_digest(uri)))
    return digest(parts)


def run_fingerprint(model: str, data: Sequence[str], config_values: Mapping[str, Any]) -> dict[str, str]:
    return {"model": storage.content_digest(model), "data": data_digest(data), "config": config_digest(config_values)}


def differing_parts(recorded: Mapping[str, str] | None, current: Mapping[str, str]) -> list[str]:
    """The parts ("model", "data", "config") in which a checkpoint's run differs from this one; [] when they are
    the same, or when the checkpoint predates fingerprints (nothing to compare)."""
    if not recorded:
        return []
    return [part for part in PARTS if recorded.get(part) != current.get(part)]


def mismatch_message(output: str, parts: Sequence[str]) -> str:
    return (f"{output} holds checkpoints of another run: its {', '.join(parts)} differ from this run's. Resuming "
            "would publish a model trained on both. Write to another --output, or --set resume=false to discard "
            "those checkpoints and train afresh")
