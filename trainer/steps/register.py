"""The register step: put a trained model into an MLflow model registry, once per pipeline run."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from trainer import registry
from trainer.base import storage
from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.models.layout import META_FILE, WEIGHTS_FILE
from trainer.steps.evaluate import HIGHER_IS_BETTER
from trainer.steps.train import COST_FILE, cost_metrics

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

__all__ = ["RegisterConfig", "RegisterResult", "flatten_params", "register"]

# MLflow's limits (mlflow.utils.validation): longer keys are refused, longer values truncated
# with a warning; truncating here keeps the warning out of the step's log.
_MAX_KEY_LENGTH = 250
_MAX_PARAM_VALUE_LENGTH = 6000
_MAX_PARAMS_PER_BATCH = 100
# Model-version tags may hold 100k characters on current servers but only 5000 on MLflow 2.x:
# the JSON copy of the params on the version is skipped when larger (the run keeps them all).
_MAX_VERSION_TAG_LENGTH = 5000
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")

LEASE_S = 60.0
"""How long a champion lease on a tracking server lasts: a holder that died (its pod killed)
keeps other runs waiting at most this long."""
LEASE_WAIT_S = 120.0
"""How long a register step waits for another run's champion lease before it fails."""
_LEASE_OWNER_TAG = "gpupipe.lease_owner"
_LEASE_EXPIRES_TAG = "gpupipe.lease_expires"


@dataclass(kw_only=True, slots=True)
class RegisterConfig:
    """Which registry, which model name, which alias marks the champion."""

    model_name: str = "gpupipe-model"
    """Registered model name: no ``/``, ``:``, quotes or backslashes, at most 256 characters."""
    tracking_uri: str | None = None
    """MLflow tracking URI (``http://mlflow.kubeflow:5000`` on a cluster). ``None``: the
    ``MLFLOW_TRACKING_URI`` environment variable if set, else the embedded SQLite store
    ``sqlite:///$GPUPIPE_HOME/mlflow/mlflow.db`` (``GPUPIPE_HOME`` defaults to ``~/.gpupipe``)
    with artifacts in ``artifacts/`` next to the database."""
    experiment: str = "gpupipe"
    """MLflow experiment that holds the registration runs (created if absent)."""
    champion_alias: str = "champion"
    """Alias moved to the new version when the gate passed: letters, digits, ``_``, ``-``;
    not ``latest`` and not ``v<n>``."""
    gate_metric: str = ""
    """The metric the evaluate step's gate compared (``accuracy``, ``rmse`` ...). With it, the
    alias moves only if the champion is still the one evaluate beat, or if the candidate beats
    the version that became champion meanwhile (a concurrent run); empty: move it anyway."""
    evaluated_champion: str = ""
    """The champion version evaluate compared against (empty: there was none)."""

    def __post_init__(self) -> None:
        registry.validate_model_name(self.model_name, "register.model_name")
        if self.tracking_uri is not None and not self.tracking_uri.strip():
            raise InputError(
                "E_CONFIG",
                f"register.tracking_uri must be a URI or null, got {self.tracking_uri!r}",
                "register.tracking_uri",
            )
        if not self.experiment.strip():
            raise InputError(
                "E_CONFIG",
                f"register.experiment must not be empty, got {self.experiment!r}",
                "register.experiment",
            )
        registry.validate_alias(self.champion_alias, "register.champion_alias")
        if self.gate_metric and self.gate_metric not in HIGHER_IS_BETTER:
            raise InputError(
                "E_CONFIG",
                f"register.gate_metric must be one of {sorted(HIGHER_IS_BETTER)}, "
                f"got {self.gate_metric!r}",
                "register.gate_metric",
            )


