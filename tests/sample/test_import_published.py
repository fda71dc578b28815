"""A run whose work area went after publishing first imports the published samples into a new one, so that its units
are not sampled again: one published part at a time, so the pod's disk holds a part, not the output. Runs the real
`klear sample` against a real SeaweedFS S3 server on loopback."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from klear.common import storage
from klear.sample.stage import iter_rows, run
from tests.sample.conftest import fast_config, write_prompts
from tests.sample.fake_server import FakeServer
from tests.sample.test_slices import N, _check_rows, _command


class PartsOnDisk:
    """The most published parts seen at once under `scratch` outside a sample run's staging folder (klear-sample-*,
    where its own output parts go), polled from a thread while the block runs."""

    def __init__(self, scratch: Path) -> None:
        self.scratch, self.most = scratch, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def count(self) -> int:
        return sum(name.endswith(".parquet") and "klear-sample-" not in parent
                   for parent, _, names in os.walk(self.scratch) for name in names)

    def _poll(self) -> None:
        while not self._stop.wait(0.001):
            self.most = max(self.most, self.count())

    def __enter__(self) -> PartsOnDisk:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_published_output_is_imported_one_part_at_a_time(s3_bucket: str, tmp_path: Path) -> None:
    """v1 (30 prompts, 3 rows per part: 30 parts) is published and its work area removed; v2 (40 prompts) imports
    v1's units before sampling: it holds one published part on its disk at a time, never the 30, samples only the
    10 new prompts, and publishes every unit once."""
    ids = [f"p{i}" for i in range(40)]
    prompts = tmp_path / "p.jsonl"
    out = f"{s3_bucket}/runs/r1/sample-teacher"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with FakeServer(keep_bodies=False) as server:
        write_prompts(prompts, [{"id": i, "prompt": f"question {i}"} for i in ids[:30]])
        run([str(prompts)], out, fast_config(f"n={N}", "rows_per_part=3", "keep_work=false"), endpoint=server.url,
            served_model="fake-teacher")
        published = [rel for rel in storage.read_manifest(out).files if rel.startswith("samples/")]
        assert len(published) == 30 and storage.list_files(f"{out}.work") == []
        first = server.requests

        write_prompts(prompts, [{"id": i, "prompt": f"question {i}"} for i in ids])
        with PartsOnDisk(scratch) as disk:
            done = subprocess.run(_command(str(prompts), out, server.url), env={**os.environ, "TMPDIR": str(scratch)},
                                  capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "importing the samples published at" in done.stderr, done.stderr[-2000:]
        assert disk.most == 1, disk.most  # one part at a time (fetching the output whole held all 30)
        assert disk.count() == 0  # and none is left behind
        assert server.requests - first == 10 * N  # v1's units came from the import, not the server
    _check_rows(list(iter_rows(out)), ids)
