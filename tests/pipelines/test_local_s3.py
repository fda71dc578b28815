"""The loopback SeaweedFS launcher that `make demo` and the tests use."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import local_s3


def test_starts_from_a_relative_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo` passes `runs/demo`: the server runs inside its folder and must still find its config."""
    import boto3

    monkeypatch.chdir(tmp_path)
    server = local_s3.start(Path("runs/demo/seaweedfs"))
    try:
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id=local_s3.ACCESS_KEY, aws_secret_access_key=local_s3.SECRET_KEY)
        client.create_bucket(Bucket="relative")
        assert [b["Name"] for b in client.list_buckets()["Buckets"]] == ["relative"]
    finally:
        server.stop()
    assert (tmp_path / "runs/demo/seaweedfs/s3.json").exists()