def register_config(
    *,
    registered_model_name: str,
    registry_uri: str,
    evaluated_metric: str = "",
    evaluated_champion: str = "",
) -> RegisterConfig:
    """The register step's config for pipeline parameters (same names, defaulted once, in the
    pipeline's signature): the one mapping the component and the pipeline's parameter check
    share. ``registry_uri`` empty: the default registry.

    Args:
        registered_model_name: name of the model in the registry.
        registry_uri: MLflow tracking URI.
        evaluated_metric: the metric evaluate's gate compared (from its report).
        evaluated_champion: the champion version evaluate compared against (from its report).

    Raises:
        InputError: a bad value, naming the field (``register.model_name`` ...).
    """
    return from_dict(
        RegisterConfig,
        {
            "model_name": registered_model_name,
            "tracking_uri": registry_uri or None,
            "gate_metric": evaluated_metric,
            "evaluated_champion": evaluated_champion,
        },
    )


@dataclass(kw_only=True, slots=True)
class RegisterResult:
    """What register did."""

    model_name: str
    """Registered model name."""
    version: str
    """Model version number, as a string."""
    created: bool
    """False when the pipeline run had already registered this version (a re-run)."""
    champion: bool
    """Whether the version holds the champion alias after this call."""
    champion_reason: str
    """Why the alias moved or stayed, in one sentence."""
    model_uri: str
    """``models:/<name>/<version>``, loadable by MLflow's artifact API."""
    run_id: str
    """The MLflow run holding the artifacts, params and metrics."""

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-serialisable dict."""
        return asdict(self)


def _clean_key(key: str) -> str:
    """A key MLflow accepts: unsupported characters become ``_``, cut to MLflow's limit."""
    return _BAD_KEY_CHARS.sub("_", key)[:_MAX_KEY_LENGTH]


def _param_text(value: Any) -> str:
    """A param value as MLflow stores it (a string), JSON for anything but strings."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:_MAX_PARAM_VALUE_LENGTH]


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested params to ``{"optim.lr": "0.001"}`` within MLflow's key and value limits.

    Nested mappings become dotted keys; lists, numbers, booleans and None become JSON text;
    characters MLflow refuses in keys become ``_``; values longer than 6000 characters are cut.
    """
    out: dict[str, str] = {}
    for key, value in params.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, f"{full}."))
        else:
            out[_clean_key(full)] = _param_text(value)
    return out


def _checked_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Metrics as floats under clean keys; a non-number is bad input naming its key."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(
                "E_CONFIG", f"metric {key!r} must be a number, got {value!r}", f"metrics.{key}"
            )
        out[_clean_key(str(key))] = float(value)
    return out


