"""Shared integration fixtures: a real S3-compatible server (moto) on 127.0.0.1."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

S3_BUCKET = "gpupipe-test"
_ACCESS_KEY = "gpupipe-test-key"
_SECRET_KEY = "gpupipe-test-secret"
_REGION = "us-east-1"


@pytest.fixture(scope="session")
def _moto_endpoint() -> Iterator[str]:
    """Start moto's S3-compatible server once per session; yield its ``http://host:port``."""
    from moto.server import ThreadedMotoServer

    # Werkzeug logs every request at INFO; keep test output readable.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_server(_moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A clean S3 server holding one empty bucket (`s3_bucket`); yields its endpoint URL.

    Points s3:// URIs (``AWS_ENDPOINT_URL_S3``) and minio:// URIs (``MINIO_ENDPOINT``) at the
    server and sets test credentials in the environment, so subprocesses (torchrun workers)
    inherit them. Server state is reset before each test.
    """
    import boto3

    urllib.request.urlopen(
        urllib.request.Request(f"{_moto_endpoint}/moto-api/reset", method="POST"), timeout=10
    ).close()
    for name in ("AWS_ENDPOINT_URL", "S3_ENDPOINT", "AWS_PROFILE", "AWS_DEFAULT_REGION",
                 "AWS_SESSION_TOKEN", "MINIO_ACCESS_KEY", "MINIO_SECRET_KEY"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", _ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", _SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", _REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", _moto_endpoint)
    monkeypatch.setenv("MINIO_ENDPOINT", _moto_endpoint)
    # No instance-metadata lookups from the AWS SDKs on a machine that is not EC2.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    client = boto3.client(
        "s3",
        endpoint_url=_moto_endpoint,
        aws_access_key_id=_ACCESS_KEY,
        aws_secret_access_key=_SECRET_KEY,
        region_name=_REGION,
    )
    client.create_bucket(Bucket=S3_BUCKET)
    yield _moto_endpoint


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    """The name of the empty bucket that `s3_server` created."""
    return S3_BUCKET


@pytest.fixture
def s3_client(s3_server: str) -> Any:
    """A boto3 S3 client for `s3_server`, to inspect raw keys behind storage's back."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id=_ACCESS_KEY,
        aws_secret_access_key=_SECRET_KEY,
        region_name=_REGION,
    )
