"""Slices of a run over many pods: which slice an id falls in, the `--slice I/N` form, and each slice's folder.

Sampling and judging fan out alike: slice I of N takes the rows whose id hashes into I, every slice of a run
writes into one work area, holds a lease on its own folder there (one pod per slice), and publishes nothing;
a merge publishes once every slice's part is there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator

from klear.common import storage


class MergeIncompleteError(RuntimeError):
    """A slice of the run has left no part, or items no slice has done: the merge publishes nothing."""


def slice_of(item_id: str, count: int) -> int:
    """The slice (0 .. count-1) an id belongs to: from the id alone, so it is the same on every pod and run;
    units keep their keys whatever `count` is, so a rerun with another count reuses every unit done."""
    if count < 1:
        raise ValueError(f"slice count must be >= 1, got {count}")
    return int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "big") % count


def add_slice_arguments(parser: argparse.ArgumentParser, verb: str, hashed: str, merge_help: str) -> None:
    """`--slice I/N` and `--merge` of a command that fans out (`verb` the slices' work, `hashed` the id they
    split on), as args.slice_spec and args.merge."""
    parser.add_argument("--slice", metavar="I/N", dest="slice_spec",
                        help=f"{verb} only slice I of N (0 <= I < N, by a hash of the {hashed} id) into the work area, "
                             "publishing nothing; one pod per slice")
    parser.add_argument("--merge", action="store_true", help=merge_help)


def parse_slice(text: str) -> tuple[int, int]:
    """`I/N` (0 <= I < N) as (I, N); an error naming the form otherwise."""
    index, sep, count = text.partition("/")
    try:
        parsed = (int(index), int(count)) if sep else None
    except ValueError:
        parsed = None
    if parsed is None or not 0 <= parsed[0] < parsed[1]:
        raise ValueError(f"--slice {text!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return parsed


def slice_folder(work: storage.Uri, index: int, count: int) -> storage.Uri:
    """`<work>/slices/<I>-of-<N>`: a slice's lease and what it leaves for the merge."""
    return work.join("slices", f"{index}-of-{count}")


@contextlib.contextmanager
def claim_slice(work: storage.Uri, index: int, count: int, output: object, doing: str) -> Iterator[storage.OutputLease]:
    """Hold slice I of N's folder for this pod: a second pod on the same slice fails at once, naming the slice
    (`doing`: what the other pod is doing, e.g. "sampled"); other slices run beside it."""
    with contextlib.ExitStack() as stack:
        try:
            lease = stack.enter_context(storage.claim_output(slice_folder(work, index, count)))
        except storage.OutputBusyError as exc:
            raise storage.OutputBusyError(f"slice {index}/{count} of {output} is being {doing} by another pod: "
                                          f"{exc}") from None
        yield lease


def work_beside(output: storage.Uri) -> storage.Uri:
    """The default work area of an output: `<output>.work`, beside it (never inside what gets published)."""
    path = output.path.rstrip("/")
    if not path or path == "/":
        raise ValueError(f"--output {output} must be a folder, not a bucket or filesystem root")
    return dataclasses.replace(output, path=f"{path}.work")
