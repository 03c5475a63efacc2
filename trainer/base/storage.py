"""One API over local paths, s3://, gs:// and minio:// URIs, built on pyarrow filesystems."""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from trainer.base.errors import InputError
from trainer.base.redact import has_userinfo, redact

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_REMOTE_SCHEMES = ("s3", "gs", "minio")
# KFP 2.17 serves minio:// at SeaweedFS's Service (its driver's default; no `minio-service`).
_DEFAULT_MINIO_ENDPOINT = "seaweedfs.kubeflow:9000"
# Spool remote writes in memory up to this size, then on local disk, until the upload on success.
_SPOOL_MAX_BYTES = 64 * 1024 * 1024
# Attempts of each S3 request (the AWS SDK's standard retry: jittered, growing backoff), a refused
# connection included: in a pod 6, which span about 10 to 20 s (measured), where the SDK's
# default 3 span under 2 s. A pod's first connections can be refused for a few seconds while a
# NetworkPolicy agent (kube-router, measured on the test cluster) adds the new pod's address to
# what it admits; a store that stays unreachable fails after that span, naming it. Outside a pod
# (the CLI reading a run's outputs, a local run) nothing delays a first connection: the default
# 3 says "unreachable" in about 2 s, not 20.
S3_REQUEST_ATTEMPTS_IN_POD = 6
S3_REQUEST_ATTEMPTS = 3


def s3_request_attempts() -> int:
    """:data:`S3_REQUEST_ATTEMPTS_IN_POD` in a Kubernetes pod (``KUBERNETES_SERVICE_HOST``, which
    the kubelet sets in every container), else :data:`S3_REQUEST_ATTEMPTS`."""
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    return S3_REQUEST_ATTEMPTS_IN_POD if in_pod else S3_REQUEST_ATTEMPTS


# Where each object store takes its credentials from, for the refusal of credentials in a URI.
_CREDENTIALS_FROM = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the pod's role)",
    "minio": "MINIO_ACCESS_KEY and MINIO_SECRET_KEY (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (or the pod's workload identity)",
}


def _scheme(uri: str) -> str:
    """The lower-case scheme of ``uri``; ``""`` for a plain local path."""
    match = _SCHEME_RE.match(uri)
    return match.group(1).lower() if match else ""


def _split_endpoint(value: str, default_scheme: str) -> tuple[str, str]:
    """Split ``http://host:port`` (or bare ``host:port``) into (scheme, host:port)."""
    parts = urlsplit(value if "://" in value else f"{default_scheme}://{value}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"S3 endpoint must look like http(s)://host:port, got {value!r}")
    return parts.scheme, parts.netloc


def _env(*names: str) -> str | None:
    """The first non-empty value among the environment variables ``names``."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


@functools.lru_cache(maxsize=32)
def _s3_filesystem(
    scheme: str | None,
    endpoint: str | None,
    access_key: str | None,
    secret_key: str | None,
    session_token: str | None,
    region: str | None,
) -> pafs.S3FileSystem:
    """An S3 filesystem, cached per (scheme, endpoint, credentials, region).

    Credentials left unset fall to the AWS SDK's own chain (web identity on EKS, instance role).
    """
    keys = access_key and secret_key
    return pafs.S3FileSystem(
        access_key=access_key if keys else None,
        secret_key=secret_key if keys else None,
        session_token=session_token if keys else None,
        region=region,
        scheme=scheme,
        endpoint_override=endpoint,
        force_virtual_addressing=False,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=s3_request_attempts()),
    )


@functools.lru_cache(maxsize=4)
def _gcs_filesystem(anonymous: bool) -> pafs.GcsFileSystem:
    """A GCS filesystem, cached per anonymity."""
    return pafs.GcsFileSystem(anonymous=anonymous)


def _s3_from_env(minio: bool) -> pafs.S3FileSystem:
    """The S3 filesystem that the environment describes, for s3:// or (``minio``) minio:// URIs."""
    access = _env("AWS_ACCESS_KEY_ID")
    secret = _env("AWS_SECRET_ACCESS_KEY")
    token = _env("AWS_SESSION_TOKEN")
    region = _env("AWS_REGION", "AWS_DEFAULT_REGION")
    if minio:
        # KFP's artifact store: in-cluster MinIO over plain http, path-style, single region.
        scheme, endpoint = _split_endpoint(
            _env("MINIO_ENDPOINT") or _DEFAULT_MINIO_ENDPOINT, default_scheme="http"
        )
        access = _env("MINIO_ACCESS_KEY") or access
        secret = _env("MINIO_SECRET_KEY") or secret
        return _s3_filesystem(scheme, endpoint, access, secret, token, region or "us-east-1")
    raw = _env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "S3_ENDPOINT")
    if raw is None:
        return _s3_filesystem(None, None, access, secret, token, region)
    scheme, endpoint = _split_endpoint(raw, default_scheme="https")
    return _s3_filesystem(scheme, endpoint, access, secret, token, region)


