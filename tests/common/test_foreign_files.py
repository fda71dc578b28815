"""A lease file is never a licence to delete, and a work area is its command's alone: through the real commands,
locally and on SeaweedFS, someone else's files beside klear's traces are refused and never deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from klear.common import storage
from tests.commands import klear
from tests.judge.samples import boxed, math_record, publish_samples, sample_row

WHERE = ["local", "s3"]


def _root(where: str, s3_bucket: str, tmp_path: Path, name: str) -> storage.Uri:
    return storage.Uri.parse(f"{s3_bucket}/{name}" if where == "s3" else str(tmp_path / name))


def _samples(uri: str) -> str:
    return publish_samples([sample_row(f"m{i}", k, boxed(str(i)), math_record(f"m{i}", str(i)))
                            for i in range(6) for k in range(2)], uri)


@pytest.mark.parametrize("where", WHERE)
def test_a_judge_slice_leaves_no_lease_and_no_licence_to_delete(where: str, s3_bucket: str, tmp_path: Path) -> None:
    proj = _root(where, s3_bucket, tmp_path, "proj")
    storage.write_bytes(proj.join("data", "prompts.jsonl"), b'{"id": "mine"}\n')
    storage.write_bytes(proj.join("notes.txt"), b"notes")
    samples = _samples(str(_root(where, s3_bucket, tmp_path, "s8")))
    done = klear("judge", "--samples", samples, "--output", str(proj.join("judged")), "--slice", "0/2",
                 "--config", "tiny")
    assert done.returncode == 0, done.stderr
    # A slice that ended normally has released (deleted) its lease.
    assert not [n for n in storage.list_files(proj) if n.endswith(storage.LEASE_NAME)]
    # As a SIGKILLed slice leaves it: a lease deep inside the folder.
    storage.write_bytes(proj.join("judged.work", "slices", "1-of-2", storage.LEASE_NAME), b'{"run_id": "dead"}')
    for command in (("demo-data",), ("curate", "--input", samples)):
        refused = klear(*command, "--output", str(proj), "--config", "tiny") if command[0] == "curate" else \
            klear(*command, "--output", str(proj))
        assert refused.returncode == 2, refused.stderr
        assert "files that are not this stage's (data/prompts.jsonl, " in refused.stderr
    assert storage.read_bytes(proj.join("data", "prompts.jsonl")) == b'{"id": "mine"}\n'
    assert storage.read_bytes(proj.join("notes.txt")) == b"notes"


@pytest.mark.parametrize("where", WHERE)
def test_another_commands_work_area_is_refused_and_never_emptied(where: str, s3_bucket: str, tmp_path: Path) -> None:
    work = _root(where, s3_bucket, tmp_path, "userw")
    storage.write_bytes(work.join("important.txt"), b"keep")
    storage.write_bytes(work.join("slices", "keep.txt"), b"keep")
    storage.write_bytes(work.join("slices", "0-of-2", "failed.parquet"), b"a sample slice's")
    samples = _samples(str(_root(where, s3_bucket, tmp_path, "s8")))
    out = str(_root(where, s3_bucket, tmp_path, "j10"))
    for step in (("--slice", "0/2"), ("--slice", "1/2"), ("--merge",)):
        refused = klear("judge", "--samples", samples, "--output", out, "--work", str(work), *step, "--config", "tiny")
        assert refused.returncode == 2, refused.stderr
        assert f"--work {work} holds 3 files that are not a `klear judge` work area's" in refused.stderr
    assert sorted(storage.list_files(work)) == ["important.txt", "slices/0-of-2/failed.parquet", "slices/keep.txt"]


def test_another_slices_write_probe_is_not_foreign(tmp_path: Path) -> None:
    """Slices that start together: one's write probe (deleted at once) may be listed by the other's check."""
    samples = _samples(str(tmp_path / "s8"))
    work = tmp_path / "shared.work"
    storage.write_bytes(storage.Uri.parse(str(work)).join(f"{storage.PROBE_PREFIX}of-another-slice"), b"")
    done = klear("judge", "--samples", samples, "--output", str(tmp_path / "judged"), "--work", str(work),
                 "--slice", "0/2", "--config", "tiny")
    assert done.returncode == 0, done.stderr


def test_a_merge_deletes_only_what_its_slices_wrote(tmp_path: Path) -> None:
    samples = _samples(str(tmp_path / "s8"))
    out, work = tmp_path / "judged", tmp_path / "shared.work"
    for step in (("--slice", "0/2"), ("--slice", "1/2")):
        done = klear("judge", "--samples", samples, "--output", str(out), "--work", str(work), *step, "--config", "tiny")
        assert done.returncode == 0, done.stderr
    # Another slice count's part and another settings key's scores: judge files, but not this merge's.
    other = {"slices/0-of-3/part.json": b"{}", "_scores/otherkey/chunk-x-000000.parquet": b"PAR1"}
    for rel, body in other.items():
        storage.write_bytes(str(work / rel), body)
    merged = klear("judge", "--samples", samples, "--output", str(out), "--work", str(work), "--merge", "--config", "tiny")
    assert merged.returncode == 0, merged.stderr
    assert sorted(storage.list_files(str(work))) == sorted(other)
