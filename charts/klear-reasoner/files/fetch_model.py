"""Copy a model folder from S3 to a local directory before the teacher's vLLM server starts.

    python fetch_model.py s3://bucket/prefix/ /model

Run by the teacher's init container in the CPU image, with the S3 Secret as environment variables. Resumable: a
file already there with the object's size is kept, so a restarted pod copies only what is missing; each file is
written under a temporary name and renamed when complete, so a killed copy never leaves a truncated file behind.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig


def split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise SystemExit(f"not an s3:// URI: {uri}")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    return bucket, (prefix.rstrip("/") + "/") if prefix else ""


def main(argv: list[str]) -> int:
    uri, target = argv
    bucket, prefix = split(uri)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    client = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"), region_name=region)
    objects = [(o["Key"], o["Size"]) for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix) for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    if not objects:
        raise SystemExit(f"nothing under {uri}")
    config = TransferConfig(multipart_chunksize=64 * 2**20, max_concurrency=8)

    def fetch(item: tuple[str, int]) -> str:
        key, size = item
        local = Path(target) / key[len(prefix):]
        if local.is_file() and local.stat().st_size == size:
            return f"kept {local}"
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(f".{local.name}.partial")
        client.download_file(bucket, key, str(partial), Config=config)
        os.replace(partial, local)
        return f"fetched {local} ({size} bytes)"

    with ThreadPoolExecutor(max_workers=8) as pool:
        for line in pool.map(fetch, objects):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
