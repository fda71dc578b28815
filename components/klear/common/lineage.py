"""Lineage: what each published output was made from, and the chain from any output back to the source prompts.

Every `storage.publish_dir` writes `meta.lineage` into the manifest (`record`):

    inputs  every location the run read, as its stage declared them to `storage.check_writes` (the one place every
            stage names its inputs before any work): {"uri", "digest", "stage"}; `digest` is `storage.content_digest`
            (for a published output, a sha256 over its manifest's file checksums, so equal content gives an equal
            digest whoever published it), `stage` the stage that published the input, if any
    config  the stage's full config (every key, presets and overrides applied)
    preset  the presets it was built from: {"preset", "bases", "overrides"} (klear.common.config.preset_of)
    code    {"package", "version", "commit"}: the commit from KLEAR_GIT_COMMIT (the images bake it in at build time:
            `--build-arg KLEAR_GIT_COMMIT=$(git rev-parse HEAD)`), else from the source checkout's git, if any
    kfp     {"run_id", "task"} inside a pipeline: KLEAR_RUN_ID (the pod's `pipeline/runid` label) and KLEAR_TASK_POD
            (the pod's name, unique per task attempt). Both reach the pod through the downward API, not as task
            parameters: a value that changes every run would enter KFP's cache key and defeat caching.

`trace(uri)` walks those records from any output back to the sources; `klear lineage URI` prints the walk as text
and as a Mermaid graph.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klear.common import storage

CODE_COMMIT_ENV = "KLEAR_GIT_COMMIT"
RUN_ID_ENV = "KLEAR_RUN_ID"  # the same variable as klear.common.kfp_io.RUN_ID_ENV
TASK_ENV = "KLEAR_TASK_POD"
PACKAGE = "klear-pipeline"

# Per stage, the config keys a reader of the chain wants to see first (the full config stays in the manifest).
KEY_SETTINGS: dict[str, tuple[str, ...]] = {
    "curate": ("ngram_size",),
    "sample": ("backend", "n", "temperature", "top_p", "max_tokens", "seed"),
    "judge": ("task", "scorer"),
    "sft-data": ("policy", "easy_threshold", "max_length"),
    "sft": ("learning_rate", "min_learning_rate", "num_epochs", "max_length", "per_device_batch_size", "seed"),
    "rl-filter": ("task", "min_tests", "keep_above", "samples_per_problem"),
    "gppo": ("task", "loss", "eps_low", "eps_high", "learning_rate", "max_steps", "num_generations", "seed"),
}
# Manifest meta keys worth showing beside them (a stage's own headline figures).
KEY_META = ("kept", "read", "records", "rows", "policy", "task", "global_step", "scores", "settings_hash", "seed")


# --------------------------------------------------------------------------- what a manifest records


@functools.cache
def _checkout_commit() -> str:
    """The commit of the source checkout this package runs from ("" in an image or an installed wheel)."""
    source = Path(__file__).resolve().parents[3]
    if not (source / ".git").exists():
        return ""
    try:
        done = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def code_version() -> dict[str, str]:
    from importlib import metadata

    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        version = ""
    return {"package": PACKAGE, "version": version,
            "commit": os.environ.get(CODE_COMMIT_ENV, "").strip() or _checkout_commit()}


def pipeline_ids() -> dict[str, str]:
    """The KFP run and task of this process; {} outside a pipeline."""
    ids = {"run_id": os.environ.get(RUN_ID_ENV, "").strip(), "task": os.environ.get(TASK_ENV, "").strip()}
    return {key: value for key, value in ids.items() if value}


def input_record(spec: str) -> dict[str, Any]:
    """One input: its URI as given, its content digest and the stage that published it ("" when none)."""
    location = spec.partition("#")[0]
    entry: dict[str, Any] = {"uri": spec, "digest": "", "stage": ""}
    try:
        entry["digest"] = storage.content_digest(location)
        entry["stage"] = str(storage.read_manifest(location).meta.get("stage") or "")
    except (storage.UnpublishedOutputError, NotADirectoryError):  # a source: a plain file or folder
        pass
    except (FileNotFoundError, storage.StorageError, OSError) as exc:
        entry["missing"] = str(exc)  # a shipped benchmark name, a deleted temp file: recorded, not fatal
    return entry


def input_records(inputs: Iterable[str]) -> list[dict[str, Any]]:
    return [input_record(spec) for spec in dict.fromkeys(inputs)]


def record(inputs: list[dict[str, Any]], config: Mapping[str, Any] | None) -> dict[str, Any]:
    """`meta.lineage` of an output made from `inputs` (`input_records`) under `config` (and the presets that config
    was loaded from in this process, if it was)."""
    from klear.common.config import preset_of

    lineage: dict[str, Any] = {"inputs": inputs, "config": dict(config) if config is not None else None,
                               "code": code_version()}
    preset = preset_of(config) if config is not None else None
    if preset is not None:
        lineage["preset"] = preset
    ids = pipeline_ids()
    if ids:
        lineage["kfp"] = ids
    return lineage


# --------------------------------------------------------------------------- the walk


@dataclass
class Edge:
    role: str  # what the consumer called it ("samples", "model"), else the input's stage
    uri: str
    digest: str  # as recorded when the consumer was made
    current: str  # the input's digest now ("" when not published or unreadable)

    @property
    def changed(self) -> bool:
        """The input was republished with other content after the consumer was made."""
        return bool(self.digest and self.current and self.digest != self.current)


@dataclass
class Step:
    uri: str
    stage: str  # "" for a source that is no klear output (prompt files, a base model folder)
    digest: str
    created: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    code: dict[str, str] = field(default_factory=dict)
    kfp: dict[str, str] = field(default_factory=dict)
    inputs: list[Edge] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"uri": self.uri, "stage": self.stage, "digest": self.digest, "created": self.created,
                "settings": self.settings, "code": self.code, "kfp": self.kfp, "note": self.note,
                "inputs": [{"role": e.role, "uri": e.uri, "digest": e.digest, "changed": e.changed}
                           for e in self.inputs]}


def key_settings(stage: str, meta: Mapping[str, Any], config: Mapping[str, Any] | None,
                 preset: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The few settings that tell one step of the chain from another: the preset, headline meta, then the stage's
    key config."""
    from klear.common.config import describe_preset

    shown: dict[str, Any] = {"preset": describe_preset(preset)} if preset else {}
    shown |= {key: meta[key] for key in KEY_META if key in meta and not isinstance(meta[key], (list, dict))}
    if isinstance(meta.get("scores"), dict):
        shown["scores"] = meta["scores"]
    for key in KEY_SETTINGS.get(stage, ()):
        if config and key in config and not isinstance(config[key], (list, dict)):
            shown[key] = config[key]
    return shown