def _cost_tags(local_dir: str) -> dict[str, str]:
    """``gpupipe.cost_usd``, ``gpupipe.gpu_hours``, ``gpupipe.estimated_cost_usd`` ... from the
    train step's ``cost.json`` (none when it is absent: a model trained before costs were
    recorded)."""
    path = os.path.join(local_dir, COST_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    return {f"gpupipe.{k}": f"{v:.6g}" for k, v in cost_metrics(record).items()}


@contextlib.contextmanager
def _staged_model(model_uri: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield a local copy of the gpupipe model directory and its ``model.json``.

    Local directories are used in place; object-store URIs are copied to a temporary folder
    that is removed afterwards (MLflow uploads from local files only).

    Raises:
        InputError: If the directory is missing or is not a gpupipe model directory.
    """
    if not storage.exists(model_uri) or not storage.is_dir(model_uri):
        raise InputError("E_MODEL", "model directory not found", model_uri)
    with contextlib.ExitStack() as stack:
        local = storage.local_path(model_uri)
        if local is None:
            local = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpupipe-register-"))
            storage.copy_tree(model_uri, local)
        for name in (META_FILE, WEIGHTS_FILE):
            if not storage.exists(storage.join(local, name)):
                raise InputError(
                    "E_MODEL", f"not a gpupipe model directory: {name} is missing", model_uri
                )
        try:
            meta = json.loads(storage.read_bytes(storage.join(local, META_FILE)))
        except ValueError as e:
            raise InputError("E_MODEL", f"{META_FILE} is not valid JSON ({e})", model_uri) from e
        if not isinstance(meta, dict):
            raise InputError("E_MODEL", f"{META_FILE} must hold a JSON object", model_uri)
        yield local, meta


def _ensure_experiment(client: MlflowClient, name: str, tracking_uri: str) -> str:
    """The id of experiment ``name``, created (with a fixed artifact folder) if absent."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    try:
        return str(
            client.create_experiment(
                name, artifact_location=registry.artifact_location_for(tracking_uri)
            )
        )
    except MlflowException as e:
        # Another register created it between our look-up and create: use theirs.
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    """Create registered model ``name`` unless it exists (racing creators are fine)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="Registered by the gpupipe register step.")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def _log_run(
    client: MlflowClient,
    run_id: str,
    *,
    params: dict[str, str],
    metrics: dict[str, float],
    model_dir: str,
) -> None:
    """Log params (in MLflow-sized batches), metrics and the model directory to the run."""
    from mlflow.entities import Metric, Param

    now_ms = int(time.time() * 1000)
    items = sorted(params.items())
    for start in range(0, len(items), _MAX_PARAMS_PER_BATCH):
        chunk = items[start : start + _MAX_PARAMS_PER_BATCH]
        client.log_batch(run_id, params=[Param(k, v) for k, v in chunk])
    if metrics:
        client.log_batch(run_id, metrics=[Metric(k, v, now_ms, 0) for k, v in metrics.items()])
    client.log_artifacts(run_id, model_dir, artifact_path=registry.MODEL_ARTIFACT_PATH)


def _discard_artifacts(artifact_uri: str) -> None:
    """Delete every artifact under a failed registration's run (any artifact store MLflow
    knows: a local folder, S3, a tracking server's proxied store)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    try:
        get_artifact_repository(artifact_uri).delete_artifacts()
    except Exception as e:  # best effort, on the way out of a failure
        log.warning("could not delete the partial artifacts at %s: %s", artifact_uri, e)


def _json_or_none(values: Mapping[str, Any]) -> str | None:
    """Compact JSON of ``values`` if it fits a model-version tag, else None."""
    safe = {
        k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
        for k, v in values.items()
    }
    text = json.dumps(safe, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= _MAX_VERSION_TAG_LENGTH else None


def _model_files_present(client: MlflowClient, run_id: str) -> bool:
    """Whether run ``run_id`` holds a loadable model directory (weights and ``model.json``)."""
    if not run_id:
        return False
    listed = client.list_artifacts(run_id, registry.MODEL_ARTIFACT_PATH)
    return {META_FILE, WEIGHTS_FILE} <= {f.path.rsplit("/", 1)[-1] for f in listed}


def _lease_name(cfg: RegisterConfig) -> str:
    return f"{cfg.model_name}.{cfg.champion_alias}.gpupipe-lease"[:256]


def _lease_pause() -> None:
    """The pause between two tries at the champion lease (jittered, so racers spread out)."""
    time.sleep(0.05 + random.random() * 0.1)


@contextlib.contextmanager
def _champion_lease(
    client: MlflowClient, cfg: RegisterConfig, uri: str, owner: str
) -> Iterator[None]:
    """Hold the right to decide ``cfg.champion_alias`` of ``cfg.model_name`` exclusively.

    A SQLite store: a file lock. A tracking server has no lock and no compare-and-set on an
    alias, but registered model names are unique in its database: creating the registered model
    ``<model>.<alias>.gpupipe-lease`` succeeds for exactly one caller, which holds the lease
    until it deletes it. A lease whose holder died expires after :data:`LEASE_S`; a retry of
    the same pipeline run (``owner``) takes over its own earlier lease at once.

    Raises:
        RuntimeError: Another run held the lease for more than :data:`LEASE_WAIT_S`.
        MlflowException: The registry failed (callers wrap it with ``mlflow_errors``).
    """
    if registry.sqlite_path(uri) is not None:
        with registry.store_lock(uri):
            yield
        return
    from mlflow.exceptions import MlflowException

    lease = _lease_name(cfg)
    deadline = time.monotonic() + LEASE_WAIT_S
    while True:
        expires = f"{time.time() + LEASE_S:.3f}"
        try:
            client.create_registered_model(
                lease,
                tags={_LEASE_OWNER_TAG: owner, _LEASE_EXPIRES_TAG: expires},
                description="gpupipe: a register step is deciding the champion",
            )
            break
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                # Taken and released during our create: MLflow's create reads a taken name back
                # (its prompt check) and finds it gone. Free now: create it again, after the
                # pause of any other try (a registry that always answers so is not hammered).
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"registered model {lease!r} (the champion lease): every create for "
                        f"{LEASE_WAIT_S:.0f} s was answered RESOURCE_DOES_NOT_EXIST ({e.message})"
                    ) from e
                _lease_pause()
                continue
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        try:
            held = registry.registered_model_or_none(client, lease)
            if held is None:
                continue  # released while we looked: try to create it again
            tags = held.tags or {}
            if tags.get(_LEASE_OWNER_TAG) == owner:
                # Our own earlier attempt (a retried step): only we use this owner, take it.
                client.set_registered_model_tag(lease, _LEASE_EXPIRES_TAG, expires)
                break
            # A lease read before its tags landed counts from its creation, never as expired.
            created = (held.creation_timestamp or 0) / 1000
            until = float(tags.get(_LEASE_EXPIRES_TAG) or created + LEASE_S)
            if until < time.time():
                # Its holder died: remove it (if it is still that lease) and race for a new one
                # through the atomic create above.
                again = registry.registered_model_or_none(client, lease)
                if again is not None and again.creation_timestamp == held.creation_timestamp:
                    client.delete_registered_model(lease)
                continue
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                continue  # released while we looked: try to create it again
            raise
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"registered model {lease!r} (the champion lease) was held by "
                f"{tags.get(_LEASE_OWNER_TAG)!r} for more than {LEASE_WAIT_S:.0f} s"
            )
        _lease_pause()
    try:
        yield
    finally:
        try:
            client.delete_registered_model(lease)
        except MlflowException as e:  # the step's own outcome matters more; the lease expires
            log.warning("could not release %r (it expires in %.0f s): %s", lease, LEASE_S, e)


def _move_alias(
    client: MlflowClient,
    cfg: RegisterConfig,
    version: str,
    metrics: Mapping[str, float],
    uri: str,
    *,
    owner: str,
) -> tuple[bool, str]:
    """Point the champion alias at ``version`` if it still deserves it; return (moved, why).

    The read of the current champion, the comparison and the move happen under the champion
    lease (:func:`_champion_lease`), so of two runs registering at once the better model ends
    up champion: a version that became champion after evaluate made its decision must be
    beaten on ``cfg.gate_metric``. The alias never moves to a version whose files are missing.
    """
    with _champion_lease(client, cfg, uri, owner):
        current = registry.alias_version(client, cfg.model_name, cfg.champion_alias)
        if current == version:
            return True, f"version {version} already holds {cfg.champion_alias!r}"
        if current is not None and cfg.gate_metric and current != (cfg.evaluated_champion or None):
            metric = cfg.gate_metric
            mine = metrics.get(metric)
            theirs = _version_metric(client, cfg.model_name, current, metric)
            higher = HIGHER_IS_BETTER[metric]
            if mine is None or (
                theirs is not None and not (mine > theirs if higher else mine < theirs)
            ):
                return False, (
                    f"version {current} became champion during this run with {metric} "
                    f"{theirs}, which {mine} does not beat: the alias stays"
                )
        mv = client.get_model_version(cfg.model_name, version)
        if not _model_files_present(client, mv.run_id or ""):
            raise RuntimeError(
                f"model {cfg.model_name!r} version {version} has no model files under its run "
                f"{mv.run_id}: the alias {cfg.champion_alias!r} stays where it is"
            )
        client.set_registered_model_alias(cfg.model_name, cfg.champion_alias, version)
        return True, f"{cfg.champion_alias!r} moved to version {version}"


def _version_metric(client: MlflowClient, name: str, version: str, metric: str) -> float | None:
    """``metric`` as logged on the MLflow run of model version ``version``, if any."""
    mv = client.get_model_version(name, version)
    if not mv.run_id:
        return None
    value = client.get_run(mv.run_id).data.metrics.get(metric)
    return None if value is None else float(value)


def register(
    cfg: RegisterConfig,
    *,
    model_uri: str,
    pipeline_run_id: str,
    data_hash: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    gate_passed: bool,
) -> RegisterResult:
    """Register the model at ``model_uri`` as a new version of ``cfg.model_name``.

    The gpupipe model directory (safetensors + JSON, no pickle, no MLflow flavor) is logged as
    the artifacts of a new MLflow run in ``cfg.experiment``, together with the params, metrics
    and ``gpupipe.*`` tags; the model version is created from that artifact folder and carries
    the same tags. The champion alias moves to the version only when ``gate_passed``.

    Re-running for the same ``pipeline_run_id`` (a retried KFP task) finds the version that
    run registered and returns it with ``created=False`` instead of adding a second version;
    with ``gate_passed`` it still makes sure the alias points there.

    Args:
        cfg: Registry, model name, experiment and alias.
        model_uri: The gpupipe model directory (any storage URI).
        pipeline_run_id: The KFP run id; the idempotency key.
        data_hash: Hash of the training data, recorded as a tag.
        params: Training parameters; nested dicts are flattened to dotted keys.
        metrics: Evaluation metrics (numbers).
        gate_passed: The evaluate step's decision; only then does the champion alias move.

    Returns:
        The version, whether it was created now, and whether it is the champion.

    Raises:
        InputError: If the model directory is missing or malformed, or an argument is bad.
        RuntimeError: If MLflow fails or cannot be reached, naming the tracking URI and model.
    """
    registry.validate_pipeline_run_id(pipeline_run_id)
    checked_metrics = _checked_metrics(metrics)
    flat_params = flatten_params(params)
    uri = registry.resolve_tracking_uri(cfg.tracking_uri)
    client = registry.mlflow_client(uri)
    name = cfg.model_name

    with _staged_model(model_uri) as (local_dir, meta):
        with registry.mlflow_errors(f"searching versions of model {name!r}", uri):
            existing = registry.find_version(client, name, pipeline_run_id)
        if existing is not None:
            return _confirm_existing(
                client,
                cfg,
                existing,
                gate_passed=gate_passed,
                metrics=checked_metrics,
                uri=uri,
                local_dir=local_dir,
                pipeline_run_id=pipeline_run_id,
            )
        tags = {
            registry.TAG_PIPELINE_RUN_ID: pipeline_run_id,
            registry.TAG_DATA_HASH: data_hash,
            registry.TAG_TRAINER_VERSION: str(meta.get("trainer_version", "unknown")),
            registry.TAG_GATE_PASSED: "true" if gate_passed else "false",
            **_cost_tags(local_dir),
        }
        version_tags = dict(tags)
        for key, values in (("gpupipe.metrics", checked_metrics), ("gpupipe.params", flat_params)):
            text = _json_or_none(values)
            if text is not None:
                version_tags[key] = text

        with registry.mlflow_errors(f"creating a run in experiment {cfg.experiment!r}", uri):
            experiment_id = _ensure_experiment(client, cfg.experiment, uri)
            run = client.create_run(
                experiment_id, tags=tags, run_name=f"register-{pipeline_run_id}"[:250]
            )
        run_id = run.info.run_id
        version_requested = False
        try:
            with registry.mlflow_errors(f"logging MLflow run {run_id}", uri):
                _log_run(
                    client, run_id, params=flat_params, metrics=checked_metrics, model_dir=local_dir
                )
            with registry.mlflow_errors(f"creating a version of model {name!r}", uri):
                _ensure_registered_model(client, name)
                version_requested = True
                mv = client.create_model_version(
                    name,
                    source=f"{run.info.artifact_uri.rstrip('/')}/{registry.MODEL_ARTIFACT_PATH}",
                    run_id=run_id,
                    tags=version_tags,
                    description=f"KFP run {pipeline_run_id}, data {data_hash}",
                )
            version = str(mv.version)
            champion, why = False, "the gate did not pass"
            if gate_passed:
                with registry.mlflow_errors(
                    f"setting alias of model {name!r} version {version}", uri
                ):
                    champion, why = _move_alias(
                        client, cfg, version, checked_metrics, uri, owner=pipeline_run_id
                    )
        except BaseException:
            if version_requested and _version_may_exist(client, name, pipeline_run_id):
                # The version exists (or may: the registry did not say): its files stay, so a
                # registered version always has them, and the run stays open for the retry of
                # this step, which finds the version and finishes the job.
                log.warning(
                    "model %r has a version for run %s: its files are kept; a retry of this "
                    "step finishes the registration",
                    name,
                    pipeline_run_id,
                )
                raise
            # No version was made: nothing half-written stays. The run's partial artifacts (a
            # truncated model.safetensors after a full disk) go first, which also frees the
            # space the store needs to record the run as FAILED, so nobody mistakes it for a
            # registration. The original error is what matters: failures here are logged only.
            _discard_artifacts(run.info.artifact_uri)
            try:
                client.set_terminated(run_id, status="FAILED")
            except Exception as e:  # the original error is re-raised below
                log.warning("could not mark MLflow run %s FAILED: %s", run_id, e)
            raise
        with registry.mlflow_errors(f"finishing MLflow run {run_id}", uri):
            client.set_terminated(run_id, status="FINISHED")
    return RegisterResult(
        model_name=name,
        version=version,
        created=True,
        champion=champion,
        champion_reason=why,
        model_uri=f"models:/{name}/{version}",
        run_id=run_id,
    )


def _version_may_exist(client: MlflowClient, name: str, pipeline_run_id: str) -> bool:
    """Whether a version of ``name`` for ``pipeline_run_id`` exists; True when the registry
    cannot say (a lost answer to create_model_version may have made one)."""
    try:
        return registry.find_version(client, name, pipeline_run_id) is not None
    except Exception as e:  # on the way out of a failure: the original error is re-raised
        log.warning("could not tell whether model %r has a version now: %s", name, e)
        return True


def _confirm_existing(
    client: MlflowClient,
    cfg: RegisterConfig,
    existing: Any,
    *,
    gate_passed: bool,
    metrics: dict[str, float],
    uri: str,
    local_dir: str,
    pipeline_run_id: str,
) -> RegisterResult:
    """A retried task: the version its run registered, finished and with the alias made right.

    The version's files are checked first: an attempt cut off between the version and its
    files (or an older gpupipe that deleted them after a failure) gets them uploaded again to
    the place the version points at, and its run is marked FINISHED.
    """
    name = cfg.model_name
    version = str(existing.version)
    run_id = existing.run_id or ""
    with registry.mlflow_errors(f"checking the files of model {name!r} version {version}", uri):
        if run_id and not _model_files_present(client, run_id):
            log.warning("model %r version %s lacks its files: uploading them again", name, version)
            client.log_artifacts(run_id, local_dir, artifact_path=registry.MODEL_ARTIFACT_PATH)
        if run_id and client.get_run(run_id).info.status != "FINISHED":
            client.set_terminated(run_id, status="FINISHED")
    champion, why = False, "the gate did not pass"
    with registry.mlflow_errors(f"setting alias of model {name!r} version {version}", uri):
        if gate_passed:
            champion, why = _move_alias(client, cfg, version, metrics, uri, owner=pipeline_run_id)
        else:
            champion = registry.alias_version(client, name, cfg.champion_alias) == version
    return RegisterResult(
        model_name=name,
        version=version,
        created=False,
        champion=champion,
        champion_reason=why,
        model_uri=f"models:/{name}/{version}",
        run_id=run_id,
    )
