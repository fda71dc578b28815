"""Multi-node SFT through the launcher, with the job's two nodes as local processes on loopback
(tests.local_cluster): a launcher SIGKILLed mid-training and retried re-attaches to the running job, which trains
on undisturbed; a log stream cut mid-run reconnects without restarting training. Both runs end with the same
model as far as the loss tells (same steps, same final loss)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from klear.common import storage
from klear.training import checkpoints
from klear.training.trainjob import job_name, job_state
from tests.local_cluster import LocalJobs

pytestmark = pytest.mark.slow

SETS = ["num_epochs=6", "save_steps=4"]  # long enough that a retried launcher finds the job still training


def _launcher(root: Path, run_id: str, model: str, data: list[str], output: str, logs: Path,
              *extra: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """One launching pod of `run_id`'s SFT task: (process, its stdout, its stderr)."""
    out, err = logs / f"{run_id}-{time.monotonic_ns()}.out", logs / f"{run_id}-{time.monotonic_ns()}.err"
    argv = [sys.executable, "-m", "tests.local_cluster", str(root), "--run-id", run_id, "--model", model,
            "--data", *data, "--output", output, *[f"--set={value}" for value in SETS], *extra]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        return subprocess.Popen(argv, stdout=stdout, stderr=stderr), out, err


def _finished(launched: tuple[subprocess.Popen[bytes], Path, Path], root: Path,
              timeout_s: float = 420) -> tuple[str, str]:
    process, out, err = launched
    if process.wait(timeout=timeout_s) != 0:
        nodes = "\n".join(f"--- {log}\n{log.read_text()[-3000:]}" for log in sorted(root.glob("*/node-*.log")))
        raise AssertionError(f"{err.read_text()[-3000:]}\n{nodes}")
    return out.read_text(), err.read_text()


def test_a_retried_launcher_re_attaches_and_a_cut_log_stream_reconnects(tiny_model: str, demo_files: list[str],
                                                                          tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    jobs = LocalJobs(root)
    try:
        # Uninterrupted, its log stream cut once after 20 lines: every master line printed once, in order.
        first_output = str(tmp_path / "sft-1")
        printed, errors = _finished(_launcher(root, "run-1", tiny_model, demo_files, first_output, tmp_path,
                                              "--cut-log-after", "20"), root)
        master_log = (root / job_name("run-1", "sft") / "node-0.log").read_text()
        assert "the log stream of PyTorchJob" in errors and "reconnecting" in errors
        assert printed.splitlines() == master_log.splitlines() and master_log.count("INFO klear.sft: data:") == 1
        uninterrupted = json.loads(storage.read_bytes(f"{first_output}/report.json"))

        # The launching pod SIGKILLed after the first checkpoint; its retry (same run, same task) re-attaches.
        output = str(tmp_path / "sft-2")
        name = job_name("run-2", "sft")
        launcher = _launcher(root, "run-2", tiny_model, demo_files, output, tmp_path)
        deadline = time.monotonic() + 300
        while not checkpoints.published_steps(output):
            assert launcher[0].poll() is None, launcher[2].read_text()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint published in time"
            time.sleep(0.1)
        launcher[0].kill()
        launcher[0].wait()
        assert job_state((jobs.get(name) or {}).get("status"))[0] == "running"  # the job outlives its launcher
        printed, errors = _finished(_launcher(root, "run-2", tiny_model, demo_files, output, tmp_path), root)
        assert f"launcher: attach {name}" in errors and "created PyTorchJob" not in errors
        assert "INFO klear.sft: published the model" in printed  # it followed the log to the job's end
        master_log = (root / name / "node-0.log").read_text()
        assert master_log.count("INFO klear.sft: data:") == 1 and "resuming from checkpoint" not in master_log
        assert sorted(path.parent.name for path in root.glob("*/created")) == sorted([job_name("run-1", "sft"), name])

        report = json.loads(storage.read_bytes(f"{output}/report.json"))
        assert report["training"]["resumed_from_step"] == 0  # trained once, start to end
        assert report["training"]["global_step"] == uninterrupted["training"]["global_step"]
        assert report["metrics"]["final_loss"] == pytest.approx(uninterrupted["metrics"]["final_loss"], abs=1e-3)
    finally:
        jobs.delete_all()
