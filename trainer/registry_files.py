"""A registered model's files downloaded within a size bound: the champion evaluate compares with.

MLflow's own download reads whatever its server sends: a version whose folder holds a file of
tens of GiB (or a server, or a proxy in front of it, that keeps sending) fills the step's disk
or memory, and KFP shows exit 137 and no line. Here the folder's listing is summed before any
byte is fetched, a file's ``Content-Length`` is checked before its body, and the bytes are
counted while they stream (a listing or a header can lie): past ``max_bytes`` the download
stops, its partial files are removed, and the step ends in one ``E_MODEL`` line naming the
limit and the setting that raises it.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.base.errors import InputError

if TYPE_CHECKING:
    from mlflow.store.artifact.artifact_repo import ArtifactRepository

__all__ = ["MAX_CHAMPION_BYTES", "MAX_FILES", "SizeLimit", "download_bounded"]

MAX_CHAMPION_BYTES = 1 << 30
"""The default bound on the champion's files (1 GiB): evaluate scores tabular models, whose
weights take megabytes; a larger folder is refused before it is fetched."""
MAX_FILES = 10_000
"""A model folder holds a handful of files; a listing of more is refused (it is no model)."""
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class SizeLimit:
    """A bound on bytes, with the setting that raises it (named in the refusal)."""

    max_bytes: int
    """The most bytes the download may write."""
    setting: str
    """How a person raises it, e.g. ``pipeline parameter max_champion_bytes``."""
    name: str = "max_champion_bytes"
    """The limit's name."""


def _refuse(what: str, size: int, limit: SizeLimit, source: str, *, so_far: bool = False) -> None:
    verb = "reached" if so_far else "take"
    raise InputError(
        "E_MODEL",
        f"{what} {verb} {size} bytes, over {limit.name} {limit.max_bytes}: check that the "
        f"registry holds the model you meant, or raise the limit ({limit.setting}={size})",
        source,
    )


def _listing(repo: ArtifactRepository, source: str) -> list[tuple[str, int | None]]:
    """Every file under the repository's root (path relative to it, listed size), depth first."""
    files: list[tuple[str, int | None]] = []
    pending: list[str | None] = [None]
    while pending:
        folder = pending.pop()
        for info in repo.list_artifacts(folder):
            if info.is_dir:
                pending.append(info.path)
            else:
                files.append((info.path, info.file_size))
            if len(files) + len(pending) > MAX_FILES:
                raise InputError(
                    "E_MODEL",
                    f"the model's folder lists more than {MAX_FILES} files: it is not a model "
                    "folder a train step wrote",
                    source,
                )
    return files


def _local_path(dst: str, rel: str, source: str) -> str:
    """Where ``rel`` lands under ``dst``; a listed path that leaves ``dst`` is refused."""
    path = os.path.realpath(os.path.join(dst, *posixpath.normpath(rel).split("/")))
    root = os.path.realpath(dst)
    if posixpath.isabs(rel) or os.path.commonpath([path, root]) != root or path == root:
        raise InputError("E_MODEL", f"the model's folder lists a path outside it: {rel!r}", source)
    return path


def _http_file(
    repo: ArtifactRepository, rel: str, local: str, done: int, limit: SizeLimit, source: str
) -> int:
    """Stream one file of a tracking server's artifact proxy into ``local``, ``done`` bytes
    already written; the bytes this file added. Its ``Content-Length`` is checked before its
    body and its bytes while they come: past the limit, refused."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import augmented_raise_for_status, http_request

    creds = get_default_host_creds(repo.artifact_uri)
    resp = http_request(creds, posixpath.join("/", rel), "GET", stream=True)
    with resp:
        augmented_raise_for_status(resp)
        declared = resp.headers.get("Content-Length", "").strip()
        if declared.isdigit() and done + int(declared) > limit.max_bytes:
            _refuse(f"the model's files (with {rel!r})", done + int(declared), limit, source)
        written = 0
        with open(local, "wb") as f:
            for chunk in resp.iter_content(chunk_size=_CHUNK):
                written += len(chunk)
                if done + written > limit.max_bytes:
                    what = f"the model's files (at {rel!r})"
                    _refuse(what, done + written, limit, source, so_far=True)
                f.write(chunk)
    return written


def _is_http(repo: ArtifactRepository) -> bool:
    from mlflow.store.artifact.http_artifact_repo import HttpArtifactRepository

    return isinstance(repo, HttpArtifactRepository)


def download_bounded(source: str, dst: str, tracking_uri: str, limit: SizeLimit) -> str:
    """Download the model folder at ``source`` into ``dst/<its last segment>``, within ``limit``.

    The listing's sizes are summed first; a tracking server's files (``mlflow-artifacts:``,
    ``http(s)://``) are streamed with their ``Content-Length`` checked and their bytes counted;
    another store's files (a local folder, ``s3://``) are fetched one at a time, the total
    checked after each.

    Args:
        source: The version's artifact URI (``mlflow-artifacts:/.../model``, ``file:///...``).
        dst: An existing local folder.
        tracking_uri: The tracking URI that resolves ``mlflow-artifacts:`` URIs.
        limit: The bound and the setting that raises it.

    Returns:
        The local model folder.

    Raises:
        InputError: ``E_MODEL`` past the limit (nothing of the download is left), or for a
            listing that is not a model folder.
        MlflowException, OSError: The store failed (the caller names it).
    """
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(source, tracking_uri=tracking_uri)
    repo = getattr(repo, "repo", repo)  # runs:/ and models:/ wrap the store's repository
    files = _listing(repo, source)
    listed = sum(size or 0 for _, size in files)
    if listed > limit.max_bytes:
        _refuse("the model's files", listed, limit, source)
    name = posixpath.basename(source.rstrip("/")) or "model"
    out = _local_path(dst, name, source)
    os.makedirs(out, exist_ok=True)
    total = 0
    try:
        for rel, _ in files:
            local = _local_path(out, rel, source)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            if _is_http(repo):
                total += _http_file(repo, rel, local, total, limit, source)
            else:
                fetched = repo.download_artifacts(rel, out)
                total += os.path.getsize(fetched)
            if total > limit.max_bytes:
                _refuse(f"the model's files (at {rel!r})", total, limit, source, so_far=True)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out
