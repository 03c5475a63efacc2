"""MLflow registry helpers shared by evaluate and register: where the store is, the champion."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.base.errors import InputError

# MLflow's telemetry off unless the user turned it on: a step is no place to phone home, and in
# a cluster with no way out its config fetch fails and a background thread pops
# _MLFLOW_TELEMETRY_SESSION_ID from os.environ while the step's own request reads the proxy
# settings from it: the register step of a real KFP run failed on that KeyError (2026-12-02,
# "runs/create failed with exception '_MLFLOW_TELEMETRY_SESSION_ID'"). MLflow reads this at
# import, and every import of it in the suite comes after this module's.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
from trainer.base.redact import redact
from trainer.registry_files import MAX_CHAMPION_BYTES, SizeLimit, download_bounded

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

__all__ = [
    "DEFAULT_STORE_DIRNAME",
    "MODEL_ARTIFACT_PATH",
    "TAG_DATA_HASH",
    "TAG_GATE_PASSED",
    "TAG_PIPELINE_RUN_ID",
    "TAG_TRAINER_VERSION",
    "Champion",
    "alias_version",
    "artifact_location_for",
    "check_sqlite_store",
    "default_store_dir",
    "find_version",
    "find_version_by_pipeline_run",
    "get_champion",
    "in_kubernetes_pod",
    "mlflow_client",
    "mlflow_errors",
    "named_tracking_uri",
    "prepare_store",
    "registered_model_or_none",
    "resolve_tracking_uri",
    "sqlite_path",
    "store_lock",
    "validate_alias",
    "validate_model_name",
    "validate_pipeline_run_id",
]

TAG_PIPELINE_RUN_ID = "gpupipe.pipeline_run_id"
"""Tag on the MLflow run and the model version: the KFP run that produced the model."""
TAG_DATA_HASH = "gpupipe.data_hash"
"""Tag: hash of the training data the model saw."""
TAG_TRAINER_VERSION = "gpupipe.trainer_version"
"""Tag: the trainer version recorded in the model's ``model.json``."""
TAG_GATE_PASSED = "gpupipe.gate_passed"
"""Tag: ``true``/``false``, the evaluate step's promotion decision."""
MODEL_ARTIFACT_PATH = "model"
"""Run artifact folder holding the gpupipe model directory; model versions point at it."""
DEFAULT_STORE_DIRNAME = "mlflow"
"""Folder under ``$GPUPIPE_HOME`` (default ``~/.gpupipe``) that holds the embedded store."""

_MAX_MODEL_NAME_LENGTH = 256  # the registry's name column (VARCHAR(256))
_MAX_ALIAS_LENGTH = 255
_ALIAS_RE = re.compile(r"^[\w\-]+$")
_VERSION_ALIAS_RE = re.compile(r"^[vV]\d+$")  # MLflow reserves v1, v2, ... for versions
_ERROR_TEXT_MAX = 300


@dataclass(frozen=True, slots=True)
class Champion:
    """The model version that holds the champion alias, downloaded for comparison."""

    version: str
    """Model version number, as a string (``"3"``)."""
    local_model_dir: str
    """Local gpupipe model directory (``model.json``, ``model.safetensors``, ``metrics.json``)."""
    metrics: dict[str, float]
    """Metrics logged on the version's MLflow run (what register was given)."""
    run_id: str
    """The MLflow run that holds the version's artifacts."""


def default_store_dir() -> Path:
    """The embedded store's folder: ``$GPUPIPE_HOME/mlflow``, else ``~/.gpupipe/mlflow``."""
    home = os.environ.get("GPUPIPE_HOME") or os.path.join(os.path.expanduser("~"), ".gpupipe")
    return Path(home).absolute() / DEFAULT_STORE_DIRNAME