def _local_os_path(uri: str) -> str:
    """The absolute OS path of a local ``uri`` (plain path or ``file://``)."""
    if _scheme(uri) == "file":
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URI must name a local path (no host), got {redact(uri)!r}")
        return os.path.abspath(parts.path)
    return os.path.abspath(uri)


def _checked_scheme(uri: str) -> str:
    """The scheme of ``uri`` (``""`` for a plain path), or ValueError if it is unsupported."""
    if not uri:
        raise ValueError("storage URI must not be empty")
    scheme = _scheme(uri)
    if scheme not in ("", "file", *_REMOTE_SCHEMES):
        raise ValueError(
            f"unsupported URI scheme {scheme!r} in {redact(uri)!r}: "
            "expected a local path, file://, s3://, gs:// or minio://"
        )
    return scheme


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """Find the filesystem that holds ``uri`` and the path of ``uri`` inside it.

    Args:
        uri: A local path (absolute, relative or ``file://``), ``s3://bucket/key``,
            ``gs://bucket/key`` or ``minio://bucket/key``.

    Returns:
        The filesystem (cached per scheme, endpoint and credentials) and the path inside it:
        an absolute OS path for local URIs, ``bucket/key`` for object stores.

    Raises:
        ValueError: If ``uri`` is empty, has an unsupported scheme, or names no bucket.
    """
    scheme = _checked_scheme(uri)
    if scheme in ("", "file"):
        return pafs.LocalFileSystem(), _local_os_path(uri)
    if has_userinfo(uri):
        # Never sent anywhere: a key in a URI ends up in logs, KFP's run parameters and lineage.
        raise InputError(
            "E_URI",
            f"credentials inside a {scheme}:// URI are not accepted; remove them from the URI "
            f"and set {_CREDENTIALS_FROM[scheme]} in the environment",
            redact(uri),
        )
    rest = uri[len(scheme) + 3 :]
    path = rest.strip("/")
    if not path or rest.startswith("/") or path.split("/", 1)[0] in (".", ".."):
        raise ValueError(f"URI must name a bucket ({scheme}://bucket/key), got {uri!r}")
    if any(part in (".", "..") for part in path.split("/")[1:]):
        # An object store takes ".." literally (a key named "a/../b") while every local tool
        # and a person reading it resolve it: the same URI would name two different things.
        raise InputError(
            "E_URI",
            "an object key must not hold '.' or '..' segments; write the key without them",
            redact(uri),
        )
    if scheme == "gs":
        return _gcs_filesystem(os.environ.get("GPUPIPE_GCS_ANONYMOUS") == "1"), path
    return _s3_from_env(minio=scheme == "minio"), path


def local_path(uri: str) -> str | None:
    """The absolute OS path of a local ``uri``, or None for an object-store URI.

    Raises:
        ValueError: If ``uri`` has an unsupported scheme.
    """
    if _checked_scheme(uri) in ("", "file"):
        return _local_os_path(uri)
    return None


def join(uri: str, *parts: str) -> str:
    """Join path parts onto ``uri``, keeping its scheme.

    Parts are always relative: leading and trailing slashes are stripped, so
    ``join("s3://b/x", "/y")`` is ``s3://b/x/y`` (unlike ``os.path.join``).

    Args:
        uri: The base URI.
        *parts: Path components to append.

    Returns:
        The joined URI, e.g. ``join("s3://b/x", "y") == "s3://b/x/y"``.
    """
    tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
    if not tail:
        return uri
    if _scheme(uri):
        return f"{uri.rstrip('/')}/{tail}"
    return os.path.join(uri, tail)


