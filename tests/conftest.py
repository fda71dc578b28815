"""Shared fixtures: a real SeaweedFS S3 server on loopback for the whole session, fresh buckets per test;
the tiny model and the demo data, built once per session for the training stages. The session fails when a
process it started is still running at its end."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The tiny model's ops take microseconds: a second intra-op thread only adds synchronisation, and with the
# S3 server, reward workers and sandboxes sharing 2 cores it oversubscribes them (a decode step measured
# 340 ms with 2 threads under load, 6 ms with 1). Set before torch is imported; subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipelines import local_s3 as s3server
from tests.processes import alive, served_on_loopback

# Every process this session starts inherits the marker (a worker keeps it: it is no secret); one still running at
# the end is a leak, such as a worker stuck in an item that outlived its killed stage. Always a new one: a pytest
# started by a test checks its own processes.
SESSION_ENV = "KLEAR_TEST_SESSION"
os.environ[SESSION_ENV] = uuid.uuid4().hex
LEFTOVER_GRACE_S = 10.0  # for processes still exiting at the end (a server's workers after its leader stopped)

DEMO_FILES = ("math.jsonl", "code.jsonl")

_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.SeaweedS3]:
    server = s3server.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def s3_env(s3_server: s3server.SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Points the AWS variables at the test server (with the right credentials) for one test."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("KLEAR_S3_MAX_ATTEMPTS", "2")
    return s3_server.env


@pytest.fixture()
def s3_bucket(s3_env: dict[str, str]) -> Iterator[str]:
    """A new, empty bucket; yields its s3:// URI prefix, then deletes it with its objects.

    Deleting matters: SeaweedFS gives every bucket its own volumes, and a session that kept ~50 buckets ran out
    of them ("No writable volumes and no free volumes left"), failing whichever tests came last.
    """
    import boto3

    name = f"klear-test-{os.getpid()}-{next(_bucket_numbers)}"
    endpoint = s3_env["AWS_ENDPOINT_URL"]
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    yield f"s3://{name}"
    bucket = boto3.resource("s3", endpoint_url=endpoint, region_name="us-east-1").Bucket(name)
    bucket.objects.all().delete()
    bucket.delete()


def free_port() -> int:
    """A loopback TCP port free right now, so tests that start servers or process groups can run side by side."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("tiny-model") / "model"
    from klear.demo.tiny_model import build

    build(str(out))
    return str(out)


MLFLOW = Path(__file__).resolve().parent.parent / ".venv-mlflow" / "bin" / "mlflow"


def mlflow_server_binary() -> Path:
    """The MLflow server of `make install-mlflow`; missing: a skip with the reason, a failure in CI."""
    if not MLFLOW.is_file():
        message = f"{MLFLOW} missing: `make install-mlflow` builds the MLflow server's own environment"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return MLFLOW


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server on loopback (SQLite store, proxied artifacts), one per session: each test
    uses experiments and registered models of its own names."""
    binary = mlflow_server_binary()
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [str(binary), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")]
    with served_on_loopback(command, None, root / "server.log", port, "mlflow server", 120, api_path="") as url:
        yield url


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "data"
    from klear.demo.generate import generate

    generate(str(out), math_count=120, code_count=8, seed=0, arithmetic_count=0, benchmark_count=0)
    return out


@pytest.fixture(scope="session")
def demo_files(demo: Path) -> list[str]:
    return [str(demo / name) for name in DEMO_FILES]


# --- the order files run in ----------------------------------------------------------------------------------
LONGEST_FILE = "tests/pipelines/test_demo.py"  # the whole recipe end to end: about a third of the suite's time


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The demo's file first, then the files with end-to-end (slow) tests, then the rest, each file's tests in their
    own order. `make test` runs the files on two workers (pytest-xdist, --dist loadfile --no-loadscope-reorder), each
    taking the next file when it is free: long files started last would leave one worker idle at the end."""
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        file = item.nodeid.split("::")[0]
        return 0 if file == LONGEST_FILE else 1 if file in slow_files else 2

    items.sort(key=rank)  # stable: the order within a rank is the collection's


# --- nothing left running ---------------------------------------------------------------------------------
def _left_running() -> dict[int, str]:
    """Live processes, this one aside, whose environment carries this session's marker: pid -> command line."""
    marker = f"{SESSION_ENV}={os.environ[SESSION_ENV]}".encode()
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        try:
            if pid != os.getpid() and marker in environ.read_bytes().split(b"\0") and alive(pid):
                found[pid] = (environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended while we looked, or another user's
    return found


_leftovers: dict[int, str] = {}


@pytest.hookimpl(trylast=True)  # after pytest's own, which stops the session's fixtures (the S3 server)
def pytest_report_header(config: pytest.Config) -> str:
    """The free disk under the tests' files, in every log: the S3 server and the training stages write there."""
    folder = tempfile.gettempdir()
    usage = shutil.disk_usage(folder)
    return f"free disk under {folder}: {usage.free / 2**30:.1f} of {usage.total / 2**30:.0f} GiB"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the session when a process it started outlived it; kill those (a stuck one would burn a core for ever)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None:  # its service process lives as long as the process that used it: this one
        wandb.teardown()
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := _left_running()) and time.monotonic() < deadline:
        time.sleep(0.2)
    _leftovers.update(left)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if left and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _leftovers:
        terminalreporter.write_sep("=", f"{len(_leftovers)} process(es) of this session left running (killed now)",
                                   red=True)
        for pid, cmdline in sorted(_leftovers.items()):
            terminalreporter.write_line(f"pid {pid}: {cmdline[:300]}")
