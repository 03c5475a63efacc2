"""Who ``gpupipe`` is to a KFP cluster: the bearer token as KFP users have it (flag, token file,
in-cluster account), and where that token may be sent."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from trainer.base.errors import InputError

TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
"""Env var naming a token file (what ``kfp.Client`` reads too)."""
IN_CLUSTER_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"
"""The projected service-account token KFP mounts into pods (audience pipelines.kubeflow.org)."""


@dataclass(frozen=True, slots=True)
class Auth:
    """Where the bearer token comes from; the token itself never appears in ``repr``."""

    source: str
    token: str | None = None
    path: str | None = None

    def __repr__(self) -> str:
        return f"Auth(source={self.source!r}, path={self.path!r})"

    def read(self) -> str | None:
        """The current token: a file is re-read on every call (projected tokens rotate)."""
        if self.path is not None:
            return Path(self.path).read_text().strip() or None
        return self.token


def resolve_auth(token: str | None, env: dict[str, str] | None = None) -> Auth:
    """Pick the credentials as KFP users have them, first match wins.

    ``--token``, then the file named by ``KF_PIPELINES_SA_TOKEN_PATH``, then the in-cluster
    token KFP mounts into pipeline pods, else no token (a port-forward to a single-user KFP).

    Raises:
        InputError: ``KF_PIPELINES_SA_TOKEN_PATH`` names a file that does not exist.
    """
    env = dict(os.environ) if env is None else env
    if token:
        return Auth(source="--token", token=token)
    if path := env.get(TOKEN_PATH_ENV):
        if not Path(path).is_file():
            raise InputError("E_AUTH", f"token file {path} does not exist", TOKEN_PATH_ENV)
        return Auth(source=TOKEN_PATH_ENV, path=path)
    if Path(IN_CLUSTER_TOKEN_PATH).is_file():
        return Auth(source="in-cluster service account", path=IN_CLUSTER_TOKEN_PATH)
    return Auth(source="none")


def token_safe_over(host: str) -> bool:
    """Whether a bearer token may go to ``host``: over https, or plain http to this machine."""
    parts = urlsplit(host)
    if parts.scheme == "https":
        return True
    name = (parts.hostname or "").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def redact_url(url: str) -> str:
    """``url`` without a ``user:password@`` part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()