def _is_remote(uri: str) -> bool:
    return _scheme(uri) not in ("", "file")


def _parent(uri: str) -> str:
    """The URI of the directory that holds ``uri``."""
    if _is_remote(uri):
        return uri.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(_local_os_path(uri))


class StoreUnreachable(RuntimeError):
    """The object store did not answer (no connection, no name, a timeout) after the SDK's
    retries: a fault of the path to the store, not of the request, which a later attempt may
    not meet (a lost node took the cluster's DNS or the store's pod with it)."""


_UNREACHABLE_MARKS = (
    "NETWORK_CONNECTION",
    "curlCode: 6,",
    "curlCode: 7,",
    "curlCode: 28,",
    "Could not resolve host",
    "Couldn't connect to server",
    "Connection refused",
    "Connection reset",
    "Timeout was reached",
)
"""How the AWS SDK (pyarrow's S3 filesystem) says the store did not answer: its error kind, and
curl's codes for no name (6), no connection (7) and a timeout (28)."""


@contextmanager
def _translate(action: str, uri: str, *others: str) -> Iterator[None]:
    """Re-raise filesystem errors as ``<action>: <reason>``; ``action`` names the URIs.

    A missing file becomes FileNotFoundError (saying when the bucket of ``uri`` itself is
    missing); any other OSError involving an object store becomes RuntimeError
    (:class:`StoreUnreachable` when the store did not answer at all). Other local
    OSErrors pass through unchanged: their message already names the path.
    """
    try:
        yield
    except FileNotFoundError as e:
        raise FileNotFoundError(redact(f"{action}: {_missing_reason(uri)}")) from e
    except OSError as e:
        if any(_is_remote(u) for u in (uri, *others)):
            kind = (
                StoreUnreachable if any(m in str(e) for m in _UNREACHABLE_MARKS) else RuntimeError
            )
            raise kind(redact(f"{action}: {e}")) from e
        raise


def _missing_reason(uri: str) -> str:
    """Why ``uri`` was not found: its bucket is missing, or just the object/file."""
    if _is_remote(uri):
        fs, path = resolve(uri)
        bucket = path.split("/", 1)[0]
        try:
            missing_bucket = fs.get_file_info(bucket).type == pafs.FileType.NotFound
        except OSError:
            missing_bucket = False  # cannot tell; the plain reason is still true
        if missing_bucket:
            return f"bucket {bucket!r} does not exist"
    return "no such file or directory"


def _info(uri: str) -> pafs.FileInfo:
    fs, path = resolve(uri)
    with _translate(f"inspecting {uri}", uri):
        return fs.get_file_info(path)


def exists(uri: str) -> bool:
    """Whether a file or directory exists at ``uri`` (on object stores: a key or a prefix).

    Raises:
        RuntimeError: If the object store cannot be reached or refuses the request.
    """
    return _info(uri).type != pafs.FileType.NotFound


def is_dir(uri: str) -> bool:
    """Whether ``uri`` is a directory (on object stores: a non-empty prefix or a bucket).

    Raises:
        RuntimeError: If the object store cannot be reached or refuses the request.
    """
    return _info(uri).type == pafs.FileType.Directory


def list_dir(uri: str) -> list[str]:
    """The sorted base names of the children of directory ``uri``; ``[]`` if it is missing.

    Raises:
        NotADirectoryError: If ``uri`` is a file.
        RuntimeError: If the object store cannot be reached or refuses the request.
    """
    fs, path = resolve(uri)
    kind = _info(uri).type
    if kind == pafs.FileType.NotFound:
        return []
    if kind != pafs.FileType.Directory:
        raise NotADirectoryError(f"cannot list {uri}: it is a file, not a directory")
    with _translate(f"listing {uri}", uri):
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    return sorted(info.base_name for info in infos)


