"""Credentials out of every text a person or a log sees: one function, applied at the choke points.

A URI may carry secrets: userinfo (``http://user:pass@host``, ``s3://key:secret@bucket``) and
query parameters (``?X-Amz-Signature=...``, ``?token=...``). :func:`redact` rewrites them to
``***`` wherever they occur in a text, keeping the scheme, host and path, so a message still
names the location a person must look at. The error line, the JSON log lines, the report, the
registry and storage messages and the launchers' output all pass through it, and
:func:`install` makes log records and uncaught tracebacks of the running process do the same.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from types import TracebackType
from typing import Any

__all__ = ["MASK", "has_userinfo", "install", "redact", "redact_uri", "secret_name"]

MASK = "***"
"""What a secret is replaced with."""

# Schemes whose userinfo is itself a credential (an access key id, or a bare key): masked whole.
_KEY_SCHEMES = frozenset(
    {"s3", "s3a", "s3n", "gs", "gcs", "minio", "az", "abfs", "abfss", "wasb", "wasbs", "oss"}
)
# Query or ``name=value`` parameters that hold secrets (compared lower-case, ``-`` as ``_``).
_SECRET_PARAMS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "secret",
        "secret_key",
        "secretkey",
        "secret_access_key",
        "aws_secret_access_key",
        "minio_secret_key",
        "access_key",
        "accesskey",
        "access_key_id",
        "aws_access_key_id",
        "minio_access_key",
        "awsaccesskeyid",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth_token",
        "session_token",
        "security_token",
        "aws_session_token",
        "mlflow_tracking_password",
        "mlflow_tracking_token",
        "api_key",
        "apikey",
        "client_secret",
        "x_amz_signature",
        "x_amz_credential",
        "x_amz_security_token",
        "x_goog_signature",
        "x_goog_credential",
        "signature",
        "credential",
        "credentials",
    }
)
# Too generic to mask outside a query string (``key=`` is Google's API key there).
_QUERY_ONLY_PARAMS = frozenset({"key", "sig", "sv_sig", "code"})
# Words that make a name (an environment variable's, a config key's) a secret's name.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "credential",
        "credentials",
        "privatekey",
    }
)
_SECRET_PAIRS = ("api_key", "access_key", "secret_key", "private_key", "auth_key", "signing_key")

_STOP = r"\s'\"<>`"  # characters that end a URI inside a message, a repr or HTML
_URI = re.compile(rf"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>[^{_STOP}]*)")
_PARAM = re.compile(
    rf"(?P<pre>^|[?&;\s,(\[{{'\"])(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)=(?P<value>[^&#{_STOP},;)\]}}]+)"
)
# A secret's value under a quoted key, as JSON and Python's repr write it: ``"password": "x"``.
_QUOTED = re.compile(
    r"""(?P<pre>(?P<q>["'])(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P=q)\s*:\s*)"""
    r"""(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s,\]}]+)"""
)
_AUTH = re.compile(
    r"(?i)(?P<pre>\bauthorization\W{1,4}(?:(?:basic|bearer|token)\s+)?|\bbearer\s+)"
    r"(?P<token>[A-Za-z0-9._~+/=\-]{8,})"
)


def _split_userinfo(rest: str) -> tuple[str | None, str]:
    """Split what follows ``scheme://`` into (userinfo or None, the remainder from the host on).

    The userinfo ends at the last ``@`` of the authority (a raw ``@`` in a password is common);
    a password with a ``/`` (AWS secret keys have them) ends at the first ``@`` after it, unless
    what follows the ``:`` is a port (``host:8080/path/a@b`` has no userinfo).
    """
    end = len(rest)
    for stop in "/?#":
        i = rest.find(stop)
        if i != -1:
            end = min(end, i)
    authority = rest[:end]
    if "@" in authority:
        userinfo, _, _ = authority.rpartition("@")
        return userinfo, rest[len(userinfo) + 1 :]
    _, colon, after = authority.partition(":")
    if colon and after and not after.isdigit() and "@" in rest[end:]:
        userinfo = rest[: rest.index("@", end)]
        return userinfo, rest[len(userinfo) + 1 :]
    return None, rest


def _uri(m: re.Match[str]) -> str:
    scheme = m.group("scheme")
    userinfo, rest = _split_userinfo(m.group("rest"))
    # What follows may hold another URI (``?redirect=http://u:p@h``, ``a,s3://k:s@b``).
    tail = _URI.sub(_uri, rest)
    if userinfo is None:
        return f"{scheme}://{tail}"
    user, colon, _ = userinfo.partition(":")
    if not colon or scheme.lower() in _KEY_SCHEMES:
        # A bare ``token@host`` is a credential; so is an object store's access key id.
        masked = f"{MASK}:{MASK}" if colon else MASK
    else:
        masked = f"{user}:{MASK}"
    return f"{scheme}://{masked}@{tail}"


def _quoted(m: re.Match[str]) -> str:
    key = m.group("name").lower().replace("-", "_")
    if key in _SECRET_PARAMS or key.rsplit(".", 1)[-1] in _SECRET_PARAMS:
        q = m.group("q")
        return f"{m.group('pre')}{q}{MASK}{q}"
    return m.group(0)


def secret_name(name: str) -> bool:
    """Whether ``name`` (an environment variable, a config key) names a secret by the usual
    conventions: ``AWS_SECRET_ACCESS_KEY``, ``HF_TOKEN``, ``WANDB_API_KEY``, ``DB_PASSWORD``
    (``TOKENIZERS_PARALLELISM`` does not: whole words count)."""
    key = name.lower().replace("-", "_")
    words = [w for w in re.split(r"[^a-z0-9]+", key) if w]
    joined = "_".join(words)
    return (
        key in _SECRET_PARAMS
        or any(w in _SECRET_WORDS for w in words)
        or any(f"_{pair}_" in f"_{joined}_" for pair in _SECRET_PAIRS)
    )


def _param(m: re.Match[str]) -> str:
    name = m.group("name")
    key = name.lower().replace("-", "_")
    in_query = m.group("pre") in ("?", "&", ";")
    if key in _SECRET_PARAMS or (in_query and key in _QUERY_ONLY_PARAMS):
        return f"{m.group('pre')}{name}={MASK}"
    return m.group(0)


def redact(text: str) -> str:
    """``text`` with every credential it carries replaced by ``***``.

    Userinfo of URIs (``http://user:pass@host`` -> ``http://user:***@host``; a bare
    ``token@host``, and both parts for object stores such as ``s3://key:secret@bucket``, ->
    ``***``), secret parameters (``?X-Amz-Signature=``, ``token=``, ``password=``,
    ``AWS_SECRET_ACCESS_KEY=`` ...), the values of such keys in JSON and Python's repr
    (``{"password": "x"}``) and ``Authorization``/``Bearer`` tokens. Hosts, buckets
    and paths stay, so the text still says where to look.

    Args:
        text: Any message, log line or document.

    Returns:
        The text without secrets (unchanged when it holds none).
    """
    if not text:
        return text
    text = _URI.sub(_uri, text)
    text = _PARAM.sub(_param, text)
    text = _QUOTED.sub(_quoted, text)
    return _AUTH.sub(lambda m: f"{m.group('pre')}{MASK}", text)


def redact_uri(uri: str | None) -> str | None:
    """One URI as it may be shown: :func:`redact` of it (``None`` stays ``None``)."""
    return None if uri is None else redact(uri)


def has_userinfo(uri: str) -> bool:
    """Whether ``uri`` carries userinfo (``scheme://user:pass@host``, ``s3://key@bucket``).

    Reads it the way :func:`redact` does, so what is refused is exactly what would be masked.
    """
    m = _URI.match(uri.strip())
    return m is not None and _split_userinfo(m.group("rest"))[0] is not None


# --- The process-wide hooks -------------------------------------------------------------------

_installed = False


def _record_factory(base: Any) -> Any:
    """Wrap logging's record factory so that every record's final text is redacted."""

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = base(*args, **kwargs)
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return record  # a broken format: logging reports it itself at emit time
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))
        return record

    factory.__gpupipe_redacting__ = True  # type: ignore[attr-defined]
    return factory


def _excepthook(base: Any) -> Any:
    """Wrap ``sys.excepthook``: an uncaught exception's traceback is printed redacted."""

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt | SystemExit):
            base(kind, value, tb)
            return
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(redact(text))
        sys.stderr.flush()

    hook.__gpupipe_redacting__ = True  # type: ignore[attr-defined]
    return hook


def install() -> None:
    """Redact this process's log records and uncaught tracebacks from now on (idempotent).

    Entry points call it (``trainer.entry.run_guarded`` does): what MLflow, pyarrow or boto put
    in a log line or an exception message (a tracking URI with a password, a presigned URL)
    then reaches stderr without the secret.
    """
    global _installed
    if _installed:
        return
    current = logging.getLogRecordFactory()
    if not getattr(current, "__gpupipe_redacting__", False):
        logging.setLogRecordFactory(_record_factory(current))
    if not getattr(sys.excepthook, "__gpupipe_redacting__", False):
        sys.excepthook = _excepthook(sys.excepthook)
    _installed = True
