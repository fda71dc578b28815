"""The skeleton every data stage (curate, sample, judge, sft-data, rl-filter, evaluate) publishes through.

A stage module builds one `DataStage`: its name, config class and report renderer. Its `run` is then the
stage's own logic plus its report, on this frame:

    output = STAGE.check(output, {"samples": samples, ...}, config=config)  # every location it writes, before any work
    ...                                                       # work that needs no output (loading, indexing)
    with output.open() as out:                                # the output's lease and a staging folder
        ...                                                   # the stage writes its files into out.staging
        out.publish(report, {"kept": kept})                   # report.json, report.md, the manifest last

The manifest's meta names the stage (`stage`: only the same stage may replace the output, see storage) and
its inputs (`inputs`: role -> the URIs as given), beside the stage's own keys; its lineage (klear.common.lineage)
records those inputs and the config handed to `check`, with the presets and overrides that config was loaded from.
A body that raises publishes nothing: the output keeps its earlier manifest and files, the staging folder goes, the
lease is released. A stage whose output may not fit on local disk uploads each finished file at once with
`out.ship(path)` (a merge's Parquet parts); once it has, a body that raises leaves the output unpublished (no
manifest) for its next run.

`DataStage.add_main` is the command's other half: the config options and a main that loads the config, runs
the stage and prints its headline as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klear.common import lineage, storage
from klear.common.cli import add_config_arguments
from klear.common.config import StageConfig, load_config

Report = dict[str, Any]
# role (what the stage calls the input: "samples", "benchmark") -> one URI, several, or none
Inputs = Mapping[str, "str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None"]
RESERVED_META = ("stage", "inputs", "lineage")


def input_lists(inputs: Inputs) -> dict[str, list[str]]:
    """`inputs` as role -> list of URIs, as given; roles without a URI are left out."""
    lists = {}
    for role, value in inputs.items():
        uris = [value] if isinstance(value, (str, os.PathLike)) else list(value or ())
        if any(uris):
            lists[role] = [str(uri) for uri in uris if uri]
    return lists


@dataclass(frozen=True)
class DataStage:
    name: str  # the `klear` subcommand; `meta.stage` of its outputs; the staging folder's prefix
    config_class: type
    render_markdown: Callable[[Report], str] | None = None  # report.md; None: the output has no report.md

    def check(self, output: str, inputs: Inputs, work: str | None = None, others: Sequence[storage.Write] = (),
              role: str = "output", *, config: StageConfig | None) -> StageOutput:
        """Refuse, in seconds and before any work, an output (and work area, and `others`) that cannot be written
        or would replace an input, a file `config` was read from, each other, or another stage's output
        (storage.check_writes). `role`: how messages name the output (a command that also writes `--work` says
        `--output`). `config`: the run's config, which the output's lineage records (None: a stage without one)."""
        lists = input_lists(inputs)
        writes = [storage.Write(role, output, self.name),
                  *([storage.Write("--work", work, self.name, published=False)] if work else []), *others]
        provenance = config.provenance if config is not None else None
        checked = storage.check_writes(writes, [uri for uris in lists.values() for uri in uris],
                                       provenance.files if provenance is not None else ())
        return StageOutput(self, checked[0], lists, checked[1] if work else None, config)

    def add_main(self, parser: argparse.ArgumentParser, call: Callable[[argparse.Namespace, Any], Report],
                 headline: Callable[[Report], Any], default_preset: str = "paper") -> None:
        """The config options (--config, --set) and the command's main: load the config, `call(args, config)`,
        print `headline(report)` as one JSON line."""
        add_config_arguments(parser, default_preset, self.config_class)

        def main(args: argparse.Namespace) -> int:
            report = call(args, load_config(self.config_class, args.config, args.overrides))
            print(json.dumps(headline(report)))
            return 0

        parser.set_defaults(func=main)


@dataclass(frozen=True)
class StageOutput:
    """A checked output of one stage run: where it goes, what the run reads, its work area if any, its config."""

    stage: DataStage
    uri: storage.Uri
    inputs: dict[str, list[str]]
    work: storage.Uri | None = None
    config: StageConfig | None = None

    @contextlib.contextmanager
    def open(self) -> Iterator[Publication]:
        """Hold the output (a second run fails now, with OutputBusyError) and a staging folder until the block
        ends; nothing is published unless the block calls `publish`. The inputs are digested for the lineage on a
        thread from now on, beside the stage's work (hashing a large source file releases the GIL)."""
        made_from = lineage.RunLineage([uri for uris in self.inputs.values() for uri in uris], self.config)
        digesting = threading.Thread(target=lambda: made_from.input_records, name="digest-inputs", daemon=True)
        with storage.claim_output(self.uri, task=f"{self.stage.name} publishing") as lease, \
                tempfile.TemporaryDirectory(prefix=f"klear-{self.stage.name}-") as staging:
            digesting.start()
            yield Publication(self, Path(staging), lease, storage.StreamedFiles(lease, self.stage.name), made_from,
                              digesting)


@dataclass(frozen=True)
class Publication:
    output: StageOutput
    staging: Path  # the output's files go here; publish uploads them all (those `ship` has not uploaded already)
    lease: storage.OutputLease
    streamed: storage.StreamedFiles  # the files `ship` uploaded, with their manifest entries
    made_from: lineage.RunLineage  # the checked inputs and config
    digesting: threading.Thread  # digests made_from's inputs (its input_records); publish waits for it

    def ship(self, path: Path) -> None:
        """Upload a finished file of the staging folder (a Parquet part of a large output) to the output now and
        delete it here, so the output is never staged whole; `publish` lists it. The first one begins the publish:
        the earlier output's manifest goes, and a body that raises from then on leaves an output that readers
        refuse and the next run of the stage replaces (storage.StreamedFiles)."""
        self.streamed.upload(path, path.relative_to(self.staging).as_posix())

    def write_report(self, report: Report) -> None:
        """report.json (and report.md through the stage's renderer) into the staging folder."""
        (self.staging / "report.json").write_text(json.dumps(report, indent=2, default=str))
        render = self.output.stage.render_markdown
        if render is not None:
            (self.staging / "report.md").write_text(render(report))

    def publish(self, report: Report, meta: Mapping[str, Any] | None = None) -> storage.Manifest:
        """Write the report, then publish the staging folder, manifest last, its meta naming the stage and inputs,
        its lineage those inputs and the checked config (StageOutput: what `check` was handed, nothing else)."""
        taken = sorted(set(RESERVED_META) & set(meta or {}))
        if taken:
            raise ValueError(f"manifest meta keys {taken} are the skeleton's (stage name, inputs, lineage)")
        self.write_report(report)
        checked = self.output
        self.digesting.join()  # had it failed, record() digests the inputs again here and raises what it raises
        return storage.publish_dir(self.staging, checked.uri,
                                   meta={"stage": checked.stage.name, **(meta or {}), "inputs": checked.inputs,
                                         "lineage": self.made_from.record()},
                                   streamed=self.streamed)