def list_files(uri: str) -> list[str]:
    """Every file under directory ``uri``, as sorted paths relative to it; ``[]`` if missing.

    Raises:
        RuntimeError: If the object store cannot be reached or refuses the request.
    """
    fs, path = resolve(uri)
    if _info(uri).type != pafs.FileType.Directory:
        return []
    with _translate(f"listing {uri}", uri):
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    base = path.rstrip("/") + "/"
    return sorted(i.path[len(base) :] for i in infos if i.type == pafs.FileType.File)


def fsync_dir(uri: str) -> None:
    """Flush a local directory's entries (new or renamed children) to disk; no-op elsewhere."""
    path = local_path(uri)
    if path is None:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs(uri: str) -> None:
    """Create directory ``uri`` and its parents; no-op on object stores (prefixes are implicit)."""
    path = local_path(uri)
    if path is not None:
        os.makedirs(path, exist_ok=True)


@contextmanager
def open_input(uri: str) -> Iterator[pa.NativeFile]:
    """Open ``uri`` for reading as a seekable binary stream (suits pyarrow.parquet).

    Raises:
        FileNotFoundError: If ``uri`` (or its bucket) does not exist.
        RuntimeError: If the object store fails.
    """
    with _opened(uri, "open_input_file") as stream:
        yield stream


@contextmanager
def open_input_stream(uri: str) -> Iterator[pa.NativeFile]:
    """Open ``uri`` for reading front to back, decompressed by its name (``.gz``, ``.bz2``,
    ``.zst``) as it is read: a compressed file is never held whole.

    Raises:
        FileNotFoundError: If ``uri`` (or its bucket) does not exist.
        RuntimeError: If the object store fails.
    """
    with _opened(uri, "open_input_stream") as stream:
        yield stream


@contextmanager
def _opened(uri: str, opener: str) -> Iterator[pa.NativeFile]:
    """``uri`` opened by its filesystem's ``opener`` method, its errors translated, closed after."""
    fs, path = resolve(uri)
    with _translate(f"opening {uri}", uri):
        stream = getattr(fs, opener)(path)
    with stream:
        yield stream


@contextmanager
def open_output(uri: str) -> Iterator[IO[bytes]]:
    """Open ``uri`` for writing; the file appears, whole, only if the block exits normally.

    Local files are written under a temporary sibling name, fsynced and renamed over ``uri``
    (missing parent directories are created). Object-store writes are spooled locally and
    uploaded on success, because closing a pyarrow S3 stream always completes the upload,
    even when the block failed: a spool is the only way not to publish a partial object.

    Raises:
        RuntimeError: If the object store fails (e.g. the bucket does not exist).
    """
    path = local_path(uri)
    if path is not None:
        with _open_local_output(path) as f:
            yield f
        return
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MAX_BYTES) as spool:
        yield spool
        spool.seek(0)
        fs, key = resolve(uri)
        with _translate(f"writing {uri}", uri), fs.open_output_stream(key) as out:
            shutil.copyfileobj(spool, out, length=8 * 1024 * 1024)


