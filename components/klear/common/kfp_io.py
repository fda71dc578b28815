"""Glue between KFP artifacts and stage URIs, shared by the component wrappers.

A stage writes either into its output artifact's own folder (KFP then stores it under the
pipeline root on object storage), or, when the pipeline names a `run_root`, to
`<run_root>/<run id>/<stage>`; the artifact's metadata records the URI either way, so the next
stage, the UI's lineage view and single-stage reruns all find the data.
"""

from __future__ import annotations

import os
from typing import Any

URI_KEY = "uri"


def output_location(artifact: Any, run_root: str, run_id: str, stage: str) -> str:
    if run_root:
        return f"{run_root.rstrip('/')}/{run_id}/{stage}"
    return artifact.path


def input_location(artifact: Any) -> str:
    """Where an input artifact's data is: the URI a stage recorded, the launcher's local copy, or an imported URI."""
    recorded = (artifact.metadata or {}).get(URI_KEY)
    if recorded:
        return recorded
    path = artifact.path
    if path and os.path.exists(path):
        return path
    # dsl.importer under kfp.local does not download s3:// URIs; read them where they are.
    return artifact.uri


def record_output(artifact: Any, location: str, extra: dict[str, Any] | None = None) -> None:
    artifact.metadata[URI_KEY] = location
    for key, value in (extra or {}).items():
        artifact.metadata[key] = value
