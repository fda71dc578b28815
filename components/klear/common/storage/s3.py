"""S3 plumbing: one client per set of credentials, the transfer settings, and botocore's errors turned into errors
that name the URI, the endpoint and the cause.

S3 settings come from the standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, AWS_REGION). Transfers go through boto3's transfer manager (multipart,
parallel parts); transient failures are retried a bounded number of times by botocore."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

from klear.common.storage.uri import CHUNK, StorageError, Uri


def _max_attempts() -> int:
    return int(os.environ.get("KLEAR_S3_MAX_ATTEMPTS", "4"))


@functools.cache
def _client_for(endpoint: str | None, key_id: str | None, secret: str | None, region: str | None, attempts: int) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": attempts, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"},
        max_pool_connections=32,
    )
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint, region_name=region or "us-east-1", config=config)


def s3_client() -> Any:
    # Keyed on the environment, so a test (or a stage) that changes credentials gets a new client.
    return _client_for(
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        os.environ.get("AWS_ACCESS_KEY_ID"),
        os.environ.get("AWS_SECRET_ACCESS_KEY"),
        os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        _max_attempts(),
    )


def s3_endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS default endpoint"


def transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=CHUNK, multipart_chunksize=CHUNK, max_concurrency=8)


@contextlib.contextmanager
def s3_errors(uri: Uri, action: str) -> Iterator[None]:
    """Turn botocore's exceptions into errors that name the URI, the endpoint and the cause."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        yield
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("404", "NoSuchKey", "NotFound"):
            raise FileNotFoundError(f"{action} {uri}: no such object (endpoint {s3_endpoint()})") from None
        if code == "NoSuchBucket":
            raise StorageError(f"{action} {uri}: bucket {uri.bucket!r} does not exist (endpoint {s3_endpoint()})") from None
        if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            raise StorageError(
                f"{action} {uri}: access denied by {s3_endpoint()} ({code or status}); check AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY"
            ) from None
        raise StorageError(f"{action} {uri}: S3 error {code or status} from {s3_endpoint()}: {exc}") from None
    except S3UploadFailedError as exc:
        raise StorageError(f"{action} {uri}: upload to {s3_endpoint()} failed: {exc}") from None
    except NoCredentialsError:
        raise StorageError(f"{action} {uri}: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)") from None
    except BotoCoreError as exc:
        raise StorageError(
            f"{action} {uri}: cannot reach S3 endpoint {s3_endpoint()} after {_max_attempts()} attempts: {exc}"
        ) from None
