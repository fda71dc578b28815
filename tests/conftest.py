"""Shared fixtures: a real SeaweedFS S3 server on loopback for the whole session, fresh buckets per test;
the tiny model and the demo data, built once per session for the training stages."""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

# The tiny model's ops take microseconds: a second intra-op thread only adds synchronisation, and with the
# S3 server, reward workers and sandboxes sharing 2 cores it oversubscribes them (a decode step measured
# 340 ms with 2 threads under load, 6 ms with 1). Set before torch is imported; subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipelines import local_s3 as s3server

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


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "data"
    from klear.demo.generate import generate

    generate(str(out), math_count=120, code_count=8, seed=0, arithmetic_count=0, benchmark_count=0)
    return out


@pytest.fixture(scope="session")
def demo_files(demo: Path) -> list[str]:
    return [str(demo / name) for name in DEMO_FILES]