def _roles(meta: Mapping[str, Any]) -> dict[str, str]:
    """URI -> the role its consumer gave it (`meta.inputs`: role -> URIs)."""
    roles: dict[str, str] = {}
    for role, uris in (meta.get("inputs") or {}).items():
        for uri in uris if isinstance(uris, list) else [uris]:
            roles.setdefault(str(uri), str(role))
    return roles


def _recorded_inputs(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    lineage = meta.get("lineage") or {}
    if lineage.get("inputs") is not None:
        return list(lineage["inputs"])
    # Outputs published before lineage was recorded: the roles' URIs, without digests.
    return [{"uri": uri, "digest": "", "stage": ""} for uri in _roles(meta)]


def step_of(uri: str) -> Step:
    """One output's step, read from its manifest; a location without one is a source."""
    location = uri.partition("#")[0]
    try:
        manifest = storage.read_manifest(location)
    except (storage.UnpublishedOutputError, NotADirectoryError):  # a plain file: the manifest path lies inside it
        try:
            digest = storage.content_digest(location)
        except (FileNotFoundError, storage.StorageError, OSError) as exc:
            return Step(uri, "", "", note=f"source, unreadable now: {exc}")
        return Step(uri, "", digest, note="source (no manifest)")
    except (FileNotFoundError, storage.StorageError, OSError) as exc:
        return Step(uri, "", "", note=f"unreadable: {exc}")
    meta = manifest.meta
    lineage = meta.get("lineage") or {}
    stage = str(meta.get("stage") or "")
    roles = _roles(meta)
    edges = []
    for entry in _recorded_inputs(meta):
        current = ""
        if entry.get("stage"):  # published inputs only: their digest is a manifest read, not a hash of the data
            try:
                current = storage.content_digest(str(entry["uri"]).partition("#")[0])
            except (FileNotFoundError, storage.StorageError, OSError):
                current = ""
        edges.append(Edge(roles.get(str(entry["uri"]), str(entry.get("stage") or "source")), str(entry["uri"]),
                          str(entry.get("digest") or ""), current))
    return Step(uri, stage, storage.content_digest(location), manifest.created,
                key_settings(stage, meta, lineage.get("config"), lineage.get("preset")),
                dict(lineage.get("code") or {}), dict(lineage.get("kfp") or {}), edges,
                "" if lineage else "published before lineage was recorded")


def trace(uris: str | Sequence[str], max_steps: int = 500) -> list[Step]:
    """Every step from `uris` back to the sources, each once, nearest first (breadth-first)."""
    queue = [uris] if isinstance(uris, str) else list(uris)
    seen: dict[str, Step] = {}
    while queue and len(seen) < max_steps:
        uri = queue.pop(0)
        if uri in seen:
            continue
        step = seen[uri] = step_of(uri)
        queue += [edge.uri for edge in step.inputs if edge.uri not in seen]
    return list(seen.values())


def sources(steps: Sequence[Step]) -> list[Step]:
    """The steps no klear stage published: prompt files, a base model folder, benchmark files."""
    return [step for step in steps if not step.stage]


# --------------------------------------------------------------------------- rendering


def _short(digest: str) -> str:
    return digest[:12] if digest else "-"


def render_text(steps: Sequence[Step]) -> str:
    lines = []
    for step in steps:
        head = f"{step.stage or 'source'}  {step.uri}  digest {_short(step.digest)}"
        if step.created:
            head += f"  created {step.created}"
        lines.append(head)
        if step.settings:
            lines.append("    settings: " + json.dumps(step.settings, sort_keys=True, default=str))
        if step.code:
            lines.append(f"    code: {step.code.get('package', '')} {step.code.get('version', '')} "
                         f"commit {step.code.get('commit') or 'unknown'}")
        if step.kfp:
            lines.append("    kfp: " + ", ".join(f"{k} {v}" for k, v in sorted(step.kfp.items())))
        if step.note:
            lines.append(f"    note: {step.note}")
        for edge in step.inputs:
            flag = "  CHANGED since (now " + _short(edge.current) + ")" if edge.changed else ""
            lines.append(f"    <- {edge.role}: {edge.uri} (digest {_short(edge.digest)}){flag}")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    # Mermaid labels are quoted strings: no quotes, no markup, no line breaks of their own.
    return "".join(ch if ch.isalnum() or ch in " ./:_-=@,+()" else " " for ch in text)[:120]


def render_mermaid(steps: Sequence[Step]) -> str:
    """A Mermaid flowchart, sources at the top, the traced output at the bottom."""
    ids = {step.uri: f"n{i}" for i, step in enumerate(steps)}
    lines = ["flowchart TD"]
    for step in steps:
        # " · ", not <br/>: the reports that embed the graph carry no HTML (their tests refuse any "<")
        label = f"{step.stage or 'source'} · {_mermaid_text(step.uri)} · {_short(step.digest)}"
        lines.append(f'  {ids[step.uri]}["{label}"]')
    for step in steps:
        for edge in step.inputs:
            if edge.uri in ids:
                arrow = "-. changed .->" if edge.changed else "-->"
                lines.append(f"  {ids[edge.uri]} {arrow}|{_mermaid_text(edge.role)}| {ids[step.uri]}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- `klear lineage`


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("lineage", help="the chain from an output back to its source prompts",
                                   description="Print every step from a published output back to the sources it "
                                               "was made from, with each step's key settings and digests.")
    parser.add_argument("uri", nargs="+", help="published outputs (path, file:// or s3://)")
    parser.add_argument("--format", choices=("text", "mermaid", "json"), default="text",
                        help="text (default), a Mermaid flowchart, or JSON")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    for uri in args.uri:
        storage.read_manifest(uri)  # an unpublished location is an error here, not a one-step chain
    steps = trace(args.uri)
    if args.format == "json":
        print(json.dumps([step.to_json() for step in steps], indent=2, default=str))
    elif args.format == "mermaid":
        print(render_mermaid(steps), end="")
    else:
        print(render_text(steps), end="")
        print("\n" + render_mermaid(steps), end="")
    return 0
