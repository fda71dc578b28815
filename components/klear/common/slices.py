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
import re
from collections.abc import Callable, Iterator

from klear.common import storage

MAX_SLICES = 100_000  # slices (pods) of one run: far more than any cluster runs at once


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


def _is_number(text: str) -> bool:
    """ASCII digits only: int() would also take "1_0", " 1" and other scripts' digits ("١")."""
    return text.isascii() and text.isdigit()


def parse_slice(text: str) -> tuple[int, int]:
    """`I/N` (ASCII digits, 0 <= I < N <= MAX_SLICES) as (I, N); an error naming the flag and the value otherwise."""
    index, sep, count = text.partition("/")
    quoted = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"
    if not (sep and _is_number(index) and _is_number(count)):
        raise ValueError(f"--slice {quoted}: expected I/N in digits with 0 <= I < N, e.g. 0/4")
    index, count = index.lstrip("0") or "0", count.lstrip("0") or "0"
    width = len(str(MAX_SLICES))  # more digits: too large (and int() refuses thousands of digits)
    if len(count) > width or int(count) > MAX_SLICES:
        raise ValueError(f"--slice {quoted}: expected I/N with N at most {MAX_SLICES} slices")
    if len(index) > width or not int(index) < int(count):
        raise ValueError(f"--slice {quoted}: expected I/N with 0 <= I < N, e.g. 0/4")
    return int(index), int(count)


# Hidden temp files of an interrupted local write (storage.write_bytes writes `.name.XXXX` beside `name`).
TEMP_FILE = r"(.+/)?\.[^/]+"


def work_file_pattern(*own: str) -> re.Pattern[str]:
    """What a command's work area may hold: its own files (regexes of relative paths) and interrupted writes."""
    return re.compile("|".join(f"(?:{p})" for p in (*own, TEMP_FILE)))


def refuse_foreign_work(work: storage.Uri, is_own: Callable[[str], bool], command: str) -> None:
    """One rule for every work area: refuse, before any work, a `--work` location holding files that are not this
    command's work files (a data folder, or another command's work area), since a finished run deletes its own
    files there and a merge reads them."""
    # Another slice's write probe (check_output's, deleted at once) may be there while slices start together.
    foreign = [rel for rel in storage.list_files(work)
               if not is_own(rel) and not rel.rsplit("/", 1)[-1].startswith(storage.PROBE_PREFIX)]
    if foreign:
        raise storage.InvalidOutputError(
            f"--work {work} holds {len(foreign)} files that are not a `klear {command}` work area's "
            f"({storage.some_names(foreign)}): choose an empty location, or the work area of earlier `klear "
            f"{command}` runs for the same output")


def slice_folder(work: storage.Uri, index: int, count: int) -> storage.Uri:
    """`<work>/slices/<I>-of-<N>`: a slice's lease and what it leaves for the merge."""
    return work.join("slices", f"{index}-of-{count}")


@contextlib.contextmanager
def claim_slice(work: storage.Uri, index: int, count: int, output: object, doing: str) -> Iterator[storage.OutputLease]:
    """Hold slice I of N's folder for this pod: a second pod on the same slice fails at once, naming the slice
    (`doing`: what the other pod is doing, e.g. "sampled"); other slices run beside it."""
    with contextlib.ExitStack() as stack:
        try:
            lease = stack.enter_context(storage.claim_output(slice_folder(work, index, count),
                                                             task=f"slice {index}/{count}, {doing}"))
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
