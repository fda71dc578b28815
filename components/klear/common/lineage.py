"""Lineage: what each published output was made from, and the chain from any output back to the source prompts.

Every stage's publish writes `meta.lineage` into the manifest (`record`, made by the publisher from what it is
handed: klear.common.data_stage for data stages, klear.training for a model and its checkpoints, through `RunLineage`):

    inputs  every location the run read, as its stage declared them (the inputs it checks its outputs against
            before any work, storage.check_writes): {"uri", "digest", "stage"} and "given" where the stage named it
            otherwise; `uri` is absolute and normalized (`location`: readable from any folder, one spelling per
            place), `digest` is `storage.content_digest` (for a published output, a sha256 over its manifest's file
            checksums, so equal content gives an equal digest whoever published it; for a source file, its sha256),
            `stage` the stage that published the input, if any
    config  the stage's full config (every key, presets and overrides applied)
    preset  the presets it was built from: {"preset", "bases", "overrides"} and "section" for a section of another
            stage's config (the config's klear.common.config.Provenance, as load_config built it)
    code    {"package", "version", "commit"}: the commit from KLEAR_GIT_COMMIT (the images bake it in at build time:
            `--build-arg KLEAR_GIT_COMMIT=$(git rev-parse HEAD)`), else from the source checkout's git, if any
    kfp     {"run_id", "task"} inside a pipeline: KLEAR_RUN_ID (the pod's `pipeline/runid` label) and KLEAR_TASK_POD
            (the pod's name, unique per task attempt). Both reach the pod through the downward API, not as task
            parameters: a value that changes every run would enter KFP's cache key and defeat caching.

`trace(uri)` walks those records from any output back to the sources, flagging an input (published or a source
file) whose content changed since; `klear lineage URI` prints the walk as text and as a Mermaid graph. The fields are
checked where they are read (`recorded`): a malformed one is named (manifest and field) in its step's note, never a
crash. Every value shown comes from a manifest: the text is one line per value, the Mermaid labels plain words.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klear.common import storage
from klear.common.config import StageConfig, describe_preset

CODE_COMMIT_ENV = "KLEAR_GIT_COMMIT"
RUN_ID_ENV = "KLEAR_RUN_ID"  # the same variable as klear.common.kfp_io.RUN_ID_ENV
TASK_ENV = "KLEAR_TASK_POD"
PACKAGE = "klear-pipeline"
log = logging.getLogger("klear.lineage")

# Per stage, the config keys a reader of the chain wants to see first (the full config stays in the manifest).
KEY_SETTINGS: dict[str, tuple[str, ...]] = {
    "curate": ("ngram_size",),
    "sample": ("backend", "n", "temperature", "top_p", "max_tokens", "seed"),
    "judge": ("task", "scorer"),
    "sft-data": ("policy", "easy_threshold", "max_length"),
    "sft": ("learning_rate", "min_learning_rate", "num_epochs", "max_length", "per_device_batch_size", "seed"),
    "rl-filter": ("task", "min_tests", "keep_above", "samples_per_problem"),
    "gppo": ("task", "loss", "eps_low", "eps_high", "learning_rate", "max_steps", "num_generations", "seed"),
    "evaluate": ("code_prompt", "settings_check"),
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


def location(spec: str) -> str:
    """`spec` (a path, file:// or s3:// URI, with an optional `#...` fragment) with its location absolute and
    normalized: readable from any folder, and one spelling per place (`out/x`, `./out/x/` and `/abs/out/x` are one
    step of a chain). A spec that names no location is returned as given: reading it fails later, with the reason."""
    where, hash_, fragment = spec.partition("#")
    if not where.strip():
        return spec
    try:
        loc = storage.Uri.parse(where)
    except storage.StorageError:
        return spec
    path = loc.path.rstrip("/") if loc.is_s3 else os.path.normpath(loc.path)
    return str(storage.Uri(loc.scheme, loc.bucket, path)) + hash_ + fragment


def input_record(spec: str) -> dict[str, Any]:
    """One input: its `location` (and `spec` as "given" when it differs: the stage's `meta.inputs` name it so), its
    content digest (a source file's too: a later edit is then flagged) and the stage that published it ("" when
    none)."""
    uri = location(spec)
    where = uri.partition("#")[0]
    entry: dict[str, Any] = {"uri": uri, "digest": "", "stage": ""}
    if uri != spec:
        entry["given"] = spec
    try:
        entry["digest"] = storage.content_digest(where)
        entry["stage"] = str(storage.read_manifest(where).meta.get("stage") or "")
    except (storage.UnpublishedOutputError, NotADirectoryError):  # a source: a plain file or folder
        pass
    except (FileNotFoundError, storage.StorageError, OSError) as exc:
        entry["missing"] = str(exc)  # a shipped benchmark name, a deleted temp file: recorded, not fatal
    return entry


def input_records(inputs: Iterable[str]) -> list[dict[str, Any]]:
    """`input_record` of each input, each location once however it was spelled."""
    first: dict[str, str] = {}
    for spec in inputs:
        first.setdefault(location(spec), spec)
    return [input_record(spec) for spec in first.values()]


def record(inputs: list[dict[str, Any]], config: StageConfig | None) -> dict[str, Any]:
    """`meta.lineage` of an output made from `inputs` (`input_records`) under `config`, with the presets that config
    was loaded from (its provenance; none for a config load_config did not build)."""
    lineage: dict[str, Any] = {"inputs": inputs, "config": config.model_dump(mode="json") if config is not None else None,
                               "code": code_version()}
    provenance = config.provenance if config is not None else None
    if provenance is not None:
        lineage["preset"] = provenance.to_json()
    ids = pipeline_ids()
    if ids:
        lineage["kfp"] = ids
    return lineage


class RunLineage:
    """What every publish of one run records: the inputs its stage declared and its config, handed over by the
    stage, never gathered from what else the process read. The inputs are digested once (at the first `record`, or on
    the thread a data stage starts when it opens its output) and shared by every later `record`: a training run's
    checkpoints and its model name the inputs it started from."""

    def __init__(self, inputs: Iterable[str], config: StageConfig | None) -> None:
        self.inputs = list(inputs)
        self.config = config

    @functools.cached_property
    def input_records(self) -> list[dict[str, Any]]:
        return input_records(self.inputs)

    def record(self, with_config: bool = True) -> dict[str, Any]:
        """`meta.lineage` of an output of this run (`with_config=False`: a checkpoint's, which records none)."""
        return record(self.input_records, self.config if with_config else None)


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
    shown: dict[str, Any] = {"preset": describe_preset(preset)} if preset else {}
    shown |= {key: meta[key] for key in KEY_META if key in meta and not isinstance(meta[key], (list, dict))}
    if isinstance(meta.get("scores"), dict):
        shown["scores"] = meta["scores"]
    for key in KEY_SETTINGS.get(stage, ()):
        if config and key in config and not isinstance(config[key], (list, dict)):
            shown[key] = config[key]
    return shown


@dataclass
class Recorded:
    """The lineage fields of one manifest, checked where they are read: what a reader may rely on (strings where
    strings are due), and `problems`: each malformed field, named with its manifest, left out."""

    stage: str
    inputs: list[dict[str, str]]  # {"uri", "digest", "stage", "given"}
    roles: dict[str, str]  # URI as the stage named it in `meta.inputs` -> its role ("samples", "model")
    config: dict[str, Any] | None
    preset: dict[str, Any] | None
    code: dict[str, str]
    kfp: dict[str, str]
    present: bool  # False for outputs published before lineage was recorded
    problems: list[str]

    def role(self, entry: Mapping[str, str]) -> str:
        """What the consumer called `entry` (one of `inputs`), else the stage that published it."""
        return self.roles.get(entry["given"]) or self.roles.get(entry["uri"]) or entry["stage"] or "source"


def _malformed(origin: str, field: str, expected: str, value: Any) -> str:
    shown = repr(value)
    return f"{origin}: {field} must be {expected}, not {type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}"


def _strings(value: Any, origin: str, field: str, problems: list[str]) -> dict[str, str]:
    """A mapping of scalars (`code`, `kfp`) as strings; {} and a problem when it is something else."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or any(isinstance(v, (Mapping, list)) for v in value.values()):
        problems.append(_malformed(origin, field, "a mapping of strings", value))
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _named_inputs(meta: Mapping[str, Any], origin: str, problems: list[str]) -> dict[str, str]:
    """URI -> the role its consumer gave it (`meta.inputs`: role -> a URI or a list of URIs)."""
    named = meta.get("inputs")
    if named is None:
        return {}
    if not isinstance(named, Mapping):
        problems.append(_malformed(origin, "meta.inputs", "a mapping of role to URIs", named))
        return {}
    roles: dict[str, str] = {}
    for role, uris in named.items():
        listed = uris if isinstance(uris, list) else [uris]
        if not all(isinstance(uri, str) for uri in listed):
            problems.append(_malformed(origin, f"meta.inputs.{role}", "a URI or a list of URIs", uris))
            continue
        for uri in listed:
            roles.setdefault(uri, str(role))
    return roles


def _input_entries(value: Any, roles: Mapping[str, str], origin: str, problems: list[str]) -> list[dict[str, str]]:
    """`meta.lineage.inputs`, each entry checked: {"uri", "digest", "stage", "given"}, strings."""
    if value is None:  # published before lineage was recorded: the roles' URIs, without digests
        return [{"uri": uri, "digest": "", "stage": "", "given": ""} for uri in roles]
    if not isinstance(value, list):
        problems.append(_malformed(origin, "meta.lineage.inputs", "a list", value))
        return []
    entries = []
    for i, entry in enumerate(value):
        field = f"meta.lineage.inputs[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(_malformed(origin, field, "a mapping", entry))
            continue
        uri = entry.get("uri")
        if not isinstance(uri, str) or not uri.strip():
            problems.append(_malformed(origin, f"{field}.uri", "a URI", uri) if "uri" in entry
                            else f"{origin}: {field} has no uri")
            continue
        clean = {"uri": uri}
        for key in ("digest", "stage", "given"):
            text = entry.get(key) or ""
            if not isinstance(text, str):
                problems.append(_malformed(origin, f"{field}.{key}", "a string", text))
                text = ""
            clean[key] = text
        entries.append(clean)
    return entries


def _mapping(value: Any, origin: str, field: str, problems: list[str]) -> dict[str, Any] | None:
    if value is None or isinstance(value, Mapping):
        return dict(value) if value is not None else None
    problems.append(_malformed(origin, field, "a mapping", value))
    return None


def recorded(meta: Mapping[str, Any], origin: str) -> Recorded:
    """The lineage fields of the manifest `origin` (`meta`: its meta), checked; a malformed field is left out and
    named in `problems` ("<manifest>: meta.lineage.inputs must be a list, not str 'x'")."""
    problems: list[str] = []
    stage = meta.get("stage") or ""
    if not isinstance(stage, str):
        problems.append(_malformed(origin, "meta.stage", "a string", stage))
        stage = ""
    roles = _named_inputs(meta, origin, problems)
    lineage = meta.get("lineage")
    present = lineage is not None
    if lineage is not None and not isinstance(lineage, Mapping):
        problems.append(_malformed(origin, "meta.lineage", "a mapping", lineage))
        lineage = {"inputs": []}
    lineage = lineage or {}
    preset = _mapping(lineage.get("preset"), origin, "meta.lineage.preset", problems)
    if preset is not None and not all(isinstance(preset.get(key) or [], list) for key in ("bases", "overrides")):
        problems.append(_malformed(origin, "meta.lineage.preset", "{preset, bases: [...], overrides: [...]}", preset))
        preset = None
    return Recorded(stage, _input_entries(lineage.get("inputs"), roles, origin, problems), roles,
                    _mapping(lineage.get("config"), origin, "meta.lineage.config", problems), preset,
                    _strings(lineage.get("code"), origin, "meta.lineage.code", problems),
                    _strings(lineage.get("kfp"), origin, "meta.lineage.kfp", problems), present, problems)


def step_of(uri: str) -> Step:
    """One output's step, read from its manifest; a location without one is a source. `uri` is shown as its
    `location`, and so are the inputs."""
    uri = location(uri)
    where = uri.partition("#")[0]
    try:
        manifest = storage.read_manifest(where)
    except (storage.UnpublishedOutputError, NotADirectoryError):  # a plain file: the manifest path lies inside it
        try:
            digest = storage.content_digest(where)
        except (FileNotFoundError, storage.StorageError, OSError) as exc:
            return Step(uri, "", "", note=f"source, unreadable now: {exc}")
        return Step(uri, "", digest, note="source (no manifest)")
    except (FileNotFoundError, storage.StorageError, OSError) as exc:
        return Step(uri, "", "", note=f"unreadable: {exc}")
    found = recorded(manifest.meta, str(storage.Uri.parse(where).join(storage.MANIFEST_NAME)))
    for problem in found.problems:
        log.warning("malformed lineage: %s", problem)
    edges = []
    for entry in found.inputs:
        input_uri = location(entry["uri"])
        current = ""
        if entry["stage"]:  # published inputs: their digest is a manifest read (a source's is taken by `trace`)
            try:
                current = storage.content_digest(input_uri.partition("#")[0])
            except (FileNotFoundError, storage.StorageError, OSError):
                current = ""
        edges.append(Edge(found.role(entry), input_uri, entry["digest"], current))
    if found.problems:
        note = "malformed lineage: " + "; ".join(found.problems)
    else:
        note = "" if found.present else "published before lineage was recorded"
    return Step(uri, found.stage, storage.content_digest(where), manifest.created,
                key_settings(found.stage, manifest.meta, found.config, found.preset), found.code, found.kfp, edges, note)


def trace(uris: str | Sequence[str], max_steps: int = 500) -> list[Step]:
    """Every step from `uris` back to the sources, each once (by `location`), nearest first (breadth-first)."""
    queue = [location(uri) for uri in ([uris] if isinstance(uris, str) else uris)]
    seen: dict[str, Step] = {}
    while queue and len(seen) < max_steps:
        uri = queue.pop(0)
        if uri in seen:
            continue
        step = seen[uri] = step_of(uri)
        queue += [edge.uri for edge in step.inputs if edge.uri not in seen]
    for step in seen.values():  # a source's digest now is its step's (hashed once): an edited source is flagged
        for edge in step.inputs:
            if not edge.current and edge.uri in seen:
                edge.current = seen[edge.uri].digest
    return list(seen.values())


def sources(steps: Sequence[Step]) -> list[Step]:
    """The steps no klear stage published: prompt files, a base model folder, benchmark files."""
    return [step for step in steps if not step.stage]


# --------------------------------------------------------------------------- rendering


def _short(digest: str) -> str:
    return digest[:12] if digest else "-"


def _plain(value: object) -> str:
    """A manifest's value on one line of plain text: line breaks, escape sequences and other controls written out
    (`\\n`, `\\x1b`), so no value forges a line of the chain or a fence's end, or drives a terminal."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(value))


def render_text(steps: Sequence[Step]) -> str:
    lines = []
    for step in steps:
        head = f"{_plain(step.stage or 'source')}  {_plain(step.uri)}  digest {_plain(_short(step.digest))}"
        if step.created:
            head += f"  created {_plain(step.created)}"
        lines.append(head)
        if step.settings:
            lines.append("    settings: " + _plain(json.dumps(step.settings, sort_keys=True, default=str)))
        if step.code:
            lines.append(f"    code: {_plain(step.code.get('package', ''))} {_plain(step.code.get('version', ''))} "
                         f"commit {_plain(step.code.get('commit') or 'unknown')}")
        if step.kfp:
            lines.append("    kfp: " + ", ".join(f"{_plain(k)} {_plain(v)}" for k, v in sorted(step.kfp.items())))
        if step.note:
            lines.append(f"    note: {_plain(step.note)}")
        for edge in step.inputs:
            flag = "  CHANGED since (now " + _plain(_short(edge.current)) + ")" if edge.changed else ""
            lines.append(f"    <- {_plain(edge.role)}: {_plain(edge.uri)} (digest {_plain(_short(edge.digest))}){flag}")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    # Mermaid labels are quoted strings: no quotes, no markup, no line breaks of their own.
    return "".join(ch if ch.isalnum() or ch in " ./:_-=@,+()" else " " for ch in text)[:120]


def render_mermaid(steps: Sequence[Step]) -> str:
    """A Mermaid flowchart, sources at the top, the traced output at the bottom. Every part of a label comes from a
    manifest (a stage name too): each is reduced to plain words (`_mermaid_text`)."""
    ids = {step.uri: f"n{i}" for i, step in enumerate(steps)}
    lines = ["flowchart TD"]
    for step in steps:
        # " · ", not <br/>: the reports that embed the graph carry no HTML (their tests refuse any "<")
        label = " · ".join(_mermaid_text(part) for part in (step.stage or "source", step.uri, _short(step.digest)))
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