@contextmanager
def _open_local_output(path: str) -> Iterator[IO[bytes]]:
    """Body of open_output for a local path: write a temp sibling, fsync, rename."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Includes GeneratorExit and KeyboardInterrupt: never leave the temp file behind.
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def read_bytes(uri: str, limit: int | None = None) -> bytes:
    """The whole content of file ``uri`` (decompressed where its name says so), or, with
    ``limit``, at most ``limit + 1`` bytes of it: a caller that gets more than ``limit`` knows
    the file is larger, without holding it all.

    Raises:
        FileNotFoundError: If ``uri`` (or its bucket) does not exist.
        RuntimeError: If the object store fails.
    """
    fs, path = resolve(uri)
    with _translate(f"reading {uri}", uri), fs.open_input_stream(path) as f:
        return f.read() if limit is None else f.read(limit + 1)


def write_bytes(uri: str, data: bytes) -> None:
    """Write ``data`` to ``uri`` atomically: readers see the old content or the new, never a part.

    Local: a temporary sibling, fsynced, then renamed over ``uri`` (parents are created).
    Object stores: one upload, which becomes visible only when complete.

    Raises:
        RuntimeError: If the object store fails (e.g. the bucket does not exist).
    """
    path = local_path(uri)
    if path is not None:
        with open_output(uri) as f:
            f.write(data)
        return
    fs, key = resolve(uri)
    with _translate(f"writing {uri}", uri), fs.open_output_stream(key) as out:
        out.write(data)


def read_text(uri: str) -> str:
    """The content of ``uri`` decoded as UTF-8."""
    return read_bytes(uri).decode("utf-8")


def write_text(uri: str, text: str) -> None:
    """Write ``text`` to ``uri`` as UTF-8, atomically (see write_bytes)."""
    write_bytes(uri, text.encode("utf-8"))


def read_json(uri: str) -> Any:
    """The JSON document at ``uri``.

    Raises:
        ValueError: If ``uri`` does not hold valid JSON (the message names the URI).
    """
    text = read_text(uri)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON in {uri}: {e}") from e


def write_json(uri: str, obj: Any) -> None:
    """Write ``obj`` as JSON (indent 2, sorted keys, trailing newline), atomically.

    The object is serialised before anything is written, so an unserialisable value leaves
    ``uri`` untouched.
    """
    write_text(uri, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def delete(uri: str) -> None:
    """Delete the file or directory tree at ``uri``; a missing ``uri`` is fine.

    Raises:
        ValueError: If ``uri`` is a bucket root (buckets are never deleted here).
        RuntimeError: If the object store fails.
    """
    fs, path = resolve(uri)
    if _is_remote(uri) and "/" not in path:
        raise ValueError(f"refusing to delete a whole bucket: {uri}")
    kind = _info(uri).type
    if kind == pafs.FileType.NotFound:
        return
    with _translate(f"deleting {uri}", uri):
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        else:
            fs.delete_file(path)


def copy_tree(src: str, dst: str) -> None:
    """Copy the file or directory tree ``src`` to ``dst``, across any two filesystems.

    Files already under ``dst`` are overwritten where names clash and kept otherwise (a merge).

    Raises:
        FileNotFoundError: If ``src`` does not exist.
        RuntimeError: If an object store fails.
    """
    src_fs, src_path = resolve(src)
    dst_fs, dst_path = resolve(dst)
    if not exists(src):
        raise FileNotFoundError(f"copying {src} to {dst}: {_missing_reason(src)}")
    if not is_dir(src):
        makedirs(_parent(dst))
    else:
        # An object store lists files only, no folders, and pyarrow creates at the destination
        # only the folders it is shown: make every file's folder first (seen on a real KFP: the
        # train step's copy of the job's model into a local output path failed without this).
        with _translate(f"listing {src}", src):
            infos = src_fs.get_file_info(pafs.FileSelector(src_path, recursive=True))
        folders = {""} | {
            posixpath.dirname(posixpath.relpath(i.path, src_path))
            for i in infos
            if i.type == pafs.FileType.File
        }
        for rel in sorted(folders):
            makedirs(join(dst, rel) if rel and rel != "." else dst)
    with _translate(f"copying {src} to {dst}", src, dst):
        pafs.copy_files(src_path, dst_path, source_filesystem=src_fs, destination_filesystem=dst_fs)


def rename(src: str, dst: str) -> None:
    """Move the file or directory ``src`` to ``dst``.

    Both local: ``os.replace`` (atomic; an existing file ``dst`` is replaced, an empty directory
    ``dst`` too). Otherwise: copy, then delete ``src``, which is not atomic: a reader may see
    ``dst`` half-filled, so publish directories through ``trainer.base.outputs.atomic_dir`` (readers
    look for ``dst`` only after the writer returns) or through a marker file written last.

    Raises:
        FileNotFoundError: If ``src`` does not exist.
        FileExistsError: If ``dst`` is a non-empty directory.
        RuntimeError: If an object store fails.
    """
    if not exists(src):
        raise FileNotFoundError(f"renaming {src} to {dst}: {_missing_reason(src)}")
    if is_dir(dst) and list_dir(dst):
        raise FileExistsError(f"renaming {src} to {dst}: target is a non-empty directory")
    src_local, dst_local = local_path(src), local_path(dst)
    if src_local is not None and dst_local is not None:
        os.makedirs(os.path.dirname(dst_local), exist_ok=True)
        os.replace(src_local, dst_local)
        fsync_dir(os.path.dirname(dst_local))
        return
    copy_tree(src, dst)
    delete(src)
