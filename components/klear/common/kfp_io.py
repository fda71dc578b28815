"""Glue between KFP artifacts and stage URIs, shared by the component wrappers.

A stage writes to `<run_root>/<run id>/<stage>` on object storage, as it goes: shards, checkpoints and
the final manifest, so a retried pod resumes from what its predecessor published. The output artifact's
metadata records that URI, so the next stage, the UI's lineage view and single-stage reruns find the data.
The work areas of sampling and judging uses are keyed by content instead (`<run_root>/work/<use>-<key>`): a new
run with the same inputs and settings finds every unit an earlier run left there.

The run id comes from the environment, not from a task parameter: a parameter that changes every run
would be part of KFP's cache key and no deterministic stage could ever be served from the cache. On a
cluster the pipeline sets KLEAR_RUN_ID from the pod's `pipeline/runid` label (downward API);
`pipelines.run_local` sets a fresh one for each kfp.local run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from klear.common import storage
from klear.common.storage import RUN_ID_ENV  # the pipeline sets it; storage's leases read it too

URI_KEY = "uri"

# Set by the compiled pipeline on a training stage's launching pod, read by klear.training.trainjob: the image
# its multi-node jobs run (the one compiled in), the pod's own name (its scheduling and its owner, the run's
# Workflow, become the job's), and the kind of
# Kubeflow Trainer job (KLEAR_TRAINER_API=v2: TrainJob on runtime KLEAR_TRAINER_RUNTIME; else PyTorchJob).
IMAGE_ENV, POD_NAME_ENV = "KLEAR_TRAIN_IMAGE", "KLEAR_POD_NAME"
API_ENV, RUNTIME_ENV = "KLEAR_TRAINER_API", "KLEAR_TRAINER_RUNTIME"


SCRATCH_ENV = "KLEAR_SCRATCH"  # the task's scratch volume (pipelines/definitions.py mounts one where a task stages)
# Scratch of the tasks that stage on disk (pipelines/definitions.py gives them these; klear plan checks them): a
# generic ephemeral volume (a PVC of the cluster's default StorageClass, made and deleted with the pod) at
# SCRATCH_PATH. KFP 2.17 sets no ephemeral-storage request (kubeflow/pipelines#11137): a pod staging on its root
# disk could be evicted, or fill the node. A merge holds a part or two and its spill (a judge merge its whole
# output, twice); a slice pod its model folder (an endpoint slice none) and a few shards.
SCRATCH_PATH = "/scratch"
MERGE_SCRATCH, MODEL_SLICE_SCRATCH, ENDPOINT_SLICE_SCRATCH = "512Gi", "64Gi", "16Gi"


def use_scratch() -> str:
    """Stage temporary files on the task's scratch volume (KLEAR_SCRATCH) where the pod has one: Python's tempfile,
    and through it storage's staging folders and a downloaded model. Not TMPDIR itself: the KFP bootstrap's
    `mktemp` reads it before the volume's folder is known to exist (kfp.local mounts none). Returns the folder
    used."""
    import tempfile

    folder = os.environ.get(SCRATCH_ENV, "").strip()
    if folder and os.path.isdir(folder):
        tempfile.tempdir = folder
    return tempfile.gettempdir()


def run_id() -> str:
    value = os.environ.get(RUN_ID_ENV, "").strip()
    if not value:
        raise RuntimeError(f"{RUN_ID_ENV} is not set: on a cluster the compiled pipeline sets it from the pod's "
                           "pipeline/runid label; locally, run pipelines with `python -m pipelines.run_local`")
    return value


def _root(run_root: str) -> str:
    if not run_root.strip():
        raise ValueError("run_root is empty: name the object-storage folder for stage outputs and checkpoints "
                         "(s3://bucket/runs), or a local folder for kfp.local runs")
    return run_root.rstrip("/")


def output_location(run_root: str, stage: str) -> str:
    """`<run_root>/<run id>/<stage>`: where a stage publishes, the same for every retry of its pod."""
    return f"{_root(run_root)}/{run_id()}/{stage}"


def content_key(identity: Mapping[str, Any]) -> str:
    """16 hex digits of sha256 over `identity` (JSON, keys sorted): what decides a work area's contents."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def work_location(run_root: str, use: str, identity: Mapping[str, Any]) -> str:
    """`<run_root>/work/<use>-<key>`: the work area of a sampling or judging use, keyed by what decides its units
    (input locations, their content digest, the model, the settings), not by the run: a retried pod and a new run
    with the same inputs and settings find every unit already done there."""
    return f"{_root(run_root)}/work/{use}-{content_key(identity)}"


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


def inputs_digest(specs: Iterable[str]) -> str:
    """One sha256 over the content of the inputs a stage reads by URI ("" skipped; a `#...` field mapping is kept
    beside the content it maps). KFP's cache key holds a URI, not what it points at, and outputs change in place
    by design (sample tops up to a larger n): a cached task takes this digest as an input, so a cache hit is
    served only for the same content."""
    parts = [(spec, storage.content_digest(spec.partition("#")[0])) for spec in specs if spec.partition("#")[0]]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def record_output(artifact: Any, location: str, extra: dict[str, Any] | None = None) -> None:
    """Point the output artifact at the published data: its metadata (what the next stage and the UI read) and
    its own small file, which the artifact store keeps (and kfp.local's cache requires: an artifact without
    its file counts as lost)."""
    artifact.metadata[URI_KEY] = location
    for key, value in (extra or {}).items():
        artifact.metadata[key] = value
    if artifact.path:
        os.makedirs(os.path.dirname(artifact.path) or ".", exist_ok=True)
        with open(artifact.path, "w") as fh:
            json.dump({URI_KEY: location, **(extra or {})}, fh)


def publish_report(summary: Any, markdown: str, metrics: Any, values: Iterable[tuple[str, float]]) -> None:
    """Fill a stage's UI outputs: the Markdown summary and the Metrics. The metrics are also written to the
    Metrics artifact's own file, like every output artifact here (kfp.local's cache needs the file)."""
    with open(summary.path, "w") as fh:
        fh.write(markdown)
    logged = {}
    for key, value in values:
        metrics.log_metric(key, value)
        logged[key] = value
    if metrics.path:
        os.makedirs(os.path.dirname(metrics.path) or ".", exist_ok=True)
        with open(metrics.path, "w") as fh:
            json.dump(logged, fh)