def in_kubernetes_pod() -> bool:
    """Whether this process runs in a Kubernetes pod (the kubelet sets KUBERNETES_SERVICE_HOST
    in every container it starts)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST", "").strip())


def named_tracking_uri(tracking_uri: str | None) -> str | None:
    """The tracking URI this process was told of: ``tracking_uri``, else ``MLFLOW_TRACKING_URI``
    from the environment; None when neither names one.

    Raises:
        InputError: In a Kubernetes pod with neither: the embedded store there would be a file
            in the step's container, gone when the pod ends, so a run would "register" a model
            nobody can ever find (and every evaluate would find no champion). One line naming
            ``registry_uri``, before any work.
    """
    if tracking_uri and tracking_uri.strip():
        return tracking_uri.strip()
    from_env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if from_env:
        return from_env
    if in_kubernetes_pod():
        raise InputError(
            "E_PARAM",
            "registry_uri is empty and this step runs in a Kubernetes pod, where the embedded "
            "registry would die with the pod: set registry_uri to the cluster's MLflow (e.g. "
            "http://mlflow.kubeflow:5000; `gpupipe upload --set registry_uri=...` makes it the "
            "default) or MLFLOW_TRACKING_URI in the step's environment",
            "registry_uri",
        )
    return None


def resolve_tracking_uri(tracking_uri: str | None) -> str:
    """The MLflow tracking URI to use.

    In order: ``tracking_uri`` when given; else the ``MLFLOW_TRACKING_URI`` environment variable
    (how a cluster points every step at its tracking server); else, outside a Kubernetes pod,
    the embedded store ``sqlite:///<default_store_dir()>/mlflow.db``, whose folder is created
    here. In a pod with neither, a refusal (:func:`named_tracking_uri`).

    Args:
        tracking_uri: An explicit URI (``http://mlflow.kubeflow:5000``, ``sqlite:///...``), or None.

    Returns:
        The URI, never empty.

    Raises:
        InputError: In a pod with no tracking URI named.
    """
    named = named_tracking_uri(tracking_uri)
    if named:
        return named
    store = default_store_dir()
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def artifact_location_for(tracking_uri: str) -> str | None:
    """Where a new experiment should keep its artifacts, for stores that need telling.

    A SQLite store keeps artifacts in ``artifacts/`` next to its database file; left to
    MLflow they would land in ``./mlruns`` under whatever the working directory happens to be.
    A tracking server decides for itself (``--artifacts-destination``): None.
    """
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    # sqlite:///rel.db is relative to the working directory, sqlite:////abs.db absolute; urlsplit
    # would turn the latter into "//abs.db", which a URI then reads as a host name.
    db_path = tracking_uri[len(prefix) :].split("?", 1)[0]
    if not db_path or db_path == ":memory:":
        return None
    return str(Path(os.path.abspath(db_path)).parent / "artifacts")


def validate_model_name(name: str, where: str = "model_name") -> None:
    """Reject names the MLflow registry refuses, or that would break a search filter.

    Raises:
        InputError: Naming ``where`` and the value.
    """
    problem = None
    if not name or not name.strip():
        problem = "must not be empty"
    elif len(name) > _MAX_MODEL_NAME_LENGTH:
        problem = f"must be at most {_MAX_MODEL_NAME_LENGTH} characters"
    elif any(c in name for c in "/:'`\\"):
        problem = "must not contain '/', ':', quotes, backticks or backslashes"
    elif name != name.strip() or name in (".", "..") or name.startswith(".."):
        problem = "must not start with '..', be '.', or have surrounding spaces"
    if problem:
        raise InputError("E_CONFIG", f"{where} {problem}, got {name!r}", where)


def validate_alias(alias: str, where: str = "champion_alias") -> None:
    """Reject aliases the MLflow registry refuses (characters, ``latest``, ``v<n>``).

    Raises:
        InputError: Naming ``where`` and the value.
    """
    problem = None
    if not alias or not _ALIAS_RE.match(alias):
        problem = "must be non-empty and contain only letters, digits, '_' and '-'"
    elif len(alias) > _MAX_ALIAS_LENGTH:
        problem = f"must be at most {_MAX_ALIAS_LENGTH} characters"
    elif alias.lower() == "latest" or _VERSION_ALIAS_RE.match(alias):
        problem = "must not be 'latest' or look like a version ('v3'): MLflow reserves those"
    if problem:
        raise InputError("E_CONFIG", f"{where} {problem}, got {alias!r}", where)


def _one_line(exc: BaseException) -> str:
    """The exception's text on one line, credentials redacted, cut to a readable length.

    Redacting comes first: a cut through ``user:pass@`` would leave half a password unmasked.
    """
    text = redact(" ".join(str(exc).split())) or type(exc).__name__
    return text if len(text) <= _ERROR_TEXT_MAX else text[: _ERROR_TEXT_MAX - 3] + "..."


@contextlib.contextmanager
def mlflow_errors(action: str, tracking_uri: str) -> Iterator[None]:
    """Turn MLflow and network failures into a one-line RuntimeError naming the tracking URI.

    The URI and MLflow's text are redacted: a ``user:password@`` in the URI stays out.
    """
    from mlflow.exceptions import MlflowException

    try:
        yield
    except (MlflowException, OSError) as e:
        raise RuntimeError(
            f"MLflow at {redact(tracking_uri)}: {action} failed: {_one_line(e)}{_account_hint(e)}"
        ) from e


ACCOUNT_HINT = (
    " (the server asks for an account: set MLFLOW_TRACKING_USERNAME and "
    "MLFLOW_TRACKING_PASSWORD; on KFP, the secret the pipeline parameter registry_secret names)"
)


def _account_hint(exc: BaseException) -> str:
    """What to do when the server refused the request's account (HTTP 401 or 403)."""
    text = str(exc)
    refused = re.search(r"\berror code (401|403)\b|\b(401|403) (Unauthorized|Forbidden)\b", text)
    return ACCOUNT_HINT if refused else ""


def _error_code(exc: BaseException) -> str | None:
    """MLflow's error code (``RESOURCE_DOES_NOT_EXIST``...) of ``exc``, if it carries one."""
    return getattr(exc, "error_code", None)


def sqlite_path(tracking_uri: str) -> str | None:
    """The database file of a ``sqlite:///`` URI, or None (another store, or in memory)."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    path = tracking_uri[len(prefix) :].split("?", 1)[0]
    return None if not path or path == ":memory:" else os.path.abspath(path)


_MLFLOW_TABLES = frozenset({"alembic_version", "experiments", "runs", "registered_models"})


def check_sqlite_store(tracking_uri: str) -> None:
    """Refuse a SQLite file that is not an MLflow database: MLflow would add its tables to it.

    A missing file is fine (MLflow creates it); its folder must exist or be creatable.

    Raises:
        InputError: ``E_REGISTRY`` naming the file.
    """
    import sqlite3

    path = sqlite_path(tracking_uri)
    if path is None or not os.path.exists(path):
        return
    if not os.path.isfile(path):
        raise InputError("E_REGISTRY", "the registry database path is not a file", path)
    if os.path.getsize(path) == 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise InputError(
            "E_REGISTRY", f"the registry file is not a SQLite database ({e})", path
        ) from None
    if not names >= _MLFLOW_TABLES:
        raise InputError(
            "E_REGISTRY",
            "the registry file is a database that MLflow did not create; gpupipe never adds "
            "tables to or migrates another database: name a new file in registry_uri",
            path,
        )


_PREPARED: set[str] = set()


def prepare_store(tracking_uri: str) -> None:
    """Check a SQLite store and create its tables once, under a file lock.

    Two runs that open a fresh database at the same moment would both run MLflow's schema
    creation and one of them would fail; with the lock the second finds the tables made.
    Other stores need nothing here.

    A file that is not an MLflow database is refused before the lock file is made beside it,
    unless that lock file is there already: then the file may be a store another process is
    creating under the lock right now (some of MLflow's tables made, not all), and only the
    check under the lock decides.

    Raises:
        InputError: If the file is not an MLflow database (see :func:`check_sqlite_store`).
        RuntimeError: If MLflow cannot create or open the store.
    """
    path = sqlite_path(tracking_uri)
    if path is None or tracking_uri in _PREPARED:
        return
    try:
        check_sqlite_store(tracking_uri)
    except InputError:
        if not os.path.exists(f"{path}.lock"):
            raise
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            check_sqlite_store(tracking_uri)
            from mlflow.store.model_registry.sqlalchemy_store import (
                SqlAlchemyStore as RegistryStore,
            )
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            with mlflow_errors("creating the registry database", tracking_uri):
                artifacts = artifact_location_for(tracking_uri) or os.path.dirname(path)
                SqlAlchemyStore(tracking_uri, artifacts).engine.dispose()
                RegistryStore(tracking_uri).engine.dispose()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _PREPARED.add(tracking_uri)


@contextlib.contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """Hold an exclusive lock for a read-decide-write on a SQLite store (no-op for servers).

    The champion decision (read the alias, compare, move it) runs under it, so two register
    steps on one machine cannot both move the alias on stale information.
    """
    path = sqlite_path(tracking_uri)
    if path is None:
        yield
        return
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


HTTP_TIMEOUT_S = 10
"""Seconds one MLflow HTTP request may take (``MLFLOW_HTTP_REQUEST_TIMEOUT`` overrides)."""
HTTP_MAX_RETRIES = 2
"""MLflow's retries of a failed request (``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` overrides): MLflow's
own default of 7 with exponential backoff keeps a step waiting for minutes on a dead server."""


def mlflow_client(tracking_uri: str) -> MlflowClient:
    """An MLflow client whose tracking and registry stores are both ``tracking_uri``.

    A client of its own (rather than ``mlflow.set_tracking_uri``) leaves the process-wide
    MLflow state alone, so two steps in one process cannot point each other elsewhere.
    """
    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_MAX_RETRIES))
    prepare_store(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _search_filter(model_name: str, pipeline_run_id: str) -> str:
    """The search filter for versions of ``model_name`` tagged with ``pipeline_run_id``.

    Names and ids carry no quotes (validated), so plain single quoting is safe. The backticks
    let the tag key contain dots; checked against the SQLite store and the REST server.
    """
    return f"name = '{model_name}' and tags.`{TAG_PIPELINE_RUN_ID}` = '{pipeline_run_id}'"


def validate_pipeline_run_id(pipeline_run_id: str, where: str = "pipeline_run_id") -> None:
    """Reject an empty id, or one whose quotes would break the registry search filter.

    Raises:
        InputError: Naming ``where`` and the value.
    """
    if (
        not pipeline_run_id
        or not pipeline_run_id.strip()
        or any(c in pipeline_run_id for c in "'`\\")
    ):
        raise InputError(
            "E_CONFIG",
            f"{where} must be non-empty without quotes or backslashes, got {pipeline_run_id!r}",
            where,
        )


def find_version(
    client: MlflowClient, model_name: str, pipeline_run_id: str
) -> ModelVersion | None:
    """The newest version of ``model_name`` registered for ``pipeline_run_id``, or None.

    Raises:
        MlflowException: If the registry fails (callers wrap it with :func:`mlflow_errors`).
    """
    found = client.search_model_versions(filter_string=_search_filter(model_name, pipeline_run_id))
    # A SQLite store returns int versions, the REST API strings: compare as numbers.
    return max(found, key=lambda mv: int(mv.version), default=None)


def find_version_by_pipeline_run(
    tracking_uri: str | None, model_name: str, pipeline_run_id: str
) -> str | None:
    """The version of ``model_name`` that register created for ``pipeline_run_id``, if any.

    Args:
        tracking_uri: MLflow tracking URI; None resolves as in :func:`resolve_tracking_uri`.
        model_name: Registered model name.
        pipeline_run_id: The KFP run id that register tagged the version with.

    Returns:
        The version number as a string, or None (also when the model is not registered).

    Raises:
        InputError: If the name or id is malformed.
        RuntimeError: If the registry cannot be reached or fails, naming the tracking URI.
    """
    validate_model_name(model_name)
    validate_pipeline_run_id(pipeline_run_id)
    uri = resolve_tracking_uri(tracking_uri)
    client = mlflow_client(uri)
    with mlflow_errors(f"searching versions of model {model_name!r}", uri):
        mv = find_version(client, model_name, pipeline_run_id)
    return None if mv is None else str(mv.version)


def registered_model_or_none(client: MlflowClient, name: str) -> Any:
    """Registered model ``name``, or None where it does not exist.

    MLflow's basic-auth app answers a model that does not exist with 403, not 404, when its
    ``default_permission`` is ``NO_PERMISSIONS`` (manifests/mlflow's, for the pipeline's
    account): it asks for the permission before the model, finds none and falls back to the
    default. A 403 for a model that a search (filtered to what the caller may read) does not
    list is taken as "no such model" too: one the caller may not read is then out of its reach
    as if absent, and creating it or a version of it fails with the server's 403.

    Raises:
        MlflowException: For any other registry failure.
    """
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as e:
        code = _error_code(e)
        if code == "RESOURCE_DOES_NOT_EXIST":
            return None
        if code == "PERMISSION_DENIED" and not client.search_registered_models(
            filter_string=f"name = '{name}'", max_results=1
        ):
            return None
        raise


def alias_version(client: MlflowClient, model_name: str, alias: str) -> str | None:
    """The version that ``alias`` points at, or None if the model or the alias does not exist.

    Raises:
        MlflowException: For any other registry failure.
    """
    model = registered_model_or_none(client, model_name)
    if model is None:
        return None
    version: Any = (model.aliases or {}).get(alias)
    return None if version is None else str(version)


def get_champion(
    tracking_uri: str | None,
    model_name: str,
    alias: str = "champion",
    *,
    dst_dir: str | None = None,
    limit: SizeLimit | None = None,
) -> Champion | None:
    """Find the version that holds ``alias`` and download its gpupipe model directory, within
    ``limit`` (:func:`trainer.registry_files.download_bounded`).

    Args:
        tracking_uri: MLflow tracking URI; None resolves as in :func:`resolve_tracking_uri`.
        model_name: Registered model name.
        alias: The alias that marks the champion.
        dst_dir: Local folder to download into; None makes a fresh temporary folder, which the
            caller owns (and may delete).
        limit: The bound on the downloaded bytes and the setting that raises it; None:
            :data:`~trainer.registry_files.MAX_CHAMPION_BYTES`, raised by the pipeline
            parameter ``max_champion_bytes``.

    Returns:
        The champion, or None when the model is not registered or no version holds ``alias``.

    Raises:
        InputError: If the name or alias is malformed; E_MODEL when the version's files are
            larger than the limit (refused from the listing, a Content-Length, or counted while
            they stream; nothing of the download is left).
        RuntimeError: If the registry or its artifact store fails, naming the tracking URI and
            the model version.
    """
    validate_model_name(model_name)
    validate_alias(alias, "alias")
    uri = resolve_tracking_uri(tracking_uri)
    client = mlflow_client(uri)
    with mlflow_errors(f"looking up alias {alias!r} of model {model_name!r}", uri):
        version = alias_version(client, model_name, alias)
    if version is None:
        return None

    what = f"downloading model {model_name!r} version {version}"
    with mlflow_errors(what, uri):
        mv = client.get_model_version(model_name, version)
        dst = dst_dir or tempfile.mkdtemp(prefix="gpupipe-champion-")
        os.makedirs(dst, exist_ok=True)
        # The version's source is a run artifact URI (mlflow-artifacts:/..., file:///...);
        # resolving it against the tracking URI goes through the server's artifact proxy.
        bound = limit or SizeLimit(MAX_CHAMPION_BYTES, "pipeline parameter max_champion_bytes")
        local = download_bounded(mv.source or "", dst, uri, bound)
        metrics: dict[str, float] = {}
        if mv.run_id:
            metrics = {k: float(v) for k, v in client.get_run(mv.run_id).data.metrics.items()}
    return Champion(
        version=str(mv.version), local_model_dir=local, metrics=metrics, run_id=mv.run_id or ""
    )
