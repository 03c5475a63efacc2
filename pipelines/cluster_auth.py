"""Who ``gpupipe`` is to a KFP cluster: the bearer token as KFP users have it (flag, token file,
in-cluster account), the one reading of ``--host``, and where that token may be sent."""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from trainer.base.errors import InputError
from trainer.base.redact import redact

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


def resolve_auth(
    token: str | None,
    env: dict[str, str] | None = None,
    *,
    token_file: str | None = None,
    stdin: TextIO | None = None,
) -> Auth:
    """Pick the credentials as KFP users have them, first match wins.

    ``--token``, then ``--token-file`` (a file re-read on every request, or ``-``: one line
    read from standard input now, which no ``ps`` shows), then the file named by
    ``KF_PIPELINES_SA_TOKEN_PATH``, then the in-cluster token KFP mounts into pipeline pods,
    else no token (a port-forward to a single-user KFP).

    Raises:
        InputError: ``E_PARAM`` for both ``--token`` and ``--token-file``; ``E_AUTH`` for a
            token file that does not exist or holds no token.
    """
    env = dict(os.environ) if env is None else env
    if token and token_file:
        raise InputError("E_PARAM", "pass one of --token and --token-file", "--token-file")
    if token:
        return Auth(source="--token", token=token)
    if token_file == "-":
        read = (stdin or sys.stdin).readline().strip()
        if not read:
            raise InputError("E_AUTH", "no token on standard input", "--token-file -")
        return Auth(source="--token-file -", token=read)
    if token_file:
        path = Path(token_file).expanduser()
        try:
            if not path.read_text().strip():
                raise InputError("E_AUTH", "the token file is empty", f"--token-file {path}")
        except OSError as e:
            reason = e.strerror or type(e).__name__
            raise InputError(
                "E_AUTH", f"cannot read the token file: {reason}", f"--token-file {path}"
            ) from None
        return Auth(source="--token-file", path=str(path))
    if path := env.get(TOKEN_PATH_ENV):
        if not Path(path).is_file():
            raise InputError("E_AUTH", f"token file {path} does not exist", TOKEN_PATH_ENV)
        return Auth(source=TOKEN_PATH_ENV, path=path)
    if Path(IN_CLUSTER_TOKEN_PATH).is_file():
        return Auth(source="in-cluster service account", path=IN_CLUSTER_TOKEN_PATH)
    return Auth(source="none")


_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
"""A host as ``--host`` may name it: a DNS name, an IPv4 address or a bracketed IPv6 one."""


def _odd_parts(host: str) -> list[str]:
    """What ``host`` holds that a base URL must not: each is read differently by different URL
    parsers (``http://evil.example\\@localhost`` is localhost to ``urlsplit`` and evil.example to
    urllib3), or carries a credential."""
    found = []
    if any(c.isspace() for c in host):
        found.append("whitespace")
    if any(not c.isprintable() and not c.isspace() for c in host):
        found.append("a control character")
    for char, what in (
        ("\\", "a backslash"),
        ("@", "user info ('@')"),
        ("?", "a query ('?')"),
        ("#", "a fragment ('#')"),
    ):
        if char in host:
            found.append(what)
    return found


def base_url(host: str) -> str:
    """The base URL of the KFP API for ``--host``, read once, by the parser the transport uses.

    The client sends every request (and the bearer token) to ``base + path`` through urllib3, so
    the host is read with urllib3's own parser and the URL rebuilt from its parts: what the
    token check (:func:`token_safe_over`) and the links see is then where requests go.
    Anything two parsers could read differently is refused rather than cleaned up.

    Raises:
        InputError: ``E_HOST`` for a scheme other than http(s); ``E_PARAM`` (naming ``--host``)
            for user info, a backslash, whitespace, a control character, a query, a fragment,
            or a host or port that is not one.
    """
    shown = redact(host)
    if not host.startswith(("http://", "https://")):
        raise InputError(
            "E_HOST", f"host must start with http:// or https://, got {shown!r}", "--host"
        )
    if odd := _odd_parts(host):
        raise InputError(
            "E_PARAM",
            f"--host must be http(s)://host[:port][/path] and nothing else, but it holds "
            f"{', '.join(odd)}: {shown!r}",
            "--host",
        )
    try:
        url = parse_url(host)
    except LocationParseError:
        url = None
    if url is None or not url.host or not _HOST_NAME.fullmatch(url.host):
        raise InputError(
            "E_PARAM", f"--host must be http(s)://host[:port][/path], got {shown!r}", "--host"
        )
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host.lower()}{port}{(url.path or '').rstrip('/')}"


def token_safe_over(host: str) -> bool:
    """Whether a bearer token may go to ``host`` (a :func:`base_url`): over https, or plain
    http to this machine."""
    parts = parse_url(host)
    if parts.scheme == "https":
        return True
    name = (parts.host or "").lower().strip("[]")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
